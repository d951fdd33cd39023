from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0010_group_objectives"),
    ]

    operations = [
        migrations.AddField(
            model_name="incident",
            name="costs",
            field=models.JSONField(blank=True, db_default={}, default=dict),
        ),
    ]
