"""Load one group's recent state as contract-shaped dicts and build its diagnosis snapshot.

The engine is pure; this is its only database adapter. Telemetry (steps, collectives,
exits, checkpoints, transitions, serving windows, device events, contract violations) is
read through `console.queries.telemetry`, bounded by time and newest-per-rank; the live
GPU samples and node liveness come from the console's own tables. Must not write.

The per-rank part (steps, collective windows, process-groups reports, processes: ranks x
steps rows) is kept between passes in this worker's memory as a `LiveGroup` per group and
advanced by the rows whose id passed its cursor since the last pass, so a pass reads and
re-judges what changed, not the world. A state absent (new worker, restart, evicted),
of another generation, older than `REBUILD_AFTER` or asked for an earlier `now` is rebuilt
from a full read; docs/diagnosis.md ("Incremental passes") has the cursor's argument.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from console import collector
from console.diagnosis import GroupSnapshot, build_snapshot
from console.diagnosis.findings import gpu_subject, node_subject
from console.diagnosis.live import LiveGroup, Retention
from console.models import ConsistencyGroup, Node
from console.queries import binary
from console.queries import objectives as group_objectives
from console.queries.telemetry import group_evidence, lifecycle, node_evidence, rank_tables, shared

log = logging.getLogger(__name__)

# A full read now and then heals what a cursor cannot see (a writer that drew an id before
# a read and took its transaction id after it: a microsecond race) and re-fits the per-rank
# step cap to the group's size.
REBUILD_AFTER = timedelta(minutes=10)
MAX_GROUPS = 16  # live states kept per worker process (LRU)
# ...and at most this many ranks in all (the least recently used go first, never the one
# just used): a 16k-rank state is ~400 MB of RSS (bench/detect.py --ranks 16384), so the
# worker's memory cap (FAULTLINE_WORKER_MAX_MEMORY_MB) must hold this many ranks' worth,
# or the pool process is replaced after every pass and each pass is a full read.
MAX_LIVE_RANKS = 32_768
WRITERS_WAIT_S = 2.0  # a full read waits this long at most for writers in flight
MAX_PENDING = 600  # reads whose writers are still in flight; past it, rebuild
_US = timedelta(microseconds=1)


@dataclass
class _Cursor:
    """Per-rank-table read position: every row with id <= floor[kind] is applied; ids above
    it already applied are in `seen`; `pending` holds (writers in flight at a read, the
    highest id that read saw) until those writers end."""

    floor: dict[str, int]
    seen: dict[str, set[int]] = field(default_factory=dict)
    pending: list[tuple[frozenset[int], dict[str, int]]] = field(default_factory=list)


@dataclass
class _Entry:
    key: tuple[int, int]  # (group pk, generation)
    live: LiveGroup
    cursor: _Cursor
    built: datetime
    # The non-rank records of the last pass: a record equal to the one at its place then
    # is handed on as that very dict (`_same_dicts`).
    records: list[dict[str, Any]] = field(default_factory=list)


_states: OrderedDict[str, _Entry] = OrderedDict()
_lock = threading.Lock()
# The last pass's figures for the benchmark: "full" or "incremental", rows read, ranks rebuilt.
last_pass: dict[str, Any] = {}
# ...and where its load's time went, seconds by part (the slow-pass log prints them): at 16k
# ranks one full read took 6 s on a quiet box and 47 s on a loaded one, and "snapshot" alone
# could not say whether the garbage collector, the writers' wait or the read was to blame.
last_parts: dict[str, float] = {}
# ...and an incremental read's own parts (rank_tables.rank_records_since's costs): a 16k pass
# read 98k rows in 10 s while its neighbours read 33-65k in under 3, and only these said why.
last_read: dict[str, float] = {}


def _part(name: str, since: float) -> float:
    """Add the time since `since` to `name`; returns now (perf_counter)."""
    now = time.perf_counter()
    last_parts[name] = last_parts.get(name, 0.0) + now - since
    return now


def forget(group_name: str | None = None) -> None:
    """Drop one group's live state (or all): the next pass is a full rebuild."""
    with _lock:
        if group_name is None:
            _states.clear()
            _device_cache.clear()
        else:
            _states.pop(group_name, None)


def memo(group_name: str) -> dict[str, Any] | None:
    """The engine's per-rank memo of the group's live state (None without one)."""
    with _lock:
        entry = _states.get(group_name)
    return None if entry is None else entry.live.memo


def _node_ids(group: ConsistencyGroup) -> set[int]:
    """The nodes the group's ranks run on (distinct in SQL: 16k rank rows, ~2k nodes)."""
    ids = group.ranks.order_by().values_list("node_id", flat=True).distinct()
    return set(ids) - {None}


class NodeRow(NamedTuple):
    """What a pass reads of a node: ~2k ORM instances a pass at 16k ranks cost ~40 ms."""

    pk: int
    name: str
    pool: str
    last_seen: datetime | None


_NODES = "SELECT id, name, pool, last_seen FROM console_node WHERE id = ANY(%s::bigint[])"
_GROUP_NODES = (
    "SELECT id, name, pool, last_seen FROM console_node WHERE id IN"
    " (SELECT node_id FROM console_rank WHERE group_id = %s AND node_id IS NOT NULL)"
)


def _nodes(sql: str, params: list[Any]) -> dict[int, NodeRow]:
    return {row[0]: NodeRow(*row) for row in binary.fetch(sql, params)}


def _inputs(
    group: ConsistencyGroup, nodes: dict[int, NodeRow], now: datetime
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The non-rank records of `nodes` and the group, and build_snapshot's other arguments."""
    names = {pk: n.name for pk, n in nodes.items()}
    records = group_evidence.evidence_records(group, node_names=names, now=now)
    records += _device_records(set(nodes), names, now)
    objectives = group_objectives.effective(group, list(nodes.values()))
    # A launcher's or pool's goodput SLO applies to the serving SLO too (an operator's
    # group.slo wins: effective() reads it first).
    goodput = objectives.get("goodput_target")
    slo = {**group.slo, **({"goodput_target": goodput} if goodput is not None else {})}
    kwargs: dict[str, Any] = {
        "state": group.state,
        "nodes": {n.name: n.last_seen for n in nodes.values()},
        "contract_findings": group_evidence.contract_violations(group, now),
        "now": now,
        "slo": slo,
        "objectives": objectives,
    }
    return records, kwargs


def load_located(
    *, group_name: str, nodes: set[str], since: datetime, now: datetime
) -> tuple[GroupSnapshot, frozenset[str]] | None:
    """The group's snapshot restricted to `nodes` and its other nodes with an urgent event
    since `since` (their GPUs, host evidence and ranks; the group's own evidence whole), and
    the subjects located there (those GPUs and nodes). None: no such node, or no group.

    A full read of just those ranks, no live state: the urgent lane's process keeps none
    (its runs are rare), and at 16k ranks its first full read took seconds."""
    group = ConsistencyGroup.objects.filter(name=group_name).first()
    if group is None:
        return None
    all_ids = _node_ids(group)
    scope = node_evidence.nodes_with_urgent_events(all_ids, since=since)
    if nodes:
        named = Node.objects.filter(name__in=nodes, pk__in=all_ids).values_list("pk", flat=True)
        scope |= set(named)
    if not scope:
        return None
    located = _nodes(_NODES, [sorted(scope)])
    names = {pk: n.name for pk, n in located.items()}
    records, kwargs = _inputs(group, located, now)
    ranks = sorted(group.ranks.filter(node_id__in=scope).values_list("rank", flat=True))
    records += rank_tables.rank_records(group, node_names=names, now=now, ranks=ranks)
    last_pass.update(mode="located", rows=len(records), touched=len(ranks))
    snap = build_snapshot(group=group.name, generation=group.generation, **kwargs, records=records)
    subjects = frozenset(
        {gpu_subject(d.gpu) for d in snap.devices} | {node_subject(n) for n in names.values()}
    )
    return snap, subjects


# A generation that ended (its launcher restarted the group) is judged once as of its end
# when no pass saw that end: torchrun restarts within a second, before the pass its
# failure's batch scheduled has read it. Only recent ends, and the last few of them.
ENDINGS_WINDOW = timedelta(minutes=10)
MAX_ENDINGS = 3
ENDED_JUDGED = "ended_judged"  # group.summary key: the newest generation judged at its end


class Ending(NamedTuple):
    generation: int
    ended_at: datetime
    state: str  # what the generation's own last transition left it in


def unjudged_endings(*, group_name: str, now: datetime) -> list[Ending]:
    """The group's generations that ended since a pass last judged one at its end (none
    judged yet: those that ended within ENDINGS_WINDOW), the last MAX_ENDINGS, oldest
    first. One small read when the generation did not move."""
    row = (
        ConsistencyGroup.objects.filter(name=group_name)
        .values_list("pk", "generation", f"summary__{ENDED_JUDGED}")
        .first()
    )
    if row is None:
        return []
    pk, generation, judged = row
    after = max(int(judged) + 1 if isinstance(judged, int) else 0, generation - MAX_ENDINGS)
    if generation <= after:
        return []
    group = ConsistencyGroup(pk=pk, name=group_name, generation=generation)
    ends = lifecycle.generation_endings(group, after=after, since=now - ENDINGS_WINDOW)
    return [Ending(e["generation"], e["ended_at"], e["state"]) for e in ends]


def load_ended(*, group_name: str, ending: Ending) -> GroupSnapshot | None:
    """The ended generation's snapshot as of its end: a full read of its ranks (no live
    state: this is one pass, once), its state as its own transitions left it, and nothing
    stamped after its end (the next generation's records)."""
    group = ConsistencyGroup.objects.filter(name=group_name).first()
    if group is None:
        return None
    now = ending.ended_at
    nodes = _nodes(_GROUP_NODES, [group.pk])
    names = {pk: n.name for pk, n in nodes.items()}
    records, kwargs = _inputs(group, nodes, now)
    records += rank_tables.rank_records(
        group, node_names=names, now=now, generation=ending.generation
    )
    records = [r for r in records if r["ts"] < now]
    kwargs["state"] = ending.state
    last_pass.update(mode="ended-generation", rows=len(records), touched=None)
    return build_snapshot(group=group.name, generation=ending.generation, **kwargs, records=records)


def load(*, group_name: str, now: datetime, incremental: bool = True) -> GroupSnapshot | None:
    last_parts.clear()
    last_read.clear()
    t = time.perf_counter()
    group = ConsistencyGroup.objects.filter(name=group_name).first()
    if group is None:
        forget(group_name)
        return None
    nodes = _nodes(_GROUP_NODES, [group.pk])
    names = {pk: n.name for pk, n in nodes.items()}
    records, kwargs = _inputs(group, nodes, now)
    t = _part("evidence", t)
    if not incremental:
        records += rank_tables.rank_records(group, node_names=names, now=now)
        last_pass.update(mode="full-snapshot", rows=len(records), touched=None)
        return build_snapshot(
            group=group.name, generation=group.generation, **kwargs, records=records
        )
    entry = _entry(group, names, now)
    t = time.perf_counter()
    records = entry.records = _same_dicts(entry.records, records)
    snap = entry.live.snapshot(records=records, **kwargs)
    _part("build", t)
    last_pass["touched"] = entry.live.touched
    return snap


def _same_dicts(before: list[dict[str, Any]], now: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`now`, with each record equal to the one at its place in `before` replaced by that
    very dict. The evidence reads (checkpoints, transitions, host, device events) make new
    dicts every pass; the live state keeps its non-rank build, and the engine its per-GPU
    and per-pass values, while the records are the very same dicts (LiveGroup._non_rank),
    so a pass between two steps need not build 16k GPUs' states again. Equal records give
    an equal snapshot: nothing read changes."""
    if not before:
        return now
    out = list(now)
    for i, (a, b) in enumerate(zip(before, now, strict=False)):  # == on dicts: in C
        if a is not b and a == b:
            out[i] = a
    return out


def _entry(group: ConsistencyGroup, names: dict[int, str], now: datetime) -> _Entry:
    """The group's live state advanced to now: from the rows since its cursor, or rebuilt."""
    key = (group.pk, group.generation)
    with _lock:
        entry = _states.get(group.name)
        if entry is not None:
            _states.move_to_end(group.name)
    fresh = (
        entry is not None
        and entry.key == key
        and now - entry.built < REBUILD_AFTER
        and (entry.live.last_now is None or now >= entry.live.last_now)
    )
    if entry is None or not fresh or not _advance(entry, group, names):
        entry = _rebuild(group, names, now)
    with _lock:
        _states[group.name] = entry
        _states.move_to_end(group.name)
        while len(_states) > MAX_GROUPS or (
            len(_states) > 1 and sum(len(e.live.ranks) for e in _states.values()) > MAX_LIVE_RANKS
        ):
            _states.popitem(last=False)
    return entry


def _rebuild(group: ConsistencyGroup, names: dict[int, str], now: datetime) -> _Entry:
    """A full read of the per-rank tables, with a cursor that starts at their heads."""
    # What passes froze since the last rebuild (console.collector) is collected here, once:
    # the old state of this group is about to become garbage anyway.
    t = time.perf_counter()
    collector.release()
    t = _part("gc", t)
    heads = rank_tables.rank_table_heads()
    # Rows at or below the heads may still be in flight: let those writers end first, so
    # the full read sees every one of them (ingest commits a batch in milliseconds).
    waiting = rank_tables.writers_in_flight()
    deadline = time.monotonic() + WRITERS_WAIT_S
    while waiting and time.monotonic() < deadline:
        time.sleep(0.005)
        waiting &= rank_tables.writers_in_flight()
    if waiting:
        log.warning(
            "diagnosis %s: %d writers still in flight at a full read", group.name, len(waiting)
        )
    t = _part("writers", t)
    rows = rank_tables.rank_records(group, node_names=names, now=now)
    t = _part("read", t)
    ranks = len({r["rank"] for r in rows})
    retention = Retention(
        step_window=rank_tables.STEP_WINDOW,
        step_cap=max(1, rank_tables.MAX_STEP_ROWS // max(ranks, 1)),
        history=shared.HISTORY_WINDOW,
    )
    live = LiveGroup(group=group.name, generation=group.generation, retention=retention)
    rows.sort(key=lambda r: r["id"])  # ties in ts: the order they were written
    live.apply(rows)
    seen: dict[str, set[int]] = {}
    for r in rows:
        if r["id"] > heads[r["kind"]]:
            seen.setdefault(r["kind"], set()).add(r["id"])
    _part("apply", t)
    last_pass.update(mode="full", rows=len(rows))
    return _Entry((group.pk, group.generation), live, _Cursor(floor=heads, seen=seen), now)


def _advance(entry: _Entry, group: ConsistencyGroup, names: dict[int, str]) -> bool:
    """Apply the rows written since the last pass, then move the cursor past the ids whose
    writers have all ended (a row's id is drawn before the row becomes visible)."""
    cur = entry.cursor
    t = time.perf_counter()
    before = rank_tables.writers_in_flight()
    rows = rank_tables.rank_records_since(
        group, node_names=names, after=cur.floor, skip=cur.seen, costs=last_read
    )
    t = _part("read", t)
    if rows is None or len(cur.pending) > MAX_PENDING:
        return False  # a flood since the last pass, or a writer in flight for minutes
    entry.live.apply(rows)
    high = dict(cur.floor)
    for kind, ids in cur.seen.items():
        high[kind] = max(high.get(kind, 0), *ids) if ids else high.get(kind, 0)
    for r in rows:
        cur.seen.setdefault(r["kind"], set()).add(r["id"])
        high[r["kind"]] = max(high.get(r["kind"], 0), r["id"])
    # A read's writers in flight that were no longer in flight before this read: every row
    # up to that read's highest id was visible to this read, so the floor may pass it.
    keep: list[tuple[frozenset[int], dict[str, int]]] = []
    for writers, mark in cur.pending:
        if writers & before:
            keep.append((writers, mark))
        else:
            for kind, top in mark.items():
                cur.floor[kind] = max(cur.floor.get(kind, 0), top)
    keep.append((rank_tables.writers_in_flight(), high))
    cur.pending = keep
    for kind, ids in cur.seen.items():
        floor = cur.floor.get(kind, 0)
        cur.seen[kind] = {i for i in ids if i > floor}
    _part("apply", t)
    last_pass.update(mode="incremental", rows=len(rows))
    return True


def _repaired_at(
    node_ids: set[int], names: dict[int, str]
) -> dict[tuple[str | None, str], datetime]:
    """(node, GPU uuid, or "" for the whole node) -> its newest repair (a reboot, a GPU
    reset: fleet health's `repair` events). A device event from before its hardware's
    repair is history: it must not be the root cause of a job placed on the repaired GPU
    (it would be paged again and the node drained again)."""
    rows = binary.fetch(REPAIRS, [sorted(node_ids)])
    return {(names.get(node), gpu): newest for node, gpu, newest in rows}


REPAIRS = (
    "SELECT node_id, gpu, max(at) FROM console_healthevent"
    " WHERE node_id = ANY(%s::bigint[]) AND kind = 'repair' GROUP BY node_id, gpu"
)


# Newest-sample records of GPUs, shared by every group's passes in this worker: id ->
# ((node id, last_seen in microseconds, node name), the record, {} without a sample). A
# GPU's row is re-read only when that key changed: ingest sets last_sample and last_seen
# together in one upsert (ingest/store/live_state.py), so an unchanged key means an
# unchanged sample. Comparing per row (not a time cursor) misses no late commit and no
# replayed spool.
_DeviceKey = tuple[int, int, str | None, str]
_device_cache: dict[int, tuple[_DeviceKey, dict[str, Any]]] = {}
MAX_CACHED_DEVICES = 262_144  # past it (a fleet bigger than planned) start over
DEVICE_VERSIONS = (
    "SELECT id, node_id, (extract(epoch FROM last_seen) * 1000000)::bigint, uuid"
    " FROM console_device WHERE node_id = ANY(%s::bigint[])"
)
DEVICE_SAMPLES = (
    "SELECT id, node_id, uuid, last_sample::text, last_seen FROM console_device"
    " WHERE id = ANY(%s::bigint[]) AND node_id = ANY(%s::bigint[])"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _device_records(node_ids: set[int], names: dict[int, str], now: datetime) -> list[dict]:
    """Newest sample per GPU comes from Device.last_sample (kept live by ingest).

    At 16k GPUs decoding every `last_sample` each pass cost ~0.5-1 s (docs/performance.md);
    this reads (id, node, last_seen) of each GPU and decodes only the rows that changed."""
    versions: list[tuple[Any, ...]] = []
    if node_ids:
        versions = binary.fetch(DEVICE_VERSIONS, [sorted(node_ids)])
    with _lock:
        if len(_device_cache) > MAX_CACHED_DEVICES:
            _device_cache.clear()
        cached = dict(_device_cache)  # a consistent view; other threads may add rows
    stale = []
    for pk, node, seen, uuid in versions:
        hit = cached.get(pk)
        if seen is None or hit is None or hit[0] != (node, seen, names.get(node), uuid):
            stale.append(pk)
    if stale:
        fresh: dict[int, tuple[_DeviceKey, dict[str, Any]]] = {}
        # Every GPU's row changes at each of its node's batches (a live fleet: every 1-5 s),
        # so at 16k GPUs this is most GPUs every pass: read in binary (console.queries.binary).
        rows = binary.fetch(DEVICE_SAMPLES, [stale, sorted(node_ids)])
        for pk, node, uuid, raw, last_seen in rows:
            last_sample = binary.json.decode(raw) if raw else {}
            record = _sample_record(uuid, names.get(node), last_sample, last_seen or now)
            if last_seen is None:  # its ts is `now`: good for this pass only
                cached[pk] = ((node, -1, names.get(node), uuid), record)
                continue
            key = (node, (last_seen - _EPOCH) // _US, names.get(node), uuid)
            fresh[pk] = (key, record)
        with _lock:
            _device_cache.update(fresh)
        cached.update(fresh)
    out: list[dict[str, Any]] = []
    for pk, *_ in versions:
        hit = cached.get(pk)
        if hit is not None and hit[1]:
            out.append(hit[1])
    repaired = _repaired_at(node_ids, names)
    for event in node_evidence.device_events(node_ids, node_names=names, now=now):
        node = event["node"]
        since = [t for t in (repaired.get((node, "")), repaired.get((node, event["gpu"]))) if t]
        if not since or event["ts"] >= max(since):
            out.append(event)
    out += node_evidence.host_records(node_ids, node_names=names, now=now)
    return out


def _sample_record(
    uuid: str, node: str | None, last_sample: dict[str, Any], seen: datetime
) -> dict[str, Any]:
    """A `device_sample` record from a GPU's live row ({} when it has no sample yet), made
    from `last_sample` in place (it was decoded for this call alone)."""
    if not last_sample:
        return {}
    sample = last_sample  # its own "ts" (the agent's) is replaced by the row's last_seen
    throttled = sample.get("throttled")
    if isinstance(throttled, dict) and isinstance(throttled.get("ts"), str):
        try:
            sample["throttled"] = {**throttled, "ts": datetime.fromisoformat(throttled["ts"])}
        except ValueError:
            sample.pop("throttled")
    sample.update(kind="device_sample", ts=seen, node=node, gpu=uuid)
    return sample
