"""Process groups per rank: pg, size and member ranks, once per generation."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0005_group_slo"),
        ("ingest", "0004_device_event_recovery_action"),
    ]

    operations = [
        migrations.CreateModel(
            name="ProcessGroupsRecord",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("ts", models.DateTimeField()),
                ("generation", models.PositiveIntegerField()),
                ("stale", models.BooleanField(default=False)),
                ("rank", models.PositiveIntegerField()),
                ("groups", models.JSONField(default=list)),
                (
                    "group",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="console.consistencygroup",
                    ),
                ),
                (
                    "node",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="console.node",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        fields=["group", "generation", "rank", "-ts"],
                        name="ingest_proc_group_i_60c65a_idx",
                    )
                ],
            },
        ),
    ]
