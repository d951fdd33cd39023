"""Fine step rollups for the group charts: 5 s step bins per rank block, a step-time
histogram per 5 s bucket, and the mark of the range they cover (ingest.step_bins)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0005_group_slo"),
        ("ingest", "0002_partition_telemetry"),
    ]

    operations = [
        migrations.CreateModel(
            name="RollupMark",
            fields=[
                ("name", models.CharField(max_length=32, primary_key=True, serialize=False)),
                ("rolled_from", models.DateTimeField()),
                ("rolled_until", models.DateTimeField()),
            ],
        ),
        migrations.CreateModel(
            name="StepBinRollup",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("generation", models.PositiveIntegerField()),
                ("bucket", models.DateTimeField()),
                ("rank_lo", models.PositiveIntegerField()),
                ("steps", models.PositiveIntegerField()),
                ("max_ms", models.FloatField()),
                ("sum_ms", models.FloatField()),
                (
                    "group",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="console.consistencygroup",
                    ),
                ),
            ],
            options={
                "indexes": [models.Index(fields=["bucket"], name="stepbin_bucket")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("group", "generation", "bucket", "rank_lo"), name="stepbin_key"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="StepHistRollup",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("generation", models.PositiveIntegerField()),
                ("bucket", models.DateTimeField()),
                ("hist_bucket", models.IntegerField()),
                ("steps", models.PositiveIntegerField()),
                (
                    "group",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="console.consistencygroup",
                    ),
                ),
            ],
            options={
                "indexes": [models.Index(fields=["bucket"], name="stephist_bucket")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("group", "generation", "bucket", "hist_bucket"), name="stephist_key"
                    )
                ],
            },
        ),
    ]
