"""A node's delivery delay: the newest batch's and the newest batches' (ingest writes both)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("console", "0016_audit_hash_chain")]

    operations = [
        migrations.AddField(
            model_name="node",
            name="delivery_delay_s",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="node",
            name="delivery_delays",
            field=models.JSONField(blank=True, db_default=[], default=list),
        ),
    ]
