"""Receipts are pruned: AgentState remembers up to which seq (ingest.retention)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ingest", "0008_probe_records"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentstate",
            name="receipts_pruned_through",
            field=models.BigIntegerField(blank=True, null=True),
        ),
    ]
