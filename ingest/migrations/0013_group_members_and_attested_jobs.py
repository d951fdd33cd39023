"""The jobs an agent attests run on its node, and the nodes that may place a group's ranks
(docs/security.md, "Who owns a group"). Every node that holds a rank of a group now is
one of its members, so running jobs keep their nodes."""

import django.db.models.deletion
from django.db import migrations, models

BACKFILL = """
INSERT INTO ingest_groupmember (group_id, node)
SELECT DISTINCT r.group_id, n.name FROM console_rank r JOIN console_node n ON n.id = r.node_id
ON CONFLICT DO NOTHING
"""


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0014_group_ownership"),
        ("ingest", "0012_process_message_launcher_root_cause"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentstate",
            name="jobs",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="GroupMember",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "group",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="console.consistencygroup",
                    ),
                ),
                ("node", models.CharField(max_length=128)),
                ("left_generation", models.PositiveIntegerField(blank=True, null=True)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("group", "node"), name="group_member_unique")
                ],
            },
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
