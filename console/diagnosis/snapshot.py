"""Frozen snapshot of one consistency group at a moment, and `build_snapshot`.

Owns the plain-data shape the rules read and the one translation from contract-shaped
record dicts (DESIGN §3 field names, `ts` as aware datetimes) into it. Must not do I/O,
read the clock or import Django: the database adapter and the tests both call it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from operator import is_, itemgetter
from typing import Any

from agents.protocol import HOST_KINDS  # the host, network and kernel evidence kinds

from console.diagnosis.records import (
    PHASES,
    CheckpointEvent,
    CheckpointState,
    CollectiveEntry,
    CollectiveWindow,
    ContractFinding,
    DeviceEvent,
    DeviceSample,
    DeviceState,
    DiskState,
    HostEvent,
    HostState,
    Manifest,
    NetEvent,
    NetPort,
    NodeState,
    Objectives,
    Phases,
    ProbeRecord,
    ProcessGroup,
    ProcessRecord,
    ServingSlo,
    ServingWindow,
    Shard,
    StepRecord,
    Transition,
    new_step,
)

__all__ = [
    "PHASES",
    "CheckpointEvent",
    "CheckpointState",
    "CollectiveEntry",
    "CollectiveWindow",
    "ContractFinding",
    "DeviceEvent",
    "DeviceSample",
    "DeviceState",
    "DiskState",
    "GroupSnapshot",
    "HostEvent",
    "HostState",
    "Manifest",
    "NetEvent",
    "NetPort",
    "NodeState",
    "Objectives",
    "Phases",
    "ProbeRecord",
    "ProcessGroup",
    "ProcessRecord",
    "RankState",
    "ServingWindow",
    "Shard",
    "StepRecord",
    "Transition",
    "build_snapshot",
]

RANK_KINDS = frozenset({"step", "process", "collective", "process_groups"})


@dataclass(frozen=True, slots=True)
class RankState:
    rank: int
    node: str | None
    gpu: str | None
    steps: tuple[StepRecord, ...] = ()  # oldest first, every generation
    processes: tuple[ProcessRecord, ...] = ()  # oldest first, every generation
    collective: CollectiveWindow | None = None  # latest window of the active generation
    generation: int = 0
    # A hint from the live state (console.diagnosis.live), never compared: (the steps of
    # this rank's previous state, how many of their oldest were dropped) when `steps` are
    # those less the dropped ones with newer ones appended. The engine's rank digest then
    # takes the slide as said instead of checking it step by step (rules/digest.py).
    slid_from: tuple[tuple[StepRecord, ...], int] | None = field(
        default=None, compare=False, repr=False
    )

    @property
    def current_steps(self) -> tuple[StepRecord, ...]:
        g = self.generation
        return tuple([s for s in self.steps if s.generation == g])  # a list: C-speed build

    @property
    def last_step(self) -> StepRecord | None:
        cur = self.current_steps
        return cur[-1] if cur else None

    @property
    def last_process(self) -> ProcessRecord | None:
        return self.processes[-1] if self.processes else None


_RANK_SET = tuple(
    RankState.__dict__[n].__set__
    for n in ("rank", "node", "gpu", "steps", "processes", "collective", "generation", "slid_from")
)


def new_rank_state(
    rank: int,
    node: str | None,
    gpu: str | None,
    steps: tuple[StepRecord, ...],
    processes: tuple[ProcessRecord, ...],
    collective: CollectiveWindow | None,
    generation: int,
    slid_from: tuple[tuple[StepRecord, ...], int] | None,
) -> RankState:
    """`RankState(...)` set through its slots (a live pass builds one per rank that stepped:
    16k at 16k ranks), as `records.new_step` does for a step."""
    r = object.__new__(RankState)
    a, b, c, d, e, f, g, h = _RANK_SET
    a(r, rank)
    b(r, node)
    c(r, gpu)
    d(r, steps)
    e(r, processes)
    f(r, collective)
    g(r, generation)
    h(r, slid_from)
    return r


@dataclass(frozen=True, slots=True)
class GroupSnapshot:
    group: str
    kind: str  # training | serving
    state: str
    generation: int
    taken_at: datetime
    ranks: tuple[RankState, ...] = ()  # sorted by rank
    nodes: tuple[NodeState, ...] = ()
    devices: tuple[DeviceState, ...] = ()
    checkpoints: tuple[CheckpointState, ...] = ()
    transitions: tuple[Transition, ...] = ()  # oldest first
    serving: tuple[ServingWindow, ...] = ()  # latest window per worker
    contract_findings: tuple[ContractFinding, ...] = ()
    slo: ServingSlo = field(default_factory=ServingSlo)
    probes: tuple[ProbeRecord, ...] = ()  # oldest first, every generation
    # Host, network and kernel evidence of the group's nodes, oldest first.
    host_events: tuple[HostEvent, ...] = ()
    net_events: tuple[NetEvent, ...] = ()
    net_ports: tuple[NetPort, ...] = ()  # newest sample per (node, port)
    hosts: tuple[HostState, ...] = ()  # newest host sample per node
    process_groups: tuple[ProcessGroup, ...] = ()  # active generation, sorted by pg
    objectives: Objectives = field(default_factory=Objectives)  # RPO, RTO, ...


def _num(value: Any) -> float | None:
    # Contract NaN/Infinity may still arrive as the strings "NaN"/"Infinity"; float()
    # parses both, so the fault the console exists to catch is never lost.
    return None if value is None else float(value)


def _manifest(raw: Mapping[str, Any] | None) -> Manifest | None:
    if raw is None:
        return None
    shards = tuple(
        Shard(path=s.get("path", ""), bytes=s.get("bytes"), sha256=s.get("sha256"))
        for s in raw.get("shards") or ()
    )
    return Manifest(shards=shards, total_bytes=raw.get("total_bytes"), format=raw.get("format"))


def _step(r: Mapping[str, Any]) -> StepRecord:
    # The hot path of build_snapshot and of a live pass (one call per step record):
    # positional arguments, bound lookups and `_num` spelled out keep a 16k-rank pass cheap.
    g = r.get
    ph = g("phases") or {}
    p = ph.get
    d, loss, gn, scale = g("duration_ms"), g("loss"), g("grad_norm"), g("loss_scale")
    c, co, i, ck, o = p("compute"), p("collective"), p("input"), p("checkpoint"), p("optimizer")
    mf, hf = g("model_flops"), g("hw_flops")
    return new_step(
        r["ts"],
        int(g("generation") or 0),
        int(r["step"]),
        None if d is None else float(d),
        None if c is None else float(c),
        None if co is None else float(co),
        None if i is None else float(i),
        None if ck is None else float(ck),
        None if o is None else float(o),
        g("tokens"),
        None if loss is None else float(loss),
        None if gn is None else float(gn),
        None if scale is None else float(scale),
        g("overflow"),
        g("data_cursor"),
        None if mf is None else float(mf),
        None if hf is None else float(hf),
    )


def _process(r: Mapping[str, Any]) -> ProcessRecord:
    return ProcessRecord(
        ts=r["ts"],
        generation=int(r.get("generation") or 0),
        event=r["event"],
        pid=r.get("pid"),
        gpu=r.get("gpu"),
        exit_code=r.get("exit_code"),
        signal=r.get("signal"),
        reason=r.get("reason"),
        error_type=r.get("error_type"),
        message=r.get("message"),
    )


def _window(r: Mapping[str, Any]) -> CollectiveWindow:
    entries = tuple(
        CollectiveEntry(
            seq=int(e["seq"]),
            pg=str(e.get("pg")),
            op=str(e.get("op")),
            numel=e.get("numel"),
            dtype=e.get("dtype"),
            state=e.get("state", "scheduled"),
            started_ts=e.get("started_ts"),
            out_numel=e.get("out_numel"),
            out_dtype=e.get("out_dtype"),
            in_splits=_ints(e.get("in_splits")),
            out_splits=_ints(e.get("out_splits")),
            peer=e.get("peer"),
            p2p_seq=e.get("p2p_seq"),
            coalesced=e.get("coalesced"),
        )
        for e in r.get("entries") or ()
    )
    return CollectiveWindow(ts=r["ts"], generation=int(r.get("generation") or 0), entries=entries)


def _ints(values: Any) -> tuple[int, ...] | None:
    return None if values is None else tuple(int(v) for v in values)


def rank_placement(
    gpu: str | None, older: str | None, node: str | None, dev_node: Mapping[str, str | None]
) -> str | None:
    """A rank's GPU: the one its current generation named; else the one an older
    generation named, while the rank names no other node than that GPU's (a restart in
    place whose start record was lost or stored ahead of its transition still runs there;
    a rank that moved to another node does not)."""
    if gpu is not None or older is None:
        return gpu
    return older if node is None or dev_node.get(older) == node else None


def _process_groups(reports: Mapping[int, Mapping[str, Any]]) -> tuple[ProcessGroup, ...]:
    """Merge each rank's `process_groups` report into one view per pg.

    Members are those most ranks reported (ties: the first in rank order); a report
    without `ranks` means the world (0 .. size-1).
    """
    seen: dict[str, list[tuple[int, tuple[int, ...], int, str | None]]] = defaultdict(list)
    for rank in sorted(reports):
        for g in reports[rank].get("groups") or ():
            size = int(g["size"])
            members = _ints(g.get("ranks")) or tuple(range(size))
            seen[str(g["pg"])].append((rank, members, size, g.get("desc")))
    out = []
    for pg in sorted(seen):
        rows = seen[pg]
        votes: dict[tuple[int, ...], int] = defaultdict(int)
        for _, members, _, _ in rows:
            votes[members] += 1
        best = max(votes.values())
        members = next(m for _, m, _, _ in rows if votes[m] == best)
        size = next(sz for _, m, sz, _ in rows if m == members)
        desc = next((d for _, m, _, d in rows if m == members and d), None)
        out.append(
            ProcessGroup(
                pg=pg,
                size=size,
                ranks=members,
                desc=desc,
                reported_by=tuple(rank for rank, _, _, _ in rows),
            )
        )
    return tuple(out)


def _sample(r: Mapping[str, Any]) -> DeviceSample:
    return DeviceSample(
        ts=r["ts"],
        temp_c=r.get("temp_c"),
        power_w=r.get("power_w"),
        sm_clock_mhz=r.get("sm_clock_mhz"),
        mem_clock_mhz=r.get("mem_clock_mhz"),
        util_pct=r.get("util_pct"),
        mem_used_bytes=r.get("mem_used_bytes"),
        ecc_sbe=r.get("ecc_sbe"),
        ecc_dbe=r.get("ecc_dbe"),
        retired_or_remapped_pending=r.get("retired_or_remapped_pending"),
        throttle_reasons=tuple(r.get("throttle_reasons") or ()),
        nvlink_errors=r.get("nvlink_errors"),
        pcie_replays=r.get("pcie_replays"),
        name=r.get("name"),
        mem_util_pct=_num(r.get("mem_util_pct")),
    )


def build_snapshot(
    *,
    group: str,
    generation: int,
    state: str,
    records: list[dict[str, Any]],
    nodes: dict[str, datetime | None],
    contract_findings: list[dict[str, Any]],
    now: datetime,
    slo: Mapping[str, Any] | None = None,
    objectives: Mapping[str, Any] | None = None,
    samples_memo: dict[int, tuple[Mapping[str, Any], DeviceSample]] | None = None,
    devices_memo: dict[str, DeviceMemo] | None = None,
) -> GroupSnapshot:
    """Build a `GroupSnapshot` from contract-shaped record dicts (DESIGN §3 names).

    Records of other groups are ignored; device records are kept (the caller passes
    the devices of the group's nodes). Unknown kinds are ignored: names may gain fields.
    `samples_memo` (kept by the caller between passes, e.g. `LiveGroup`) maps a
    device-sample dict's id to it and its parsed sample: a caller that passes the same,
    unmodified dict objects again (console.snapshots caches unchanged GPUs' records) has
    them parsed once, not per pass. It is left holding this call's samples only.
    `devices_memo` (same contract) maps a GPU to the device records it was built from and
    its `DeviceState`: a GPU whose records are the very same dicts, in the same order, as
    in the last call keeps its `DeviceState` object (at 16k GPUs, rebuilding every GPU's
    state each pass was most of an idle pass's snapshot). Left holding this call's GPUs.
    """
    recs = sorted(records, key=_ts_of)
    steps: dict[int, list[StepRecord]] = defaultdict(list)
    procs: dict[int, list[ProcessRecord]] = defaultdict(list)
    windows: dict[int, CollectiveWindow] = {}
    pg_reports: dict[int, Mapping[str, Any]] = {}
    rank_gens: dict[int, int] = {}
    rank_gpu: dict[int, str] = {}
    rank_node: dict[int, str] = {}
    older_gpu: dict[int, str] = {}  # the GPU an older generation of the rank named last
    dev_recs: dict[str, list[Mapping[str, Any]]] = {}  # GPU -> its records, oldest first
    ckpt: dict[str, list[CheckpointEvent]] = defaultdict(list)
    transitions: list[Transition] = []
    serving: dict[str, ServingWindow] = {}
    probes: list[ProbeRecord] = []
    heartbeats = dict(nodes)
    host_events: list[HostEvent] = []
    net_events: list[NetEvent] = []
    net_ports: dict[tuple[str | None, str], NetPort] = {}
    hosts: dict[str | None, HostState] = {}
    parsed: dict[int, tuple[Mapping[str, Any], DeviceSample]] = {}

    def parse(r: Mapping[str, Any]) -> DeviceSample:
        hit = None if samples_memo is None else samples_memo.get(id(r))
        return hit[1] if hit is not None and hit[0] is r else _sample(r)

    for r in recs:
        kind = r.get("kind")
        if kind in HOST_KINDS:
            _host_record(r, host_events, net_events, net_ports, hosts)
            continue
        if kind in DEVICE_KINDS:
            mine = dev_recs.get(r["gpu"])
            if mine is None:
                dev_recs[r["gpu"]] = [r]
            else:
                mine.append(r)
            continue
        if r.get("group") not in (None, group):
            continue
        gen = int(r.get("generation") or 0)
        if kind in RANK_KINDS:
            if r.get("rank") is None:
                continue  # validated upstream; a rankless per-rank record says nothing here
            rank = int(r["rank"])
            known = rank_gens.get(rank)
            if known is None or gen > known:
                rank_gens[rank] = gen
                if known is not None:
                    # A new generation may run elsewhere: where the rank ran before is not
                    # where it runs now until one of its new records says so (its old GPU
                    # stands only while the rank names no other node: rank_placement).
                    rank_node.pop(rank, None)
                    if rank in rank_gpu:
                        older_gpu[rank] = rank_gpu.pop(rank)
            current = gen == rank_gens[rank]
            if current and r.get("node"):
                rank_node[rank] = r["node"]
        if kind == "step":
            steps[rank].append(_step(r))
        elif kind == "process":
            procs[rank].append(_process(r))
            if r.get("gpu"):
                if current:
                    rank_gpu[rank] = r["gpu"]
                else:
                    older_gpu[rank] = r["gpu"]
        elif kind == "collective":
            if gen == generation:
                windows[rank] = _window(r)
        elif kind == "process_groups":
            if gen == generation:
                pg_reports[rank] = r
        elif kind == "checkpoint":
            ckpt[str(r["checkpoint_id"])].append(
                CheckpointEvent(
                    ts=r["ts"],
                    generation=gen,
                    phase=r["phase"],
                    step=r.get("step"),
                    manifest=_manifest(r.get("manifest")),
                    duration_ms=_num(r.get("duration_ms")),
                    detail=r.get("detail"),
                    data_cursor=r.get("data_cursor"),
                )
            )
        elif kind == "transition":
            transitions.append(
                Transition(
                    ts=r["ts"],
                    generation=gen,
                    from_state=r.get("from_state"),
                    to_state=r["to_state"],
                    reason=r.get("reason"),
                    restart_count=r.get("restart_count"),
                    world_size=r.get("world_size"),
                    data_cursor=r.get("data_cursor"),
                    model_version=r.get("model_version"),
                )
            )
        elif kind == "serving":
            serving[r["worker"]] = ServingWindow(
                ts=r["ts"],
                worker=r["worker"],
                model_version=r.get("model_version"),
                adapter_version=r.get("adapter_version"),
                kv_schema=r.get("kv_schema"),
                ready=r.get("ready"),
                draining=r.get("draining"),
                window=r.get("window") or {},
                node=r.get("node"),
            )
        elif kind == "probe":
            probes.append(
                ProbeRecord(
                    ts=r["ts"],
                    generation=gen,
                    probe=str(r["probe"]),
                    rank=r.get("rank"),
                    worker=r.get("worker"),
                    step=r.get("step"),
                    value=_num(r.get("value")),
                    checksum=r.get("checksum"),
                    model_version=r.get("model_version"),
                )
            )
        elif kind == "heartbeat" and r.get("node"):
            prev = heartbeats.get(r["node"])
            heartbeats[r["node"]] = r["ts"] if prev is None else max(prev, r["ts"])
    states: dict[str, DeviceState] = {}
    kept: dict[str, DeviceMemo] = {}
    for gpu, mine in dev_recs.items():
        hit = None if devices_memo is None else devices_memo.get(gpu)
        if hit is not None and len(hit[0]) == len(mine) and all(map(is_, hit[0], mine)):
            memo = hit
        else:
            memo = (mine, *_device(gpu, mine, parse))
        states[gpu] = memo[1]
        kept[gpu] = memo
        for raw, sample in memo[2]:
            parsed[id(raw)] = (raw, sample)  # holding the record keeps its id from reuse
    dev_node = {g: d.node for g, d in states.items()}
    # Ranks of the active generation; if it has reported nothing yet, nobody is
    # expected to make progress (a fresh generation is warming up).
    active = sorted(rk for rk, g in rank_gens.items() if g == generation)
    placed = {
        rk: rank_placement(rank_gpu.get(rk), older_gpu.get(rk), rank_node.get(rk), dev_node)
        for rk in active
    }
    ranks = tuple(
        RankState(
            rank=rk,
            node=rank_node.get(rk) or dev_node.get(placed[rk] or ""),
            gpu=placed[rk],
            steps=tuple(steps.get(rk, ())),
            processes=tuple(procs.get(rk, ())),
            collective=windows.get(rk),
            generation=generation,
        )
        for rk in active
    )
    if samples_memo is not None:
        samples_memo.clear()
        samples_memo.update(parsed)
    if devices_memo is not None:
        devices_memo.clear()
        devices_memo.update(kept)
    devices = tuple([states[g] for g in sorted(states)])
    checkpoints = tuple(
        CheckpointState(
            checkpoint_id=cid,
            step=next((e.step for e in reversed(evs) if e.step is not None), None),
            phase=evs[-1].phase,
            manifest=next((e.manifest for e in reversed(evs) if e.manifest is not None), None),
            events=tuple(evs),
        )
        for cid, evs in sorted(ckpt.items())
    )
    kind = "serving" if serving and not ranks else "training"
    return GroupSnapshot(
        group=group,
        kind=kind,
        state=state,
        generation=generation,
        taken_at=now,
        ranks=ranks,
        nodes=node_states(heartbeats),
        devices=devices,
        checkpoints=checkpoints,
        transitions=tuple(transitions),
        serving=tuple(serving[w] for w in sorted(serving)),
        contract_findings=contract_states(contract_findings),
        slo=ServingSlo.from_mapping(slo),
        probes=tuple(probes),
        host_events=tuple(host_events),
        net_events=tuple(net_events),
        net_ports=tuple(net_ports[k] for k in sorted(net_ports, key=str)),
        hosts=tuple(hosts[k] for k in sorted(hosts, key=str)),
        process_groups=_process_groups({rk: pg_reports[rk] for rk in active if rk in pg_reports}),
        objectives=Objectives.from_mapping(objectives),
    )


def node_states(heartbeats: Mapping[str, datetime | None]) -> tuple[NodeState, ...]:
    """The snapshot's nodes from each node's newest heartbeat, by name."""
    return tuple(NodeState(name=n, last_heartbeat=t) for n, t in sorted(heartbeats.items()))


def heartbeats_of(
    group: str, nodes: Mapping[str, datetime | None], records: list[Mapping[str, Any]]
) -> dict[str, datetime | None]:
    """`nodes` with the newer of its time and the newest `heartbeat` record of the group per
    node (what `build_snapshot` makes of them; `records` in any order)."""
    out = dict(nodes)
    for r in records:
        if r.get("kind") == "heartbeat" and r.get("node") and r.get("group") in (None, group):
            prev = out.get(r["node"])
            out[r["node"]] = r["ts"] if prev is None else max(prev, r["ts"])
    return out


def contract_states(findings: list[dict[str, Any]]) -> tuple[ContractFinding, ...]:
    return tuple(
        ContractFinding(
            kind=c["kind"],
            subject=c["subject"],
            evidence=dict(c.get("evidence") or {}),
            ts=c.get("ts"),
            generation=c.get("generation"),
        )
        for c in findings
    )


DEVICE_KINDS = frozenset({"device_sample", "device_event"})
_ts_of = itemgetter("ts")

# A GPU's records (oldest first), its state, and the (record, parsed sample) pairs in it.
DeviceMemo = tuple[
    list[Mapping[str, Any]], DeviceState, list[tuple[Mapping[str, Any], DeviceSample]]
]


def _device(
    gpu: str, recs: list[Mapping[str, Any]], parse: Callable[[Mapping[str, Any]], DeviceSample]
) -> tuple[DeviceState, list[tuple[Mapping[str, Any], DeviceSample]]]:
    """One GPU's state from its records, oldest first: the newest node named (the first
    record's if none names one), the newest sample and the newest that showed throttling,
    every event; and the samples it parsed."""
    node: str | None = None
    index: int | None = None
    indexed = False
    sample: DeviceSample | None = None
    throttled: DeviceSample | None = None
    events: list[DeviceEvent] = []
    pairs: list[tuple[Mapping[str, Any], DeviceSample]] = []
    for i, r in enumerate(recs):
        if not i or r.get("node") is not None:
            node = r.get("node")
        if r["kind"] == "device_sample":
            index, indexed = r.get("index"), True
            sample = parse(r)
            pairs.append((r, sample))
            if r.get("throttle_reasons"):
                throttled = sample
            elif (seen := r.get("throttled")) and isinstance(seen.get("ts"), datetime):
                throttled = parse(seen)
                pairs.append((seen, throttled))
        else:
            if not indexed:
                index, indexed = r.get("index"), True
            events.append(
                DeviceEvent(
                    ts=r["ts"],
                    event=r["event"],
                    code=r.get("code"),
                    detail=r.get("detail"),
                    recovery_action=r.get("recovery_action"),
                )
            )
    state = DeviceState(
        gpu=gpu,
        node=node,
        index=index,
        sample=sample,
        events=tuple(events),
        last_throttled=throttled,
    )
    return state, pairs


def _host_record(
    r: Mapping[str, Any],
    host_events: list[HostEvent],
    net_events: list[NetEvent],
    net_ports: dict[tuple[str | None, str], NetPort],
    hosts: dict[str | None, HostState],
) -> None:
    """One host/network record into its list (records arrive oldest first)."""
    kind, node = r["kind"], r.get("node")
    if kind == "host_event":
        host_events.append(
            HostEvent(
                ts=r["ts"],
                node=node,
                event=r["event"],
                device=r.get("device"),
                code=r.get("code"),
                pid=r.get("pid"),
                comm=r.get("comm"),
                severity=r.get("severity"),
            )
        )
    elif kind == "net_event":
        net_events.append(
            NetEvent(
                ts=r["ts"],
                node=node,
                port=r["port"],
                link=r.get("link") or "ib",
                event=r["event"],
                state=r.get("state"),
                rate_gbps=_num(r.get("rate_gbps")),
                prev_rate_gbps=_num(r.get("prev_rate_gbps")),
                counters=dict(r.get("counters") or {}),
            )
        )
    elif kind == "net_sample":
        net_ports[(node, r["port"])] = NetPort(
            ts=r["ts"],
            node=node,
            port=r["port"],
            link=r.get("link") or "ib",
            state=r.get("state"),
            rate_gbps=_num(r.get("rate_gbps")),
            counters=dict(r.get("counters") or {}),
            interval_s=_num(r.get("interval_s")),
        )
    else:
        hosts[node] = HostState(
            ts=r["ts"],
            node=node,
            mem_some_avg10=_num(r.get("mem_some_avg10")),
            mem_full_avg10=_num(r.get("mem_full_avg10")),
            io_full_avg10=_num(r.get("io_full_avg10")),
            swap_used_bytes=r.get("swap_used_bytes"),
            swap_total_bytes=r.get("swap_total_bytes"),
            d_state=r.get("d_state"),
            disks=tuple(
                DiskState(
                    root=str(d.get("root", "")),
                    device=d.get("device"),
                    free_bytes=d.get("free_bytes"),
                    total_bytes=d.get("total_bytes"),
                    io_errors=d.get("io_errors"),
                )
                for d in r.get("disks") or ()
            ),
        )
