"""Step reads for charts and recovery: the group page's heatmap and percentiles, and the
step rows an interruption's recovery costs are measured from (console.queries.recovery).

Chart reads aggregate in Postgres: a 16k-rank group holds ~1M step rows per 10 minutes, so
no query here returns more rows than the chart has cells. Must not write.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Max, Min, Model, Q, QuerySet, Sum
from django.db.models.functions import TruncDate

from console import charts
from console.models import ConsistencyGroup
from console.queries.telemetry.shared import RECOVERY_WINDOW
from ingest import models as m
from ingest import step_bins

# The record kinds whose tables this module reads (each kind has a reader: tests/server/ingest/
# test_record_kinds.py).
READS: dict[str, type[Model]] = {"step": m.StepRecord}

# Chart reads aggregate in Postgres: a 16k-rank group holds ~1M step rows per 10 minutes,
# so no query here returns more rows than the chart has cells.

CHART_WINDOW = timedelta(minutes=10)
SLOWEST_RANKS = 8
HIST_RESOLUTION = step_bins.HIST_RESOLUTION

# The charts' time bins are whole step-bin rollup buckets of this many seconds.
STEP_BUCKET_S = step_bins.BUCKET_S

# The heatmap cells (rank bin x time bin: slowest, mean and count) and a log-scale
# step-time histogram per time bin, from which console.charts reads percentiles (within
# about 1 % at HIST_RESOLUTION 48). Inside the range the step-bin rollup covers they come
# from its rows (whole 5 s buckets and rank blocks: the grid is aligned to them); outside
# it, the open tail of the last seconds and any bucket not rolled yet, from one scan of
# raw rows with GROUPING SETS. Sums of counts, sums and maxima are exact, so the result
# is the same either way. date_bin and integer division: extract(epoch) is numeric, slow.
_STEP_AGG_SQL = """
WITH raw AS (
  SELECT GROUPING(rb) AS is_hist, rb, tb, hb, max(duration_ms) AS mx, sum(duration_ms) AS sm,
         count(*) AS n
  FROM (
    SELECT LEAST(rank / %(block)s, %(rbins)s - 1) AS rb,
           date_bin(make_interval(secs => %(width)s), ts, %(origin)s) AS tb,
           floor(ln(greatest(duration_ms, 0.001)) * %(hres)s)::int AS hb,
           duration_ms
    FROM ingest_steprecord
    WHERE group_id = %(group)s AND generation = %(generation)s AND NOT stale
      AND duration_ms IS NOT NULL AND ts >= %(since)s AND ts < %(rolled_from)s
    UNION ALL
    SELECT LEAST(rank / %(block)s, %(rbins)s - 1),
           date_bin(make_interval(secs => %(width)s), ts, %(origin)s),
           floor(ln(greatest(duration_ms, 0.001)) * %(hres)s)::int,
           duration_ms
    FROM ingest_steprecord
    WHERE group_id = %(group)s AND generation = %(generation)s AND NOT stale
      AND duration_ms IS NOT NULL AND ts >= %(rolled_until)s AND ts <= %(until)s
  ) steps
  GROUP BY GROUPING SETS ((rb, tb), (tb, hb))
)
SELECT 0, rb, tb, NULL, max(mx), sum(sm) / sum(n), sum(n)
FROM (
  SELECT rb, tb, mx, sm, n FROM raw WHERE is_hist = 0
  UNION ALL
  SELECT LEAST(rank_lo / %(block)s, %(rbins)s - 1),
         date_bin(make_interval(secs => %(width)s), bucket, %(origin)s), max_ms, sum_ms, steps
  FROM ingest_stepbinrollup
  WHERE group_id = %(group)s AND generation = %(generation)s
    AND bucket >= %(rolled_from)s AND bucket < %(rolled_until)s
) cells
GROUP BY rb, tb
UNION ALL
SELECT 1, NULL, tb, hb, NULL, NULL, sum(n)
FROM (
  SELECT tb, hb, n FROM raw WHERE is_hist = 1
  UNION ALL
  SELECT date_bin(make_interval(secs => %(width)s), bucket, %(origin)s), hist_bucket, steps
  FROM ingest_stephistrollup
  WHERE group_id = %(group)s AND generation = %(generation)s
    AND bucket >= %(rolled_from)s AND bucket < %(rolled_until)s
) hist
GROUP BY tb, hb
"""

# Exact per-rank means and phases, only for ranks in the slowest rank bins: the
# (group, rank, -ts) index keeps this to a few hundred ranks' rows.
_PHASES_SQL = """
SELECT rank, avg(duration_ms),
       avg((phases->>'compute')::float), avg((phases->>'collective')::float),
       avg((phases->>'input')::float), avg((phases->>'checkpoint')::float),
       avg((phases->>'optimizer')::float)
FROM ingest_steprecord
WHERE group_id = %(group)s AND generation = %(generation)s AND NOT stale
  AND ts >= %(since)s AND ts <= %(until)s AND rank = ANY(%(ranks)s::int[])
  AND duration_ms IS NOT NULL
GROUP BY rank ORDER BY 2 DESC LIMIT %(limit)s
"""


def step_window(group: ConsistencyGroup) -> tuple[datetime, datetime] | None:
    """[first, newest] step time of the active generation within CHART_WINDOW, or None.

    The window starts on a rollup bucket edge, CHART_WINDOW / BUCKET_S buckets back from
    the newest one, so the chart's time bins are exactly the rollup's buckets. Filtering
    on the generation lets both reads walk the (group, generation, -ts) index.
    """
    current = m.StepRecord.objects.filter(group=group, generation=group.generation, stale=False)
    newest = current.order_by("-ts").values_list("ts", flat=True).first()
    if newest is None:
        return None
    bucket = timedelta(seconds=step_bins.BUCKET_S)
    since = step_bins.bucket_floor(newest) - (CHART_WINDOW - bucket)
    first = current.filter(ts__gte=since).order_by("ts").values_list("ts", flat=True).first()
    return (first or newest), newest


def step_aggregates(
    group: ConsistencyGroup, *, world: int, grid: Any, until: datetime, rollups: bool = True
) -> dict[str, list[tuple[Any, ...]]]:
    """Heatmap cells, per-bin percentiles and the slowest ranks' phases, all in SQL.

    Reads the grid's whole buckets from the step-bin rollup where it covers them and raw
    rows elsewhere (`rollups=False`: raw rows only, the reference the tests compare with).
    Returns aggregated rows only (at most rank bins x grid.bins cells plus a histogram),
    with time bins as indexes of `grid`; nothing here loops over step rows.
    """
    origin = datetime.fromtimestamp(grid.start, UTC)
    # Rollup buckets [lo, hi) inside the window; raw rows before lo and from hi on.
    lo = hi = origin
    if rollups and (mark := step_bins.covered()) is not None:
        lo = max(origin, mark[0])
        hi = min(mark[1], step_bins.bucket_floor(until) + timedelta(seconds=step_bins.BUCKET_S))
        if hi <= lo:
            lo = hi = origin
    params: dict[str, Any] = {
        "group": group.pk,
        "generation": group.generation,
        "block": charts.rank_block(world),
        "rbins": charts.rank_bins(world),
        "width": grid.width_s,
        "origin": origin,
        "since": origin,
        "until": until,
        "rolled_from": lo,
        "rolled_until": hi,
        "limit": SLOWEST_RANKS,
        "hres": HIST_RESOLUTION,
    }

    def index(ts: datetime) -> int:
        return round((ts.timestamp() - grid.start) / grid.width_s)

    cells, hist = [], []
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL jit = off")  # compiling costs more than it saves here
        # The planner expects ~a group per row (it cannot know 256 x 120 bins cap them) and
        # picks an on-disk sort for the grouping sets; given room for the hash table it
        # estimates, it hashes both sets in one pass (measured: ~53 MB at 16k ranks raw).
        cur.execute("SET LOCAL work_mem = '256MB'")
        cur.execute(_STEP_AGG_SQL, params)
        for is_hist, rb, ts, hb, slowest, mean, n in cur.fetchall():
            if is_hist:
                hist.append((index(ts), hb, int(n)))
            else:
                cells.append((rb, index(ts), slowest, mean, int(n)))
        suspects = charts.slowest_bins(cells, count=SLOWEST_RANKS)
        params["ranks"] = charts.ranks_in_bins(suspects, world=world)
        cur.execute(_PHASES_SQL, params)
        slowest = cur.fetchall()
    percentiles = charts.histogram_percentiles(hist, resolution=HIST_RESOLUTION)
    return {"cells": cells, "percentiles": percentiles, "slowest": slowest}


# The ranks of one synchronous job report the same step within this of each other (step
# time, delivery and clock skew): the margin of a time bound derived from one rank's row.
STEP_SKEW = timedelta(minutes=2)
_NON_FINITE = [float("nan"), float("inf"), float("-inf")]


def recovery_steps(
    group: ConsistencyGroup,
    generation: int,
    around: datetime,
    *,
    min_step: int | None = None,
    lo: datetime | None = None,
    hi: datetime | None = None,
) -> list[dict[str, Any]]:
    """One row per step of `generation` near `around`: when the last rank finished it,
    tokens summed over ranks, the highest data cursor, ranks, and whether every rank's
    numbers were finite (Postgres compares NaN equal to NaN, so `IN` finds them).

    `lo`/`hi` narrow the time range inside the window: the (group, generation, ts) index
    is what bounds the rows read, and a generation's whole window is every rank's step
    for hours (`step >= min_step` alone still reads them all)."""
    qs = _between(_window(group, generation, around), lo, hi)
    if min_step is not None:
        qs = qs.filter(step__gte=min_step)
    bad = Q(overflow=True) | Q(loss__in=_NON_FINITE) | Q(grad_norm__in=_NON_FINITE)
    return list(
        qs.values("step")
        .annotate(
            ts=Max("ts"),
            tokens=Sum("tokens"),
            cursor=Max("data_cursor"),
            ranks=Count("id"),  # rows, not DISTINCT: a sort of every row otherwise
            bad=Count("id", filter=bad),
        )
        .order_by("step")[:20000]
    )


def _window(group: ConsistencyGroup, generation: int, around: datetime) -> QuerySet[Any]:
    return m.StepRecord.objects.filter(
        group=group,
        generation=generation,
        stale=False,
        ts__gte=around - RECOVERY_WINDOW,
        ts__lt=around + RECOVERY_WINDOW,
    )


def _between(qs: QuerySet[Any], lo: datetime | None, hi: datetime | None) -> QuerySet[Any]:
    """`qs` narrowed to [lo, hi) where given (the window's own bounds still hold)."""
    if lo is not None:
        qs = qs.filter(ts__gte=lo)
    if hi is not None:
        qs = qs.filter(ts__lt=hi)
    return qs


def first_step_of(group: ConsistencyGroup, generation: int, around: datetime) -> int | None:
    """The lowest step `generation` reported near `around` (None: none yet), from its
    first STEP_SKEW of records: its whole window is every rank's every step since."""
    window = _window(group, generation, around)
    first = window.order_by("ts").values_list("ts", flat=True).first()
    if first is None:
        return None
    return window.filter(ts__lt=first + STEP_SKEW).aggregate(s=Min("step"))["s"]


def newest_step_at(group: ConsistencyGroup, generation: int, around: datetime) -> datetime | None:
    """When `generation` last reported a step near `around` (the newest row of the index)."""
    return _window(group, generation, around).order_by("-ts").values_list("ts", flat=True).first()


def step_reached_at(
    group: ConsistencyGroup,
    generation: int,
    step: int,
    around: datetime,
    *,
    lo: datetime | None = None,
    hi: datetime | None = None,
) -> datetime | None:
    """When rank 0 of `generation` reported `step` near `around` (None: it did not): the
    (group, rank, ts) index reads one rank's rows, not the world's, and `lo`/`hi` narrow
    them. Every launcher has a rank 0, and the ranks of a synchronous job finish a step
    within STEP_SKEW of it."""
    qs = _between(_window(group, generation, around), lo, hi).filter(rank=0, step=step)
    return qs.order_by("-ts").values_list("ts", flat=True).first()


def tokens_by_group_day(since: datetime, until: datetime) -> dict[tuple[str, str], int]:
    """Tokens per (group name, UTC day) from the minute rollups (ingest.rollups)."""
    rows = (
        m.StepRollup.objects.filter(minute__gte=since, minute__lt=until)
        .annotate(day=TruncDate("minute", tzinfo=UTC))
        .values("group__name", "day")
        .annotate(tokens=Sum("tokens"))
    )
    return {(r["group__name"], r["day"].isoformat()): int(r["tokens"] or 0) for r in rows}
