"""Partition the high-volume telemetry tables by day; add minute rollups; trim indexes.

The RunSQL first recreates DeviceSample, StepRecord, CollectiveWindow and ServingWindow as
PARTITION BY RANGE (ts) with primary key (id, ts), a DEFAULT partition and the exact indexes
0001 made, so every later operation here (and in future migrations) sees the state Django
expects. Indexes are made on the partitioned parent and so exist on every partition.
The last step creates the partitions around today, so inserts route to a day from the start.
"""

import django.contrib.postgres.indexes
import django.db.models.deletion
from django.db import migrations, models

from ingest import partitions

# The indexes 0001 created (pg_indexes of a fresh database), recreated on the parent.
INDEXES_0001 = {
    "ingest_devicesample": [
        "CREATE INDEX ingest_devicesample_node_id_802f4da9 ON ingest_devicesample (node_id)",
        "CREATE INDEX ingest_devi_gpu_5aba60_idx ON ingest_devicesample (gpu, ts DESC)",
        "CREATE INDEX ingest_devi_ts_6954d6_idx ON ingest_devicesample (ts DESC)",
    ],
    "ingest_steprecord": [
        "CREATE INDEX ingest_steprecord_group_id_26e3a136 ON ingest_steprecord (group_id)",
        "CREATE INDEX ingest_steprecord_node_id_1f1ee72c ON ingest_steprecord (node_id)",
        "CREATE INDEX ingest_step_group_i_93bc57_idx ON ingest_steprecord (group_id, ts DESC)",
        "CREATE INDEX ingest_step_group_i_443d00_idx ON ingest_steprecord (group_id, rank, ts DESC)",
    ],
    "ingest_collectivewindow": [
        "CREATE INDEX ingest_collectivewindow_group_id_b1276b47 ON ingest_collectivewindow (group_id)",
        "CREATE INDEX ingest_collectivewindow_node_id_1aa6a690 ON ingest_collectivewindow (node_id)",
        "CREATE INDEX ingest_coll_group_i_cfa255_idx ON ingest_collectivewindow (group_id, rank, ts DESC)",
    ],
    "ingest_servingwindow": [
        "CREATE INDEX ingest_servingwindow_group_id_359d3bf8 ON ingest_servingwindow (group_id)",
        "CREATE INDEX ingest_servingwindow_node_id_959f5d0d ON ingest_servingwindow (node_id)",
        "CREATE INDEX ingest_serv_group_i_32d0b6_idx ON ingest_servingwindow (group_id, ts DESC)",
    ],
}


def create_partitions(apps, schema_editor):
    partitions.ensure_partitions(days_ahead=2, conn=schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0004_audit_append_only"),
        ("ingest", "0001_initial"),
    ]

    operations = [
        migrations.RunSQL(
            sql=[
                stmt
                for table, indexes in INDEXES_0001.items()
                for stmt in partitions.to_partitioned_sql(table, indexes)
            ],
            reverse_sql=[
                stmt
                for table, indexes in INDEXES_0001.items()
                for stmt in partitions.to_plain_sql(table, indexes)
            ],
        ),
        migrations.CreateModel(
            name="DeviceRollup",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("minute", models.DateTimeField()),
                ("samples", models.PositiveIntegerField()),
                ("gpus", models.PositiveIntegerField()),
                ("max_temp_c", models.FloatField(null=True)),
                ("min_sm_clock_mhz", models.FloatField(null=True)),
                ("throttled_gpus", models.PositiveIntegerField()),
            ],
        ),
        migrations.CreateModel(
            name="StepRollup",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("minute", models.DateTimeField()),
                ("generation", models.PositiveIntegerField()),
                ("steps", models.PositiveIntegerField()),
                ("ranks", models.PositiveIntegerField()),
                ("tokens", models.BigIntegerField()),
                ("step_ms_p50", models.FloatField(null=True)),
                ("step_ms_p99", models.FloatField(null=True)),
            ],
        ),
        migrations.RemoveIndex(
            model_name="collectivewindow",
            name="ingest_coll_group_i_cfa255_idx",
        ),
        migrations.RemoveIndex(
            model_name="devicesample",
            name="ingest_devi_ts_6954d6_idx",
        ),
        migrations.RemoveIndex(
            model_name="steprecord",
            name="ingest_step_group_i_93bc57_idx",
        ),
        migrations.AlterField(
            model_name="checkpointrecord",
            name="group",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                to="console.consistencygroup",
            ),
        ),
        migrations.AlterField(
            model_name="checkpointrecord",
            name="node",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                to="console.node",
            ),
        ),
        migrations.AlterField(
            model_name="collectivewindow",
            name="group",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                to="console.consistencygroup",
            ),
        ),
        migrations.AlterField(
            model_name="collectivewindow",
            name="node",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                to="console.node",
            ),
        ),
        migrations.AlterField(
            model_name="devicesample",
            name="node",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                to="console.node",
            ),
        ),
        migrations.AlterField(
            model_name="processrecord",
            name="group",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                to="console.consistencygroup",
            ),
        ),
        migrations.AlterField(
            model_name="processrecord",
            name="node",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                to="console.node",
            ),
        ),
        migrations.AlterField(
            model_name="servingwindow",
            name="group",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                to="console.consistencygroup",
            ),
        ),
        migrations.AlterField(
            model_name="servingwindow",
            name="node",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                to="console.node",
            ),
        ),
        migrations.AlterField(
            model_name="steprecord",
            name="group",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                to="console.consistencygroup",
            ),
        ),
        migrations.AlterField(
            model_name="steprecord",
            name="node",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                to="console.node",
            ),
        ),
        migrations.AlterField(
            model_name="transitionrecord",
            name="group",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                to="console.consistencygroup",
            ),
        ),
        migrations.AlterField(
            model_name="transitionrecord",
            name="node",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                to="console.node",
            ),
        ),
        migrations.AddIndex(
            model_name="collectivewindow",
            index=models.Index(
                fields=["group", "generation", "rank", "-ts"], name="ingest_coll_group_i_088d0f_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="devicesample",
            index=django.contrib.postgres.indexes.BrinIndex(
                fields=["ts"], name="ingest_devi_ts_brin"
            ),
        ),
        migrations.AddIndex(
            model_name="steprecord",
            index=models.Index(
                fields=["group", "generation", "-ts"], name="ingest_step_group_i_14a6a5_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="steprecord",
            index=django.contrib.postgres.indexes.BrinIndex(
                fields=["ts"], name="ingest_step_ts_brin"
            ),
        ),
        migrations.AddField(
            model_name="devicerollup",
            name="node",
            field=models.ForeignKey(
                db_constraint=False, on_delete=django.db.models.deletion.CASCADE, to="console.node"
            ),
        ),
        migrations.AddField(
            model_name="steprollup",
            name="group",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                to="console.consistencygroup",
            ),
        ),
        migrations.AddConstraint(
            model_name="devicerollup",
            constraint=models.UniqueConstraint(
                fields=("node", "minute"), name="devicerollup_node_minute"
            ),
        ),
        migrations.AddConstraint(
            model_name="steprollup",
            constraint=models.UniqueConstraint(
                fields=("group", "minute"), name="steprollup_group_minute"
            ),
        ),
        # Day partitions are dropped with their parent on reverse (to_plain_sql CASCADE).
        migrations.RunPython(create_partitions, migrations.RunPython.noop),
    ]
