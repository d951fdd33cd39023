"""Reads for pages, the API and live payloads, with their joins baked in (no N+1)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Q, QuerySet

from console import events
from console.models import ConsistencyGroup, Device, Incident, Node, Rank
from ingest import models as m
from ingest import step_bins


def groups_on_nodes(names: list[str]) -> list[str]:
    return list(
        Rank.objects.filter(node__name__in=names).values_list("group__name", flat=True).distinct()
    )


def groups_overview() -> QuerySet[ConsistencyGroup]:
    return ConsistencyGroup.objects.annotate(
        # distinct: the ranks join repeats every incident once per rank.
        open_incidents=Count("incidents", filter=~Q(incidents__state="resolved"), distinct=True),
        rank_count=Count("ranks", distinct=True),
    ).order_by("name")


def open_incidents() -> QuerySet[Incident]:
    return Incident.objects.exclude(state="resolved").select_related("group")


def node_payloads(
    names: list[str] | None = None, labels: dict[str, str] | None = None
) -> list[events.NodePayload]:
    """Node cards for the fleet grid and its live pushes, in two flat queries.

    No model instances: at 2,048 nodes x 8 GPUs, building Device models and decoding every
    `last_sample` costs more than the page; this reads just the fields the grid shows.
    """
    nodes = Node.objects.order_by("name")
    if names is not None:
        nodes = nodes.filter(name__in=names)
    if labels:
        nodes = nodes.filter(labels__contains=labels)
    rows = list(nodes.values("pk", "name", "health", "last_seen", "quarantined", "cordoned"))
    devices: dict[int, list[Any]] = {r["pk"]: [] for r in rows}
    sample = ("temp_c", "power_w", "util_pct", "sm_clock_mhz", "throttle_reasons")
    qs = Device.objects.filter(node__in=nodes).order_by("node_id", "index")
    for d in qs.values(
        "node_id", "uuid", "index", "health", *[f"last_sample__{k}" for k in sample]
    ):
        devices[d["node_id"]].append(
            {
                "uuid": d["uuid"],
                "index": d["index"],
                "health": d["health"],
                **{k: d[f"last_sample__{k}"] for k in sample},
                "throttle_reasons": d["last_sample__throttle_reasons"] or [],
            }
        )
    return [
        {
            "name": r["name"],
            "health": r["health"],
            "last_seen": r["last_seen"].isoformat() if r["last_seen"] else None,
            "quarantined": r["quarantined"],
            "cordoned": r["cordoned"],
            "devices": devices[r["pk"]],
        }
        for r in rows
    ]


# -- group page -----------------------------------------------------------------------------
# Chart reads aggregate in Postgres: a 16k-rank group holds ~1M step rows per 10 minutes,
# so no query here returns more rows than the chart has cells.

CHART_WINDOW = timedelta(minutes=10)
SLOWEST_RANKS = 8
HIST_RESOLUTION = step_bins.HIST_RESOLUTION

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
  AND ts >= %(since)s AND ts <= %(until)s AND rank = ANY(%(ranks)s) AND duration_ms IS NOT NULL
GROUP BY rank ORDER BY 2 DESC LIMIT %(limit)s
"""


def group_page(name: str) -> ConsistencyGroup:
    """The group with its open-incident and rank counts (raises DoesNotExist)."""
    return groups_overview().get(name=name)


def group_incidents(group: ConsistencyGroup, limit: int = 50) -> list[Incident]:
    return list(group.incidents.select_related("assignee").order_by("-opened_at")[:limit])


def group_transitions(group: ConsistencyGroup, limit: int = 200) -> list[dict[str, Any]]:
    """The newest `limit` state transitions, oldest first (stale writers excluded)."""
    rows = (
        m.TransitionRecord.objects.filter(group=group, stale=False)
        .order_by("-ts")
        .values("ts", "generation", "from_state", "to_state", "reason", "restart_count")[:limit]
    )
    return list(reversed(rows))


def group_checkpoints(group: ConsistencyGroup, limit: int = 300) -> list[dict[str, Any]]:
    return list(
        m.CheckpointRecord.objects.filter(group=group)
        .order_by("-ts")
        .values("ts", "generation", "checkpoint_id", "step", "phase", "detail")[:limit]
    )


def serving_workers(group: ConsistencyGroup) -> list[dict[str, Any]]:
    """Each serving worker's newest window (DISTINCT ON: one row per worker)."""
    return list(
        m.ServingWindow.objects.filter(group=group, stale=False)
        .order_by("worker", "-ts")
        .distinct("worker")
        .values("worker", "ts", "model_version", "adapter_version", "kv_schema", "ready",
                "draining", "window")[:1000]
    )  # fmt: skip


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
    from console import charts

    origin = datetime.fromtimestamp(grid.start, UTC)
    # Rollup buckets [lo, hi) inside the window; raw rows before lo and from hi on.
    lo = hi = origin
    if rollups and (mark := step_bins.covered()) is not None:
        lo = max(origin, mark[0])
        hi = min(mark[1], step_bins.bucket_floor(until) + timedelta(seconds=step_bins.BUCKET_S))
        if hi <= lo:
            lo = hi = origin
    params: dict[str, Any] = {
        "group": group.pk, "generation": group.generation, "block": charts.rank_block(world),
        "rbins": charts.rank_bins(world), "width": grid.width_s, "origin": origin,
        "since": origin, "until": until, "rolled_from": lo, "rolled_until": hi,
        "limit": SLOWEST_RANKS, "hres": HIST_RESOLUTION,
    }  # fmt: skip

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
