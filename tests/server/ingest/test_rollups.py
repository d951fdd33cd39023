"""Minute rollups: percentiles, totals and throttling per closed minute, idempotent."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from console.models import ConsistencyGroup, Node
from ingest import partitions
from ingest.models import DeviceRollup, DeviceSample, StepRecord, StepRollup
from ingest.rollups import rollup

pytestmark = pytest.mark.django_db

MINUTE = datetime(2031, 5, 2, 10, 7, tzinfo=UTC)
AFTER = MINUTE + timedelta(minutes=1, seconds=20)


def percentile_cont(values: list[float], q: float) -> float:
    """Postgres percentile_cont: linear interpolation between the closest ranks."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@pytest.fixture
def where() -> tuple[Node, ConsistencyGroup]:
    partitions.ensure_partitions(days_ahead=0, days_back=0, now=MINUTE)
    return Node.objects.create(name="node-r"), ConsistencyGroup.objects.create(name="job-r")


def _steps(where, durations, *, at=MINUTE, rank_count=4, stale=False, tokens=100):
    node, group = where
    StepRecord.objects.bulk_create(
        StepRecord(
            ts=at + timedelta(seconds=i % 60),
            node=node,
            group=group,
            generation=3,
            stale=stale,
            rank=i % rank_count,
            step=i,
            tokens=tokens,
            duration_ms=d,
        )
        for i, d in enumerate(durations)
    )


def test_it_rolls_up_step_time_percentiles_tokens_and_ranks_per_group_minute(where):
    durations = [float(900 + (i * 37) % 250) for i in range(120)]
    _steps(where, durations)
    rollup(now=AFTER)
    row = StepRollup.objects.get(group=where[1], minute=MINUTE)
    assert row.steps == 120 and row.ranks == 4 and row.tokens == 120 * 100
    assert row.generation == 3
    assert row.step_ms_p50 == pytest.approx(percentile_cont(durations, 0.5))
    assert row.step_ms_p99 == pytest.approx(percentile_cont(durations, 0.99))


def test_it_gives_the_same_rollup_when_run_twice(where):
    _steps(where, [float(d) for d in range(1, 50)])
    rollup(now=AFTER)
    first = list(StepRollup.objects.values())
    rollup(now=AFTER)
    assert list(StepRollup.objects.values()) == first


def test_it_folds_late_rows_into_an_already_rolled_minute(where):
    _steps(where, [100.0] * 10)
    rollup(now=AFTER)
    _steps(where, [300.0] * 10)
    rollup(now=AFTER + timedelta(minutes=1))
    row = StepRollup.objects.get()
    assert row.steps == 20
    assert row.step_ms_p99 == pytest.approx(percentile_cont([100.0] * 10 + [300.0] * 10, 0.99))


def test_it_leaves_the_open_minute_alone(where):
    _steps(where, [100.0] * 5)
    rollup(now=MINUTE + timedelta(seconds=59))
    assert not StepRollup.objects.exists()


def test_it_leaves_stale_generation_steps_out(where):
    _steps(where, [100.0] * 5)
    _steps(where, [9000.0] * 5, stale=True)
    rollup(now=AFTER)
    row = StepRollup.objects.get()
    assert row.steps == 5 and row.step_ms_p99 == pytest.approx(100.0)


def test_it_rolls_up_device_samples_per_node_counting_only_real_throttling(where):
    node, _ = where
    rows = [
        ("GPU-0", 61.0, 1980.0, []),
        ("GPU-0", 88.0, 1410.0, ["sw_thermal_slowdown"]),
        ("GPU-1", 55.0, 1980.0, ["gpu_idle"]),
        ("GPU-2", 70.0, 1600.0, ["sw_power_cap"]),
    ]
    DeviceSample.objects.bulk_create(
        DeviceSample(
            ts=MINUTE + timedelta(seconds=i),
            node=node,
            gpu=gpu,
            index=int(gpu[-1]),
            temp_c=temp,
            sm_clock_mhz=clock,
            throttle_reasons=reasons,
        )
        for i, (gpu, temp, clock, reasons) in enumerate(rows)
    )
    rollup(now=AFTER)
    row = DeviceRollup.objects.get(node=node, minute=MINUTE)
    assert (row.samples, row.gpus, row.throttled_gpus) == (4, 3, 2)
    assert row.max_temp_c == max(r[1] for r in rows)
    assert row.min_sm_clock_mhz == min(r[2] for r in rows)
