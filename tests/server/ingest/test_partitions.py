"""Daily partitions: created around today by the migration, rows routed by ts, DEFAULT
catches the rest and hands it over, retention drops whole days."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from console.models import Node
from ingest import partitions, retention
from ingest.models import DeviceSample, StepRecord
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

FAR_DAY = datetime(2031, 3, 14, 12, 0, tzinfo=UTC)


def _where(table: str, row_id: int) -> str:
    with connection.cursor() as cur:
        cur.execute(f"SELECT tableoid::regclass::text FROM {table} WHERE id = %s", [row_id])  # noqa: S608
        return cur.fetchone()[0]


def _sample(node: Node, ts: datetime) -> DeviceSample:
    return DeviceSample.objects.create(ts=ts, node=node, gpu="GPU-0", index=0, temp_c=50.0)


def test_it_has_todays_partition_for_every_telemetry_table_after_migrating():
    today = datetime.now(UTC).date()
    for table in partitions.PARTITIONED:
        names = {p.name for p in partitions.list_partitions(table)}
        assert partitions.partition_name(table, today) in names
        assert partitions.partition_name(table, today + timedelta(days=2)) in names
        assert partitions.default_name(table) in names


def test_it_routes_ingested_rows_to_the_partition_of_their_day(post_batch):
    batch = make_batch([{"kind": "device_sample", "gpu": "GPU-0", "index": 0}])
    assert post_batch(batch).status_code == 202
    row = DeviceSample.objects.get()
    expected = partitions.partition_name("ingest_devicesample", row.ts.astimezone(UTC).date())
    assert _where("ingest_devicesample", row.pk) == expected


def test_it_stores_a_row_without_a_day_partition_in_default():
    node = Node.objects.create(name="node-far")
    row = _sample(node, FAR_DAY)
    assert _where("ingest_devicesample", row.pk) == "ingest_devicesample_default"


def test_it_moves_default_rows_into_a_day_when_that_day_is_created():
    node = Node.objects.create(name="node-far")
    row = _sample(node, FAR_DAY)
    created = partitions.ensure_partitions(days_ahead=0, days_back=0, now=FAR_DAY)
    assert "ingest_devicesample_p20310314" in created
    assert _where("ingest_devicesample", row.pk) == "ingest_devicesample_p20310314"
    assert DeviceSample.objects.filter(pk=row.pk).exists()


def test_it_creates_partitions_idempotently():
    partitions.ensure_partitions(days_ahead=1, now=FAR_DAY)
    assert partitions.ensure_partitions(days_ahead=1, now=FAR_DAY) == []


def test_it_drops_whole_days_older_than_retention_and_keeps_newer_ones():
    node = Node.objects.create(name="node-far")
    partitions.ensure_partitions(days_ahead=0, days_back=0, now=FAR_DAY)
    old = _sample(node, FAR_DAY)
    later = FAR_DAY + timedelta(days=3)
    partitions.ensure_partitions(days_ahead=0, days_back=0, now=later)
    kept = _sample(node, later)

    removed = retention.run(now=later, keep_days=2)

    assert removed["ingest_devicesample"] >= 1
    names = {p.name for p in partitions.list_partitions("ingest_devicesample")}
    assert "ingest_devicesample_p20310314" not in names
    assert "ingest_devicesample_p20310317" in names
    assert not DeviceSample.objects.filter(pk=old.pk).exists()
    assert DeviceSample.objects.filter(pk=kept.pk).exists()


def test_it_trims_expired_rows_from_the_default_partition():
    node = Node.objects.create(name="node-old")
    stray = _sample(node, datetime(2001, 1, 1, tzinfo=UTC))
    retention.run(now=datetime.now(UTC), keep_days=14)
    assert not DeviceSample.objects.filter(pk=stray.pk).exists()


def test_it_keeps_the_orm_usable_for_reads_and_deletes_on_a_partitioned_table(post_batch):
    post_batch(
        make_batch([{"kind": "step", "group": "job", "generation": 1, "rank": 0, "step": 1}])
    )
    row = StepRecord.objects.get()
    assert StepRecord.objects.filter(pk=row.pk, ts=row.ts).count() == 1
    row.delete()
    assert StepRecord.objects.count() == 0
