"""5 s step bins: the group chart from rollups equals the chart from raw rows."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db.models import Count

from console.api.pages import compute_group_charts
from console.models import ConsistencyGroup, Node, Rank
from ingest import partitions, retention, step_bins
from ingest.models import RollupMark, StepBinRollup, StepHistRollup, StepRecord

pytestmark = pytest.mark.django_db

T0 = datetime(2031, 5, 2, 10, 7, 3, tzinfo=UTC)  # not on a bucket edge
STEPS = 40
STEP_S = 1.5
LAST = T0 + timedelta(seconds=(STEPS - 1) * STEP_S)  # ~58.5 s of steps, 13 buckets
WORLD = 1024  # rank blocks of 4 (1024 / 256)
REPORTING = range(0, WORLD, 7)
STRAGGLER = 350


@pytest.fixture
def group() -> ConsistencyGroup:
    partitions.ensure_partitions(days_ahead=0, days_back=0, now=T0)
    node = Node.objects.create(name="node-b")
    group = ConsistencyGroup.objects.create(
        name="job-b", kind="training", generation=3, world_size=WORLD
    )
    rnd = random.Random(11)
    rows = [
        _step(node, group, rank, s, duration=(1600.0 if rank == STRAGGLER else 1000.0)
              + rnd.random() * 80, at=T0 + timedelta(seconds=s * STEP_S, milliseconds=rank % 900))
        for rank in REPORTING
        for s in range(STEPS)
    ]  # fmt: skip
    # Neither a stale writer nor the previous generation may show: make them loud.
    rows += [_step(node, group, r, 1, duration=90_000.0, at=T0, stale=True) for r in (0, 7)]
    rows += [_step(node, group, r, 1, duration=90_000.0, at=T0, generation=2) for r in (0, 7)]
    StepRecord.objects.bulk_create(rows, batch_size=5000)
    return group


def _step(node: Node, group: ConsistencyGroup, rank: int, step: int, *, duration: float,
          at: datetime, stale: bool = False, generation: int = 3) -> StepRecord:  # fmt: skip
    return StepRecord(
        ts=at, node=node, group=group, generation=generation, stale=stale, rank=rank,
        step=step, duration_ms=duration,
        phases={"compute": duration - 300.0, "collective": 250.0, "input": 50.0},
    )  # fmt: skip


def charts(group: ConsistencyGroup, *, rollups: bool = True) -> dict[str, Any]:
    fresh = ConsistencyGroup.objects.annotate(rank_count=Count("ranks")).get(pk=group.pk)
    return compute_group_charts(fresh, rollups=rollups)


def rows() -> list[dict[str, Any]]:
    return list(StepBinRollup.objects.order_by("id").values()) + list(
        StepHistRollup.objects.order_by("id").values()
    )


def test_the_chart_from_rollups_equals_the_chart_from_raw_rows(group):
    raw = charts(group, rollups=False)
    written = step_bins.rollup(now=LAST + timedelta(seconds=10))
    # 13 buckets x 147 reporting ranks in 4-rank blocks, plus generation 2's one bucket.
    assert written["ingest_stepbinrollup"] == 13 * 147 + 2
    assert StepBinRollup.objects.filter(generation=3).count() == 13 * 147
    assert charts(group) == raw
    hm = raw["heatmap"]
    assert hm["bin_s"] == 5 and len(hm["y"]) == 256 and hm["ranks_per_bin"] == 4
    assert max(v for row in hm["z"] for v in row if v is not None) < 1700.0  # no stale rows
    assert max(v for v in hm["z"][STRAGGLER // 4] if v is not None) >= 1600.0
    assert raw["slowest"]["ranks"][0] == f"r{STRAGGLER}"


def test_it_reads_rolled_buckets_from_the_rollup_and_the_open_tail_raw(group):
    step_bins.rollup(now=LAST - timedelta(seconds=8))  # the last ~15 s are not rolled yet
    rolled_from, rolled_until = step_bins.covered()
    assert rolled_until == step_bins.bucket_floor(LAST - timedelta(seconds=10))
    assert charts(group) == charts(group, rollups=False)
    StepBinRollup.objects.update(max_ms=99_999.0)  # prove which rows each cell came from
    hm = charts(group)["heatmap"]
    grid_start = datetime.fromisoformat(hm["x"][0])
    for t, label in enumerate(hm["x"]):
        column = {row[t] for row in hm["z"]} - {None}
        rolled = rolled_from <= datetime.fromisoformat(label) < rolled_until
        assert (column == {99_999.0}) is rolled, (label, column)
    assert grid_start == step_bins.bucket_floor(T0)


def test_it_folds_late_rows_in_on_the_next_pass(group):
    now = LAST + timedelta(seconds=10)
    step_bins.rollup(now=now)
    node = Node.objects.get()
    late = [_step(node, group, r, 99, duration=3000.0, at=T0 + timedelta(seconds=30))
            for r in (1, 2, 3)]  # fmt: skip
    StepRecord.objects.bulk_create(late)
    assert charts(group) != charts(group, rollups=False)  # until the next pass
    # A pass looks back LOOKBACK_BUCKETS; the minute task's backstop refolds the window.
    step_bins.rollup(now=now + timedelta(seconds=5), buckets=step_bins.BACKSTOP_BUCKETS)
    assert charts(group) == charts(group, rollups=False)
    assert StepHistRollup.objects.filter(hist_bucket__gte=384).exists()  # ln(3000) * 48


def test_a_second_run_changes_nothing(group):
    now = LAST + timedelta(seconds=10)
    step_bins.rollup(now=now)
    before = rows()
    assert step_bins.rollup(now=now) == {"ingest_stepbinrollup": 0, "ingest_stephistrollup": 0}
    assert rows() == before


def test_blocks_that_grew_since_they_were_rolled_are_not_counted_twice(group):
    ConsistencyGroup.objects.filter(pk=group.pk).update(world_size=256)  # blocks of 1 rank
    now = LAST + timedelta(seconds=10)
    step_bins.rollup(now=now)
    assert StepBinRollup.objects.filter(rank_lo=7).exists()
    ConsistencyGroup.objects.filter(pk=group.pk).update(world_size=None)
    node = Node.objects.get()
    Rank.objects.bulk_create(Rank(group=group, rank=r, node=node) for r in range(WORLD))
    step_bins.rollup(now=now, buckets=step_bins.BACKSTOP_BUCKETS)  # now blocks of 4
    assert not StepBinRollup.objects.filter(rank_lo=7).exists()
    rolled = charts(group)
    assert rolled == charts(group, rollups=False) and rolled["heatmap"]["ranks_per_bin"] == 4


def test_it_keeps_the_covered_range_contiguous_and_catches_up_after_a_gap():
    end = datetime(2031, 5, 2, 10, 0, tzinfo=UTC)
    s = timedelta(seconds=step_bins.BUCKET_S)
    start = end - 3 * s
    # First pass: the last CATCH_UP.
    back = end - step_bins.CATCH_UP
    assert step_bins._window(start, end, None) == (back, (back, end))
    # The next pass 5 s later extends the range.
    assert step_bins._window(start + s, end + s, (end - 60 * s, end)) == (
        start + s,
        (end - 60 * s, end + s),
    )
    # Missed passes: start where the last one stopped, so no bucket is skipped.
    later = end + 20 * s
    assert step_bins._window(later - 3 * s, later, (end - 60 * s, end)) == (
        end,
        (end - 60 * s, later),
    )
    # An outage longer than CATCH_UP: restart the range at CATCH_UP back.
    much_later = end + timedelta(hours=1)
    floor = much_later - step_bins.CATCH_UP
    assert step_bins._window(much_later - 3 * s, much_later, (end - 60 * s, end)) == (
        floor,
        (floor, much_later),
    )


def test_retention_keeps_a_day_of_step_bins_whatever_the_raw_retention(group):
    step_bins.rollup(now=LAST + timedelta(seconds=10))
    assert StepBinRollup.objects.exists() and StepHistRollup.objects.exists()
    retention.run(now=LAST + timedelta(hours=23), keep_days=14)  # younger than a day: kept
    assert StepBinRollup.objects.exists() and StepHistRollup.objects.exists()
    retention.run(now=T0 + timedelta(days=3), keep_days=14)
    assert not StepBinRollup.objects.exists() and not StepHistRollup.objects.exists()
    assert RollupMark.objects.get().rolled_from == T0 + timedelta(days=2)
