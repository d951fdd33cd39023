"""Minute rollups of telemetry: step time per group, GPU health per node.

`rollup(now=...)` recomputes the last few *closed* minutes with one INSERT ... SELECT ...
ON CONFLICT DO UPDATE per table, so it is idempotent, cheap (a BRIN range scan over a few
minutes) and folds in rows that arrived late. Charts and capacity reports read these
instead of raw rows. It must not touch live state or raw telemetry.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection, transaction

from agents.gpu_health import SLOWDOWN_REASONS

_STEP_SQL = """
INSERT INTO ingest_steprollup
    (group_id, minute, generation, steps, ranks, tokens, step_ms_p50, step_ms_p99)
SELECT group_id, date_trunc('minute', ts), max(generation), count(*),
       count(DISTINCT rank), coalesce(sum(tokens), 0),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ms)
FROM ingest_steprecord
WHERE ts >= %(start)s AND ts < %(end)s AND NOT stale
GROUP BY group_id, date_trunc('minute', ts)
ON CONFLICT (group_id, minute) DO UPDATE SET
    generation = EXCLUDED.generation, steps = EXCLUDED.steps, ranks = EXCLUDED.ranks,
    tokens = EXCLUDED.tokens, step_ms_p50 = EXCLUDED.step_ms_p50,
    step_ms_p99 = EXCLUDED.step_ms_p99
"""

_DEVICE_SQL = """
INSERT INTO ingest_devicerollup
    (node_id, minute, samples, gpus, max_temp_c, min_sm_clock_mhz, throttled_gpus)
SELECT node_id, date_trunc('minute', ts), count(*), count(DISTINCT gpu), max(temp_c),
       min(sm_clock_mhz),
       count(DISTINCT gpu) FILTER (WHERE throttle_reasons ?| %(reasons)s)
FROM ingest_devicesample
WHERE ts >= %(start)s AND ts < %(end)s
GROUP BY node_id, date_trunc('minute', ts)
ON CONFLICT (node_id, minute) DO UPDATE SET
    samples = EXCLUDED.samples, gpus = EXCLUDED.gpus, max_temp_c = EXCLUDED.max_temp_c,
    min_sm_clock_mhz = EXCLUDED.min_sm_clock_mhz, throttled_gpus = EXCLUDED.throttled_gpus
"""


def closed_window(now: datetime, minutes: int) -> tuple[datetime, datetime]:
    """[start, end): the `minutes` whole minutes that ended at or before `now`."""
    end = now.replace(second=0, microsecond=0)
    return end - timedelta(minutes=minutes), end


def rollup(*, now: datetime, minutes: int = 5) -> dict[str, int]:
    """Recompute the last `minutes` closed minutes; returns rows written per rollup table.

    Run every minute (Celery beat); `minutes` > 1 re-folds rows that arrived late from an
    agent's spool. Safe to run twice or concurrently: the unique (key, minute) decides.
    """
    start, end = closed_window(now, minutes)
    params = {"start": start, "end": end, "reasons": sorted(SLOWDOWN_REASONS)}
    written: dict[str, int] = {}
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(_STEP_SQL, params)
        written["ingest_steprollup"] = cur.rowcount
        cur.execute(_DEVICE_SQL, params)
        written["ingest_devicerollup"] = cur.rowcount
    return written
