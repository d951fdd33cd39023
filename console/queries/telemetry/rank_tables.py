"""Reads of the per-rank tables a live diagnosis follows by id: steps, collective windows,
process-groups reports and process events.

Each query is bounded by time and, where a table grows per rank, takes just the newest row
per rank (DISTINCT ON), so a 16k-rank group costs a handful of indexed queries, not one
per rank (console.snapshots full and incremental passes). Must not write.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Model

from console.models import ConsistencyGroup
from console.queries import binary
from console.queries.telemetry.shared import HISTORY_WINDOW, columns, decode_rows
from ingest import models as m

STEP_WINDOW = timedelta(minutes=10)
MAX_STEP_ROWS = 200_000
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
# The record kinds whose tables this module reads (each kind has a reader: tests/server/ingest/
# test_record_kinds.py).
READS: dict[str, type[Model]] = {kind: table[0] for kind, table in RANK_TABLES.items()}


def _collective_ts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for row in rows:
        if row["kind"] == "collective":
            for entry in row["entries"]:
                if entry.get("started_ts"):
                    entry["started_ts"] = datetime.fromisoformat(entry["started_ts"])
    return rows


_fetch = binary.fetch


def _select(kind: str, fields: list[str], newest_per_rank: bool = False) -> str:
    """The column list of a per-rank read: id, ts, node id, then `fields` (jsonb as text);
    `newest_per_rank`: DISTINCT ON (rank), for a read ordered by rank, newest first."""
    distinct = "DISTINCT ON (rank) " if newest_per_rank else ""
    table = RANK_TABLES[kind][0]._meta.db_table
    return f"SELECT {distinct}id, ts, node_id, {columns(fields)} FROM {table}"  # noqa: S608


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
    return decode_rows(_fetch(sql, params), kind, fields, node_names)


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
