# a consistency group's recovery objectives (RPO, RTO, consistency, semantics).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0009_alertmanager_alerts"),
    ]

    operations = [
        migrations.AddField(
            model_name="consistencygroup",
            name="objectives",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
