"""Daily partitions: created around today by the migration, rows routed by ts, DEFAULT
catches the rest and hands it over, retention drops whole days."""

from __future__ import annotations

import time
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
    # The test database was migrated when the run began: a run that crosses midnight UTC
    # finds the partitions of the day before's migration (the daily task adds the next).
    migrated_on = (today, today - timedelta(days=1))
    for table in partitions.PARTITIONED:
        names = {p.name for p in partitions.list_partitions(table)}
        assert any(
            all(partitions.partition_name(table, d + timedelta(days=k)) in names for k in range(3))
            for d in migrated_on
        ), sorted(names)
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


# -- first statistics of a new day (analyze_young) ------------------------------------------


@pytest.mark.parametrize(
    ("analyzed", "tuples", "changed", "due"),
    [
        (False, -1.0, 499, False),  # too small to plan badly
        (False, -1.0, 500, True),  # never analyzed
        (False, 900.0, 600, True),  # vacuumed (reltuples known) but never analyzed
        (True, 600.0, 599, False),  # grew less than the rows it was analyzed with
        (True, 600.0, 600, True),  # doubled since its last ANALYZE
        (True, 1_000_000.0, 90_000, False),  # a full day's small change: autovacuum's job
    ],
)
def test_it_finds_statistics_too_young_to_plan_by(analyzed, tuples, changed, due):
    assert (
        partitions.needs_analyze(
            analyzed=analyzed, tuples_at_analyze=tuples, changed=changed, min_rows=500
        )
        is due
    )


STATS_DAY = datetime(2032, 5, 1, 12, 0, tzinfo=UTC)
STATS_PART = partitions.partition_name("ingest_steprecord", STATS_DAY.date())


@pytest.fixture
def stats_day():
    """A day partition of its own, committed (statistics count committed rows only)."""
    created = partitions.ensure_partitions(days_ahead=0, days_back=0, now=STATS_DAY)
    yield
    with connection.cursor() as cur:
        for name in created:
            cur.execute(f"DROP TABLE IF EXISTS {name}")


def _steps(group, node, n: int, start: int) -> None:
    rows = [
        StepRecord(
            ts=STATS_DAY + timedelta(milliseconds=i),
            node=node,
            group=group,
            generation=1,
            rank=i % 8,
            step=i // 8,
        )
        for i in range(start, start + n)
    ]
    StepRecord.objects.bulk_create(rows)


def _stats(name: str, want: tuple[int, bool]) -> tuple[int, bool]:
    """(rows changed since the last ANALYZE, analyzed at all), polled until it reads
    `want` or 10 s passed: a backend flushes its writes' statistics at most once a second."""
    deadline = time.monotonic() + 10
    while True:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_stat_force_next_flush()")
            cur.execute("SELECT pg_stat_clear_snapshot()")
            cur.execute(
                "SELECT n_mod_since_analyze, last_analyze IS NOT NULL "
                "FROM pg_stat_user_tables WHERE relname = %s",
                [name],
            )
            got = cur.fetchone()
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


@pytest.mark.django_db(transaction=True)
def test_it_analyzes_a_new_day_before_autovacuum_would_and_again_when_it_doubles(stats_day):
    from console.models import ConsistencyGroup

    node = Node.objects.create(name="node-stats")
    group = ConsistencyGroup.objects.create(name="job-stats", generation=1)
    with connection.cursor() as cur:  # autovacuum must not do it for us meanwhile
        cur.execute(f"ALTER TABLE {STATS_PART} SET (autovacuum_enabled = off)")

    _steps(group, node, 400, 0)
    assert _stats(STATS_PART, (400, False)) == (400, False)
    assert STATS_PART not in partitions.analyze_young(min_rows=500)

    _steps(group, node, 200, 400)
    assert _stats(STATS_PART, (600, False)) == (600, False)
    assert STATS_PART in partitions.analyze_young(min_rows=500)
    assert _stats(STATS_PART, (0, True)) == (0, True)
    assert STATS_PART not in partitions.analyze_young(min_rows=500)

    _steps(group, node, 599, 600)  # grew, but by less than the 600 rows analyzed
    assert _stats(STATS_PART, (599, True)) == (599, True)
    assert STATS_PART not in partitions.analyze_young(min_rows=500)
    _steps(group, node, 1, 1199)  # now doubled
    assert _stats(STATS_PART, (600, True)) == (600, True)
    assert STATS_PART in partitions.analyze_young(min_rows=500)
    assert _stats(STATS_PART, (0, True)) == (0, True)


@pytest.mark.django_db(transaction=True)
def test_it_skips_a_partition_another_session_holds_instead_of_waiting(stats_day):
    import psycopg

    from console.models import ConsistencyGroup

    node = Node.objects.create(name="node-stats")
    group = ConsistencyGroup.objects.create(name="job-stats", generation=1)
    with connection.cursor() as cur:
        cur.execute(f"ALTER TABLE {STATS_PART} SET (autovacuum_enabled = off)")
    _steps(group, node, 600, 0)
    assert _stats(STATS_PART, (600, False)) == (600, False)

    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], password=db["PASSWORD"],
        dbname=db["NAME"], autocommit=False,
    ) as holder:  # fmt: skip
        # What a running autovacuum or another ANALYZE holds.
        holder.execute(f"LOCK TABLE {STATS_PART} IN SHARE UPDATE EXCLUSIVE MODE")
        t0 = time.monotonic()
        assert STATS_PART in partitions.analyze_young(min_rows=500)
        assert time.monotonic() - t0 < 2
        holder.rollback()
    assert _stats(STATS_PART, (600, False)) == (600, False)  # skipped, due next time
    partitions.analyze_young(min_rows=500)
    assert _stats(STATS_PART, (0, True)) == (0, True)
