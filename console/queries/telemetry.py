"""The console's one read of ingest's telemetry tables: charts, timelines, snapshots, serving.

Every read in `console` of a table `ingest` owns (steps, collectives, processes,
checkpoints, transitions, serving windows, device events, contract violations, agent
bookkeeping, the step-bin rollups) lives here, so this is the only console module that
imports `ingest` (an import-linter contract holds it). Reads are bounded by time and walk
the telemetry indexes; chart reads aggregate in Postgres. Must not write.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Max, Min, Q, QuerySet, Sum
from django.db.models.functions import TruncDate

from agents.protocol import URGENT_HOST_EVENTS
from agents.vocab import HARDWARE_FAULT_KINDS as CRITICAL_EVENTS
from agents.wire import parse_step_id, step_id
from console import charts
from console.models import ConsistencyGroup
from console.queries import binary
from ingest import models as m
from ingest import step_bins

# The model console.api.serializers describes agents with (a ModelSerializer needs it).
AgentState = m.AgentState

# -- group page -----------------------------------------------------------------------------
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
        .values(
            "worker",
            "ts",
            "model_version",
            "adapter_version",
            "kv_schema",
            "ready",
            "draining",
            "window",
        )[:1000]
    )


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


# -- agents ---------------------------------------------------------------------------------


def agents() -> QuerySet[AgentState]:
    """Every agent's bookkeeping (sequence, gaps, spool), by node then agent id."""
    return AgentState.objects.select_related("node").order_by("node__name", "agent_id")


# -- serving --------------------------------------------------------------------------------
# JSON fields of the windows are cast in SQL, so a page costs a few indexed queries however
# many windows a fleet reports.

_SERVING_SERIES = """
SELECT date_trunc('minute', ts) AS minute,
       sum(coalesce(("window"->>'slo_met')::bigint, 0)) AS met,
       sum(coalesce(("window"->>'requests')::bigint, 0)) AS requests,
       sum(coalesce(("window"->>'seconds')::float, 0))
         / greatest(count(DISTINCT worker), 1) AS secs,
       max(("window"->>'ttft_ms_p99')::float) AS ttft_p99,
       max(("window"->>'tpot_ms_p99')::float) AS tpot_p99
FROM ingest_servingwindow
WHERE group_id = %s AND ts >= %s
GROUP BY 1 ORDER BY 1
"""

_SERVING_VERSIONS = """
SELECT coalesce(model_version, '?') AS version,
       sum(coalesce(("window"->>'requests')::bigint, 0)) AS requests,
       sum(coalesce(("window"->>'slo_met')::bigint, 0)) AS met,
       count(DISTINCT worker) AS workers,
       min(ts) AS first_seen, max(ts) AS last_seen
FROM ingest_servingwindow
WHERE group_id = %s AND ts >= %s
GROUP BY 1 ORDER BY min(ts)
"""


def serving_minutes(group: ConsistencyGroup, since: datetime) -> list[tuple[Any, ...]]:
    """Per minute since `since`: (minute, slo_met, requests, seconds per worker, worst
    ttft p99, worst tpot p99)."""
    with connection.cursor() as cur:
        cur.execute(_SERVING_SERIES, [group.pk, since])
        return list(cur.fetchall())


def serving_versions(group: ConsistencyGroup, since: datetime) -> list[tuple[Any, ...]]:
    """Per model version since `since`, oldest first: (version, requests, slo_met, workers,
    first seen, last seen)."""
    with connection.cursor() as cur:
        cur.execute(_SERVING_VERSIONS, [group.pk, since])
        return list(cur.fetchall())


# -- diagnosis snapshots --------------------------------------------------------------------
# Contract-shaped dicts (the `kind` and field names of agents.protocol) for
# console.snapshots. Each query is bounded by time and, where a table grows per rank, takes
# just the newest row per rank (DISTINCT ON), so a 16k-rank group costs a handful of
# indexed queries, not one per rank.

STEP_WINDOW = timedelta(minutes=10)
EVENT_WINDOW = timedelta(minutes=30)
HISTORY_WINDOW = timedelta(hours=24)
MAX_STEP_ROWS = 200_000
MAX_PROBE_ROWS = 20_000
MAX_SINCE_ROWS = MAX_STEP_ROWS

_STEP_FIELDS = [
    "generation",
    "rank",
    "step",
    "tokens",
    "data_cursor",
    "duration_ms",
    "phases",
    "loss",
    "grad_norm",
    "loss_scale",
    "overflow",
    "model_flops",
    "hw_flops",
]


def _rows(
    qs: QuerySet[Any], kind: str, fields: list[str], node_names: dict[int, str]
) -> list[dict[str, Any]]:
    out = []
    for row in qs.values("ts", "node_id", *fields):
        row["kind"] = kind
        row["node"] = node_names.get(row.pop("node_id"))
        out.append(row)
    return out


def group_records(
    group: ConsistencyGroup, *, node_names: dict[int, str], now: datetime
) -> list[dict[str, Any]]:
    """The group's recent steps, collectives, exits, checkpoints, transitions and serving
    windows, as records of the wire contract (`node` is the node's name)."""
    return rank_records(group, node_names=node_names, now=now) + evidence_records(
        group, node_names=node_names, now=now
    )


# The per-rank tables a live diagnosis state follows by id (console.snapshots): kind, model,
# the fields read, and whether only the group's active generation counts. Rows are appended
# by COPY and never updated, so a row's id is a cursor.
_PROCESS_FIELDS = [
    "generation",
    "rank",
    "event",
    "pid",
    "gpu",
    "exit_code",
    "signal",
    "reason",
    "error_type",
    "message",
]
RANK_TABLES: dict[str, tuple[type[m._GroupRecord], list[str], bool]] = {
    "step": (m.StepRecord, _STEP_FIELDS, True),
    "collective": (m.CollectiveWindow, ["generation", "rank", "entries"], True),
    "process_groups": (m.ProcessGroupsRecord, ["generation", "rank", "groups"], True),
    "process": (m.ProcessRecord, _PROCESS_FIELDS, False),
}


def _collective_ts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for row in rows:
        if row["kind"] == "collective":
            for entry in row["entries"]:
                if entry.get("started_ts"):
                    entry["started_ts"] = datetime.fromisoformat(entry["started_ts"])
    return rows


# The per-rank reads are the bulk of a pass at fleet scale (16k rows a step at 16k ranks,
# ~200k for a full read), so they skip the ORM (console.queries.binary): one binary-format
# query per table, each row zipped into the same contract-shaped dict `_rows` builds.
# jsonb columns of the per-rank and node-scoped tables: read as text, decoded by orjson.
_JSON_FIELDS = frozenset({"phases", "entries", "groups", "counters", "disks"})
_fetch = binary.fetch


def _columns(fields: list[str]) -> str:
    return ", ".join(f"{f}::text" if f in _JSON_FIELDS else f for f in fields)


def _select(kind: str, fields: list[str], newest_per_rank: bool = False) -> str:
    """The column list of a per-rank read: id, ts, node id, then `fields` (jsonb as text);
    `newest_per_rank`: DISTINCT ON (rank), for a read ordered by rank, newest first."""
    distinct = "DISTINCT ON (rank) " if newest_per_rank else ""
    table = RANK_TABLES[kind][0]._meta.db_table
    return f"SELECT {distinct}id, ts, node_id, {_columns(fields)} FROM {table}"  # noqa: S608


def _records(
    rows: list[tuple[Any, ...]],
    kind: str,
    fields: list[str],
    node_names: dict[int, str],
    lead: tuple[str, ...] = ("id", "ts", "node"),
) -> list[dict[str, Any]]:
    """Rows of `lead` columns (ending with the node id) then `fields`, as contract-shaped
    dicts (what `_rows` makes): `node` is the node's name, jsonb decoded."""
    keys = (*lead, *fields)
    at = len(lead)
    decode = [(f, at + i) for i, f in enumerate(fields) if f in _JSON_FIELDS]
    names = node_names.get
    out: list[dict[str, Any]] = []
    for row in rows:
        rec = dict(zip(keys, row, strict=True))
        rec["node"] = names(row[at - 1])
        for f, i in decode:
            raw = row[i]
            rec[f] = None if raw is None else binary.json.decode(raw)
        rec["kind"] = kind
        out.append(rec)
    return out


def _kind_rows(
    kind: str,
    where: str,
    params: list[Any],
    node_names: dict[int, str],
    tail: str = "ORDER BY id",
    newest_per_rank: bool = False,
) -> list[dict[str, Any]]:
    _, fields, _ = RANK_TABLES[kind]
    if newest_per_rank:
        tail = "ORDER BY rank, ts DESC"
    sql = f"{_select(kind, fields, newest_per_rank)} WHERE {where} {tail}"
    return _records(_fetch(sql, params), kind, fields, node_names)


def rank_records(
    group: ConsistencyGroup,
    *,
    node_names: dict[int, str],
    now: datetime,
    ranks: list[int] | None = None,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """A full read of the group's per-rank records (steps, collective windows, process-groups
    reports, processes), each with its row `id`, bounded as a snapshot needs them; `ranks`:
    those ranks' only (the urgent lane's read of the ranks on a node, console.snapshots);
    `generation`: a generation that has ended (its closing pass), not the group's own."""
    gen, gid = group.generation if generation is None else generation, group.pk
    only, some = ("AND rank = ANY(%s::int[])", [ranks]) if ranks is not None else ("", [])
    current = f"group_id = %s AND generation = %s AND NOT stale {only}"
    steps = _kind_rows(
        "step",
        f"{current} AND ts >= %s",
        [gid, gen, *some, now - STEP_WINDOW],
        node_names,
        f"ORDER BY ts DESC LIMIT {MAX_STEP_ROWS}",
    )
    # A rank hung for longer than the step window must stay in the snapshot with its last
    # step, or the hang would vanish from diagnosis and its incident resolve by itself.
    members = group.ranks.filter(generation=gen)
    if ranks is not None:
        members = members.filter(rank__in=ranks)
    quiet = set(members.values_list("rank", flat=True)) - {row["rank"] for row in steps}
    if quiet:
        steps += _kind_rows(
            "step",
            f"{current} AND rank = ANY(%s::int[]) AND ts >= %s",
            [gid, gen, *some, sorted(quiet), now - HISTORY_WINDOW],
            node_names,
            newest_per_rank=True,
        )
    records = steps
    # The newest collective window and process-groups report per rank.
    records += _kind_rows(
        "collective",
        f"{current} AND ts >= %s",
        [gid, gen, *some, now - HISTORY_WINDOW],
        node_names,
        newest_per_rank=True,
    )
    records += _kind_rows(
        "process_groups", current, [gid, gen, *some], node_names, newest_per_rank=True
    )
    # Exits and device events explain stops for as long as the stop lasts: keep a day.
    records += _kind_rows(
        "process",
        f"group_id = %s AND ts >= %s AND NOT stale {only}",
        [gid, now - HISTORY_WINDOW, *some],
        node_names,
    )
    return _collective_ts(records)


def rank_records_since(
    group: ConsistencyGroup,
    *,
    node_names: dict[int, str],
    after: dict[str, int],
    skip: dict[str, set[int]],
    costs: dict[str, float] | None = None,
) -> list[dict[str, Any]] | None:
    """The group's per-rank records with an id above `after[kind]` (minus the ids in
    `skip[kind]`, already applied), oldest id first: what arrived since the last pass.
    None when a table has more than MAX_SINCE_ROWS new rows (a full read is cheaper).
    `costs`, when given, gains the seconds of each part of the read and the size of the
    range re-checked (a slow pass's log says which part it was)."""
    costs = {} if costs is None else costs
    records: list[dict[str, Any]] = []
    for kind, (model, _, current_only) in RANK_TABLES.items():
        where, params = "group_id = %s AND NOT stale", [group.pk]
        if current_only:
            where, params = f"{where} AND generation = %s", [group.pk, group.generation]
        floor, seen = after.get(kind, 0), skip.get(kind) or set()
        high = max(seen, default=floor)
        # Between the floor and the highest id applied, only rows not applied yet (a
        # writer's that was in flight). Rows are never updated and `seen` came through this
        # filter or a stricter one, so when the range holds as many rows as `seen` it holds
        # `seen` and nothing late: one count in SQL, not 16k ids to Python after a stepped
        # pass (~75 ms of an idle pass at 16k ranks). Otherwise the ids, compared here, not
        # in SQL (a 16k-id NOT IN costs more than the read).
        rows: list[dict[str, Any]] = []
        t = time.perf_counter()
        if high > floor:
            table = model._meta.db_table
            span = f"FROM {table} WHERE {where} AND id > %s AND id <= %s"
            ((held,),) = _fetch(f"SELECT count(*) {span}", [*params, floor, high])
            costs["recheck rows"] = costs.get("recheck rows", 0) + held
            if held != len(seen):
                ids = _fetch(f"SELECT id {span}", [*params, floor, high])
                late = sorted({i for (i,) in ids} - seen)
                costs["late rows"] = costs.get("late rows", 0) + len(late)
                if late:
                    # ::bigint[]: psycopg sends ints as smallint[] or int[] by value, and a
                    # cross-type ANY is not hashed, so as a filter it scanned the array per
                    # row: 10.7 s for 14k late ids among 47k rows at 16k ranks.
                    rows = _kind_rows(
                        kind, f"{where} AND id = ANY(%s::bigint[])", [*params, late], node_names
                    )
        t = _cost(costs, "recheck s", t)
        # ORDER BY id LIMIT walks the primary key from the cursor: without it the planner
        # may take the group's (group, generation, ts) index and read every row of the group.
        new = _kind_rows(
            kind,
            f"{where} AND id > %s",
            [*params, high],
            node_names,
            f"ORDER BY id LIMIT {MAX_SINCE_ROWS}",
        )
        _cost(costs, "new s", t)
        if len(new) >= MAX_SINCE_ROWS:
            return None
        records += rows + new
    return _collective_ts(records)


def _cost(costs: dict[str, float], name: str, since: float) -> float:
    now = time.perf_counter()
    costs[name] = costs.get(name, 0.0) + now - since
    return now


def rank_table_heads() -> dict[str, int]:
    """The newest id of each per-rank table (0 when empty)."""
    heads: dict[str, int] = {}
    with connection.cursor() as cur:
        for kind, (model, _, _) in RANK_TABLES.items():
            cur.execute(f"SELECT max(id) FROM {model._meta.db_table}")  # noqa: S608 (our table)
            row = cur.fetchone()
            heads[kind] = int(row[0] or 0) if row else 0
    return heads


def writers_in_flight() -> frozenset[int]:
    """The transactions in progress now, other than this one (cluster-wide xids). A row
    whose id was drawn before a read but not visible to it belongs to one of these, so a
    live state's cursor passes an id only once every writer in flight at that read ended."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT x::text::bigint FROM pg_snapshot_xip(pg_current_snapshot()) AS x"
            " WHERE x IS DISTINCT FROM pg_current_xact_id_if_assigned()"
        )
        return frozenset(int(r[0]) for r in cur.fetchall())


def evidence_records(
    group: ConsistencyGroup, *, node_names: dict[int, str], now: datetime
) -> list[dict[str, Any]]:
    """The group's checkpoints, transitions, serving windows and probes: sized by events and
    workers, not by ranks x steps, so every pass reads them whole."""
    records: list[dict[str, Any]] = []
    ckpts = m.CheckpointRecord.objects.filter(group=group, ts__gte=now - HISTORY_WINDOW)
    records += _rows(
        ckpts,
        "checkpoint",
        [
            "generation",
            "checkpoint_id",
            "step",
            "phase",
            "manifest",
            "duration_ms",
            "detail",
            "data_cursor",
        ],
        node_names,
    )
    transitions = m.TransitionRecord.objects.filter(
        group=group, ts__gte=now - HISTORY_WINDOW, stale=False
    )
    records += _rows(
        transitions,
        "transition",
        [
            "generation",
            "from_state",
            "to_state",
            "reason",
            "restart_count",
            "world_size",
            "data_cursor",
            "model_version",
        ],
        node_names,
    )
    serving = (
        m.ServingWindow.objects.filter(group=group, ts__gte=now - EVENT_WINDOW)
        .order_by("worker", "-ts")
        .distinct("worker")
    )
    records += _rows(
        serving,
        "serving",
        [
            "generation",
            "worker",
            "model_version",
            "adapter_version",
            "kv_schema",
            "ready",
            "draining",
            "window",
        ],
        node_names,
    )
    # Correctness probes: compared across ranks at one step and over time.
    probes = m.ProbeRecord.objects.filter(
        group=group, generation=group.generation, stale=False, ts__gte=now - EVENT_WINDOW
    ).order_by("-ts")[:MAX_PROBE_ROWS]
    records += _rows(
        probes,
        "probe",
        ["generation", "probe", "rank", "worker", "step", "value", "checksum", "model_version"],
        node_names,
    )
    return records


def device_events(
    node_ids: set[int], *, node_names: dict[int, str], now: datetime
) -> list[dict[str, Any]]:
    """Device events of the last day on these nodes, as records."""
    return _node_rows(
        m.DeviceEvent,
        "device_event",
        ["gpu", "event", "code", "detail", "recovery_action"],
        "ts >= %s",
        [sorted(node_ids), now - HISTORY_WINDOW],
        node_names,
    )


def nodes_with_urgent_events(node_ids: set[int], *, since: datetime) -> set[int]:
    """Which of these nodes reported, since `since`, an event ingest diagnoses at once: a
    GPU's critical device event (Xid, GPU lost, DBE) or an urgent host event."""
    devices = m.DeviceEvent.objects.filter(
        node_id__in=node_ids, ts__gte=since, event__in=CRITICAL_EVENTS
    ).values_list("node_id", flat=True)
    hosts = m.HostEvent.objects.filter(
        node_id__in=node_ids, ts__gte=since, event__in=URGENT_HOST_EVENTS
    ).values_list("node_id", flat=True)
    return set(devices.distinct()) | set(hosts.distinct())


def contract_violations(group: ConsistencyGroup, now: datetime) -> list[dict[str, Any]]:
    """The group's contract violations of the last EVENT_WINDOW, oldest first."""
    return [
        {
            "kind": c.kind,
            "subject": c.subject,
            "evidence": c.evidence,
            "ts": c.ts,
            "generation": c.generation,
        }
        for c in m.ContractViolation.objects.filter(
            group=group, ts__gte=now - EVENT_WINDOW
        ).order_by("ts")
    ]


# -- host, network and kernel evidence ------------------------------------------
# Kernel events explain exits for as long as the stop lasts (a day, like device events);
# net events and the newest samples speak for the last EVENT_WINDOW only: a link that
# flapped an hour ago does not explain a collective that is slow now.
def host_records(
    node_ids: set[int], *, node_names: dict[int, str], now: datetime
) -> list[dict[str, Any]]:
    """Host events, net events, and the newest net sample per port and host sample per node
    of these nodes, as records of the wire contract (`node` is the node's name)."""
    ids = sorted(node_ids)
    records = _node_rows(
        m.HostEvent,
        "host_event",
        ["event", "device", "code", "pid", "comm", "severity"],
        "ts >= %s",
        [ids, now - HISTORY_WINDOW],
        node_names,
    )
    records += _node_rows(
        m.NetEvent,
        "net_event",
        ["port", "link", "event", "state", "rate_gbps", "prev_rate_gbps", "counters"],
        "ts >= %s",
        [ids, now - EVENT_WINDOW],
        node_names,
    )
    records += _node_rows(
        m.NetSample,
        "net_sample",
        ["port", "link", "state", "rate_gbps", "counters", "interval_s"],
        "ts >= %s",
        [ids, now - EVENT_WINDOW],
        node_names,
        distinct="node_id, port",
        tail="ORDER BY node_id, port, ts DESC",
    )
    records += _node_rows(
        m.HostSample,
        "host_sample",
        [
            "mem_some_avg10",
            "mem_full_avg10",
            "io_full_avg10",
            "swap_used_bytes",
            "swap_total_bytes",
            "d_state",
            "disks",
        ],
        "ts >= %s",
        [ids, now - EVENT_WINDOW],
        node_names,
        distinct="node_id",
        tail="ORDER BY node_id, ts DESC",
    )
    return records


def _node_rows(
    model: type[Any],
    kind: str,
    fields: list[str],
    where: str,
    params: list[Any],
    node_names: dict[int, str],
    *,
    distinct: str = "",
    tail: str = "ORDER BY id",
) -> list[dict[str, Any]]:
    """`_rows` of a node-scoped table (node_id = ANY(the first parameter) AND `where`), read
    in binary: a group's ~2k node ids were ~10 ms of Django's query compiling per query."""
    lead = f"DISTINCT ON ({distinct}) " if distinct else ""
    table = model._meta.db_table
    sql = f"SELECT {lead}ts, node_id, {_columns(fields)} FROM {table}"  # noqa: S608
    sql += f" WHERE node_id = ANY(%s::bigint[]) AND {where} {tail}"
    return _records(_fetch(sql, params), kind, fields, node_names, lead=("ts", "node"))


# -- recovery objectives and checkpoint advice ---------------------------------
ADVICE_WINDOW = timedelta(days=7)
MAX_ADVICE_ROWS = 5000


def checkpoint_history(group: ConsistencyGroup, *, now: datetime) -> list[dict[str, Any]]:
    """The group's checkpoint records of the last week (ts, checkpoint_id, phase,
    duration_ms), oldest first, bounded: what checkpoint-interval advice is computed from."""
    rows = (
        m.CheckpointRecord.objects.filter(group=group, ts__gte=now - ADVICE_WINDOW)
        .order_by("-ts")
        .values("ts", "checkpoint_id", "phase", "duration_ms")[:MAX_ADVICE_ROWS]
    )
    return list(reversed(list(rows)))


def advice_transitions(group: ConsistencyGroup, *, now: datetime) -> list[dict[str, Any]]:
    """The group's transitions of the last week (ts, to_state), oldest first, bounded."""
    rows = (
        m.TransitionRecord.objects.filter(group=group, ts__gte=now - ADVICE_WINDOW, stale=False)
        .order_by("-ts")
        .values("ts", "to_state")[:MAX_ADVICE_ROWS]
    )
    return list(reversed(list(rows)))


# -- recovery costs and the reliability record (console.queries.recovery) -----------------
# An interruption's records lie within this much of its first evidence: the failed
# generation's steps since its checkpoint before it, the restart and redone work after it.
RECOVERY_WINDOW = timedelta(hours=6)
# The ranks of one synchronous job report the same step within this of each other (step
# time, delivery and clock skew): the margin of a time bound derived from one rank's row.
STEP_SKEW = timedelta(minutes=2)
# A checkpoint's first record follows the step it saved within this (an asynchronous
# save's first record is its staging, not its upload's commit).
CHECKPOINT_LAG = timedelta(minutes=15)
_NON_FINITE = [float("nan"), float("inf"), float("-inf")]


def recovery_transitions(group: ConsistencyGroup, since: datetime) -> list[dict[str, Any]]:
    """Transitions from `since` on, oldest first (stale writers excluded), bounded."""
    return list(
        m.TransitionRecord.objects.filter(
            group=group, stale=False, ts__gte=since, ts__lt=since + RECOVERY_WINDOW
        )
        .order_by("ts")
        .values("ts", "generation", "from_state", "to_state", "world_size", "data_cursor")[:200]
    )


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


def checkpoints_at_step(group: ConsistencyGroup, step: int) -> list[dict[str, Any]]:
    return list(
        m.CheckpointRecord.objects.filter(group=group, step=step)
        .order_by("ts")
        .values("ts", "checkpoint_id", "step", "phase", "data_cursor")[:50]
    )


def tokens_by_group_day(since: datetime, until: datetime) -> dict[tuple[str, str], int]:
    """Tokens per (group name, UTC day) from the minute rollups (ingest.rollups)."""
    rows = (
        m.StepRollup.objects.filter(minute__gte=since, minute__lt=until)
        .annotate(day=TruncDate("minute", tzinfo=UTC))
        .values("group__name", "day")
        .annotate(tokens=Sum("tokens"))
    )
    return {(r["group__name"], r["day"].isoformat()): int(r["tokens"] or 0) for r in rows}


# The minute rollup recomputes closed minutes a little after they close; minutes this
# recent are read from raw samples too (a minute counted twice is one minute: max).
EXPOSURE_RAW_TAIL = timedelta(minutes=5)
_EXPOSURE_SQL = """
WITH minutes AS (
    SELECT node_id, minute, gpus FROM ingest_devicerollup
    WHERE minute >= %(since)s AND minute < %(until)s
    UNION ALL
    SELECT node_id, date_trunc('minute', ts), count(DISTINCT gpu) FROM ingest_devicesample
    WHERE ts >= %(tail)s AND ts < %(until)s
    GROUP BY 1, 2
), per AS (
    SELECT node_id, minute, max(gpus) AS gpus FROM minutes GROUP BY node_id, minute
)
SELECT n.name, count(*), sum(per.gpus), (SELECT count(DISTINCT minute) FROM per)
FROM per JOIN console_node n ON n.id = per.node_id
GROUP BY n.name
"""


def exposure(since: datetime, until: datetime) -> dict[str, Any]:
    """What reported in [since, until): minutes in which any node sent a GPU sample, and
    per node its minutes and GPU-minutes (the minute rollups, raw samples for the tail)."""
    params = {"since": since, "until": until, "tail": max(since, until - EXPOSURE_RAW_TAIL)}
    with connection.cursor() as cur:
        cur.execute(_EXPOSURE_SQL, params)
        rows = cur.fetchall()
    return {
        "minutes": int(rows[0][3]) if rows else 0,
        "nodes": {name: (int(minutes), int(gpus or 0)) for name, minutes, gpus, _ in rows},
    }


def groups_first_transition(group_ids: list[int], since: datetime) -> dict[int, datetime]:
    """Each group's first transition at or after `since` (when it began running there)."""
    rows = (
        m.TransitionRecord.objects.filter(group_id__in=group_ids, ts__gte=since)
        .values("group_id")
        .annotate(first=Min("ts"))
    )
    return {r["group_id"]: r["first"] for r in rows}


# -- correlation: the one step or request an incident is about ------------------
TRACE_NEIGHBOURS = 8  # ranks either side of the culprit a step trace lists (its node, its TP group)
TRACE_SPAN = timedelta(minutes=10)  # one logical step's records lie within this of each other


_LAUNCHER_ROOT_FIELDS = (
    "group_id",
    "generation",
    "rank",
    "ts",
    "exit_code",
    "signal",
    "reason",
    "error_type",
    "message",
    "launcher_root_cause",
)


def generation_endings(
    group: ConsistencyGroup, *, after: int, since: datetime
) -> list[dict[str, Any]]:
    """The group's generations from `after` up to (not including) its current one that
    ended at or after `since`, oldest first: {generation, ended_at: the first transition of
    a later generation, state: what the generation's own last transition before that left
    it in ("running" if none)}. One query for the ends, one per ended generation."""
    if group.generation <= after:
        return []
    firsts = dict(
        m.TransitionRecord.objects.filter(group=group, generation__gt=after, stale=False)
        .values("generation")
        .annotate(first=Min("ts"))
        .values_list("generation", "first")
    )
    out: list[dict[str, Any]] = []
    for generation in range(after, group.generation):
        later = [ts for g, ts in firsts.items() if g > generation]
        if not later or min(later) < since:
            continue
        ended_at = min(later)
        last = (
            m.TransitionRecord.objects.filter(
                group=group, generation=generation, stale=False, ts__lte=ended_at
            )
            .order_by("-ts")
            .values_list("to_state", flat=True)
            .first()
        )
        out.append({"generation": generation, "ended_at": ended_at, "state": last or "running"})
    return out


def launcher_root_causes(keys: set[tuple[int, int]]) -> dict[tuple[int, int], dict[str, Any]]:
    """(group id, generation) -> the exit a launcher named that generation's root cause
    (torchrun's first observed failure), the earliest where several launcher agents (one
    per node) each named one. One query for any number of keys."""
    if not keys:
        return {}
    which = Q()
    for gid, generation in sorted(keys):
        which |= Q(group_id=gid, generation=generation)
    rows = (
        m.ProcessRecord.objects.filter(which, event="exited", launcher_root_cause__isnull=False)
        .order_by("ts", "rank")
        .values(*_LAUNCHER_ROOT_FIELDS)
    )
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for row in rows:
        out.setdefault((row["group_id"], row["generation"]), row)
    return out


def step_trace(
    group: ConsistencyGroup, *, generation: int, rank: int, around: datetime
) -> dict[str, Any] | None:
    """The step a rank's incident is about, end to end: that step's record (duration and
    phases: input, compute, collective, optimizer, checkpoint) and its collective calls on
    the culprit and its neighbouring ranks, joined by `step_id`, and any checkpoint of it.

    The step is the one the culprit's first unfinished collective belongs to (where it
    stopped); without one, the step after its newest step if any neighbour reached it (the
    step it was in when it died or hung), else its newest step. None: the rank reported
    nothing near `around`. Bounded: the culprit's newest rows within HISTORY_WINDOW, then
    TRACE_SPAN around them for 2 x TRACE_NEIGHBOURS + 1 ranks, whatever the world size.
    """
    base = m.StepRecord.objects.filter(group=group, generation=generation, stale=False)
    hi = around + TRACE_SPAN
    newest = (
        base.filter(rank=rank, ts__gte=around - HISTORY_WINDOW, ts__lte=hi)
        .order_by("-ts")
        .values("ts", "step")
        .first()
    )
    windows_qs = m.CollectiveWindow.objects.filter(group=group, generation=generation, stale=False)
    own = (
        windows_qs.filter(rank=rank, ts__gte=around - HISTORY_WINDOW, ts__lte=hi)
        .order_by("-ts")
        .values("ts")
        .first()
    )
    refs = [r["ts"] for r in (newest, own) if r]
    if not refs:
        return None
    lo, hi = max(refs) - TRACE_SPAN, min(hi, max(refs) + TRACE_SPAN)
    shown = list(range(max(0, rank - TRACE_NEIGHBOURS), rank + TRACE_NEIGHBOURS + 1))
    windows: dict[int, list[dict[str, Any]]] = {
        w["rank"]: w["entries"] or []
        for w in windows_qs.filter(rank__in=shown, ts__gte=lo, ts__lte=hi)
        .order_by("rank", "-ts")
        .distinct("rank")
        .values("rank", "entries")
    }

    def calls_of(step: int) -> dict[int, list[dict[str, Any]]]:
        wanted = step_id(generation, step)
        return {
            r: [e for e in entries if e.get("step_id") == wanted]
            for r, entries in windows.items()
            if any(e.get("step_id") == wanted for e in entries)
        }

    step, source = None, ""
    for entry in windows.get(rank, []):
        parsed = parse_step_id(entry.get("step_id"))
        if entry.get("state") != "completed" and parsed and parsed[0] == generation:
            step, source = parsed[1], "its unfinished collective"
            break
    steps = base.filter(rank__in=shown, ts__gte=lo, ts__lte=hi)
    if step is None and newest is not None:
        after = newest["step"] + 1
        if calls_of(after) or steps.filter(step=after).exists():
            step, source = after, "the step after its last reported one"
        else:
            step, source = newest["step"], "its last reported step"
    if step is None:
        return None
    calls = calls_of(step)
    rows = {
        r["rank"]: r
        for r in steps.filter(step=step).values("rank", "ts", "duration_ms", "phases", "loss")
    }
    ranks = []
    for r in shown:
        if r not in rows and r not in calls and r != rank:
            continue
        row = rows.get(r)
        ranks.append(
            {
                "rank": r,
                "culprit": r == rank,
                "committed": row is not None,
                "duration_ms": row["duration_ms"] if row else None,
                "phases": sorted((row["phases"] or {}).items()) if row else [],
                "calls": [
                    {k: e.get(k) for k in ("op", "pg", "seq", "state", "numel", "dtype", "peer")}
                    for e in calls.get(r, [])
                ],
            }
        )
    checkpoints = list(
        m.CheckpointRecord.objects.filter(
            group=group, generation=generation, step=step, ts__gte=lo, ts__lte=hi
        )
        .order_by("ts")
        .values("checkpoint_id", "phase", "ts")[:20]
    )
    return {
        "step_id": step_id(generation, step),
        "step": step,
        "rank": rank,
        "source": source,
        "world_size": group.world_size,
        "ranks": ranks,
        "checkpoints": checkpoints,
    }


def request_trace(
    group: ConsistencyGroup, *, worker: str, around: datetime
) -> dict[str, Any] | None:
    """The serving window a worker's incident is about: its request-id range (the requests
    that were on the worker, end to end), versions and counters. None: no window near."""
    row = (
        m.ServingWindow.objects.filter(
            group=group, worker=worker, ts__gte=around - HISTORY_WINDOW, ts__lte=around + TRACE_SPAN
        )
        .order_by("-ts")
        .values("ts", "window", "model_version", "adapter_version", "kv_schema")
        .first()
    )
    if row is None:
        return None
    window = row["window"] or {}
    return {
        "worker": worker,
        "ts": row["ts"],
        "first_request_id": window.get("first_request_id"),
        "last_request_id": window.get("last_request_id"),
        "requests": window.get("requests"),
        "active": window.get("active"),
        "exited": bool(window.get("exited")),
        "model_version": row["model_version"],
        "adapter_version": row["adapter_version"],
        "kv_schema": row["kv_schema"],
    }


# -- what a node's conditions read (console.actions.conditions) --------------------------
def serving_nodes(group_ids: list[int], *, since: datetime) -> set[int]:
    """The nodes a worker of these serving groups reported from since `since`."""
    if not group_ids:
        return set()
    return set(
        m.ServingWindow.objects.filter(group_id__in=group_ids, ts__gte=since)
        .values_list("node_id", flat=True)
        .distinct()
    )


def port_state_since(node_id: int, port: str, since: datetime) -> str | None:
    """The newest state one port of a node reported after `since` (a sample or an event),
    or None when it reported none."""
    sample = (
        m.NetSample.objects.filter(node_id=node_id, port=port, ts__gt=since)
        .order_by("-ts")
        .values_list("ts", "state")
        .first()
    )
    event = (
        m.NetEvent.objects.filter(node_id=node_id, port=port, ts__gt=since)
        .order_by("-ts")
        .values_list("ts", "state")
        .first()
    )
    newest = max((r for r in (sample, event) if r is not None), default=None, key=lambda r: r[0])
    return None if newest is None else (newest[1] or "")


def disks_since(node_id: int, since: datetime) -> list[dict[str, Any]] | None:
    """The checkpoint disks of a node's newest host sample after `since`, or None."""
    row = (
        m.HostSample.objects.filter(node_id=node_id, ts__gt=since)
        .order_by("-ts")
        .values_list("disks", flat=True)
        .first()
    )
    return None if row is None else list(row or [])
