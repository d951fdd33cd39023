"""Leaf record dataclasses of a group snapshot, one per contract record shape.

Owns the frozen shapes of steps, processes, collectives, devices, checkpoints,
transitions, serving windows and correctness probes (DESIGN §3 names). Must not do I/O
or import Django.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

PHASES = ("compute", "collective", "input", "checkpoint", "optimizer")


@dataclass(frozen=True, slots=True)
class Phases:
    compute: float | None = None
    collective: float | None = None
    input: float | None = None
    checkpoint: float | None = None
    optimizer: float | None = None
    # Every phase in `PHASES` order, 0.0 where not reported: what sums over a window of
    # steps add, built once per step (a getattr per phase per step per pass dominated the
    # straggler statistics of a 16k-rank pass). Derived, so not compared.
    values: tuple[float, float, float, float, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "values",
            (
                self.compute or 0.0,
                self.collective or 0.0,
                self.input or 0.0,
                self.checkpoint or 0.0,
                self.optimizer or 0.0,
            ),
        )

    def get(self, name: str) -> float | None:
        value: float | None = getattr(self, name)
        return value


@dataclass(frozen=True, slots=True)
class StepRecord:
    ts: datetime
    generation: int
    step: int
    duration_ms: float | None = None
    phases: Phases = field(default_factory=Phases)
    tokens: int | None = None
    loss: float | None = None
    grad_norm: float | None = None
    loss_scale: float | None = None
    overflow: bool | None = None
    data_cursor: int | None = None
    # The FLOPs the step did by the model's count and by the hardware's (MFU, HFU).
    model_flops: float | None = None
    hw_flops: float | None = None
    # (duration_ms, *phases.values) when the step has a duration, else None: what the
    # straggler means sum over a rank's recent steps, one tuple per step, built once when
    # the step is parsed (rules/digest.py; at 16k ranks reading the duration and the phases
    # through two objects per step per pass was the largest cost of a pass). Not compared.
    row: tuple[float, float, float, float, float, float] | None = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        d = self.duration_ms
        object.__setattr__(self, "row", None if d is None else (d, *self.phases.values))


def _slot_setters(cls: type, names: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(cls.__dict__[n].__set__ for n in names)


_new = object.__new__
_PHASE_SET = _slot_setters(
    Phases, ("compute", "collective", "input", "checkpoint", "optimizer", "values")
)
_STEP_SET = _slot_setters(
    StepRecord,
    (
        "ts",
        "generation",
        "step",
        "duration_ms",
        "phases",
        "tokens",
        "loss",
        "grad_norm",
        "loss_scale",
        "overflow",
        "data_cursor",
        "model_flops",
        "hw_flops",
        "row",
    ),
)


def new_step(
    ts: datetime,
    generation: int,
    step: int,
    duration_ms: float | None,
    compute: float | None,
    collective: float | None,
    input: float | None,
    checkpoint: float | None,
    optimizer: float | None,
    tokens: int | None,
    loss: float | None,
    grad_norm: float | None,
    loss_scale: float | None,
    overflow: bool | None,
    data_cursor: int | None,
    model_flops: float | None,
    hw_flops: float | None,
) -> StepRecord:
    """`StepRecord(..., phases=Phases(...))`, the same objects, built through the slots
    directly: a frozen dataclass's `__init__` sets each field through `object.__setattr__`,
    and at 16k ranks a pass parses 16k steps (this took a step's parse from ~2.3 to ~1.3 us).
    tests/diagnosis/test_snapshot.py checks it against the constructors."""
    ph = _new(Phases)
    a, b, c, d, e, f = _PHASE_SET
    a(ph, compute)
    b(ph, collective)
    c(ph, input)
    d(ph, checkpoint)
    e(ph, optimizer)
    values = (compute or 0.0, collective or 0.0, input or 0.0, checkpoint or 0.0, optimizer or 0.0)
    f(ph, values)
    s = _new(StepRecord)
    a, b, c, d, e, f, g, h, i, j, k, m, n, o = _STEP_SET
    a(s, ts)
    b(s, generation)
    c(s, step)
    d(s, duration_ms)
    e(s, ph)
    f(s, tokens)
    g(s, loss)
    h(s, grad_norm)
    i(s, loss_scale)
    j(s, overflow)
    k(s, data_cursor)
    m(s, model_flops)
    n(s, hw_flops)
    o(s, None if duration_ms is None else (duration_ms, *values))
    return s


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    ts: datetime
    generation: int
    event: str  # started | exited
    pid: int | None = None
    gpu: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None  # oom | exception | killed | clean | ...
    error_type: str | None = None
    message: str | None = None  # the exception's message, scrubbed at ingest


@dataclass(frozen=True, slots=True)
class CollectiveEntry:
    seq: int
    pg: str
    op: str
    numel: int | None
    dtype: str | None
    state: str  # scheduled | started | completed
    started_ts: datetime | None = None
    # Contract v1 additions; absent in older payloads.
    out_numel: int | None = None
    out_dtype: str | None = None
    in_splits: tuple[int, ...] | None = None
    out_splits: tuple[int, ...] | None = None
    peer: int | None = None  # send/recv: the other side's global rank
    p2p_seq: int | None = None  # k-th send to / recv from `peer` on `pg`
    coalesced: int | None = None  # coalesced batch id (rank-local)

    @property
    def signature(self) -> tuple[str, str, int | None, str | None]:
        return (self.pg, self.op, self.numel, self.dtype)


@dataclass(frozen=True, slots=True)
class ProcessGroup:
    """One process group as its members reported it: name, size, members in group order."""

    pg: str
    size: int
    ranks: tuple[int, ...]  # global ranks, group-rank order
    desc: str | None = None
    reported_by: tuple[int, ...] = ()  # ranks whose `process_groups` record named it


@dataclass(frozen=True, slots=True)
class CollectiveWindow:
    ts: datetime
    generation: int
    entries: tuple[CollectiveEntry, ...]


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    last_heartbeat: datetime | None


@dataclass(frozen=True, slots=True)
class DeviceSample:
    ts: datetime
    temp_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    util_pct: float | None = None
    mem_used_bytes: int | None = None
    ecc_sbe: int | None = None
    ecc_dbe: int | None = None
    retired_or_remapped_pending: bool | int | None = None
    throttle_reasons: tuple[str, ...] = ()
    nvlink_errors: int | None = None
    pcie_replays: int | None = None
    name: str | None = None  # NVML's: the key of the device's peak FLOPs
    mem_util_pct: float | None = None  # share of time device memory was busy


@dataclass(frozen=True, slots=True)
class DeviceEvent:
    ts: datetime
    event: str  # xid | ecc_dbe | thermal | gpu_lost | ...
    code: int | None = None
    detail: str | None = None
    recovery_action: str | None = None  # the driver's, when the event was read


@dataclass(frozen=True, slots=True)
class DeviceState:
    gpu: str
    node: str | None
    index: int | None
    sample: DeviceSample | None = None  # latest
    events: tuple[DeviceEvent, ...] = ()  # oldest first
    # The newest sample that showed throttle reasons, kept after the throttle ended: steps
    # it slowed stay in a straggler's window for a while after the clocks recover.
    last_throttled: DeviceSample | None = None


@dataclass(frozen=True, slots=True)
class Shard:
    path: str
    bytes: int | None
    sha256: str | None


@dataclass(frozen=True, slots=True)
class Manifest:
    shards: tuple[Shard, ...] = ()
    total_bytes: int | None = None
    format: str | None = None


@dataclass(frozen=True, slots=True)
class CheckpointEvent:
    ts: datetime
    generation: int
    phase: str  # staging | written | committed | verified | corrupt | modified
    step: int | None
    manifest: Manifest | None
    duration_ms: float | None = None
    detail: str | None = None  # e.g. the agent naming the shard that changed
    data_cursor: int | None = None  # where a restore resumes the data


@dataclass(frozen=True, slots=True)
class CheckpointState:
    checkpoint_id: str
    step: int | None
    phase: str  # latest phase
    manifest: Manifest | None  # latest manifest reported
    events: tuple[CheckpointEvent, ...]  # oldest first


@dataclass(frozen=True, slots=True)
class Transition:
    ts: datetime
    generation: int
    from_state: str | None
    to_state: str
    reason: str | None = None
    restart_count: int | None = None
    world_size: int | None = None
    data_cursor: int | None = None
    model_version: str | None = None


@dataclass(frozen=True, slots=True)
class ServingWindow:
    ts: datetime
    worker: str
    model_version: str | None = None
    adapter_version: str | None = None
    kv_schema: str | None = None
    ready: bool | None = None
    draining: bool | None = None
    window: Mapping[str, Any] = field(default_factory=dict)  # DESIGN §3 window fields
    node: str | None = None  # the agent that delivered it (silence is judged at its lag)


@dataclass(frozen=True, slots=True)
class ServingSlo:
    """A serving group's SLO: p99 latency ceilings per window and the goodput target.

    `slo_met` in a window is counted by the serving process per request (it sees every
    request); these ceilings are checked against the window's percentiles as well.
    """

    ttft_ms_p99: float = 2000.0
    tpot_ms_p99: float = 150.0
    e2e_ms_p99: float = 60000.0
    goodput_target: float = 0.95

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> ServingSlo:
        known = {k: float(v) for k, v in (raw or {}).items() if k in cls.__slots__}
        return cls(**known)

    def to_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__slots__}


# The keys a group's SLO may set: the one list the API, the write path and diagnosis share.
SLO_KEYS: tuple[str, ...] = tuple(f.name for f in fields(ServingSlo))


@dataclass(frozen=True, slots=True)
class Objectives:
    """A group's effective recovery objectives, already merged and validated by
    console.policy.objectives; None means nothing was promised. `sources` names who set
    each key (operator, launcher, pool:<name>, default) for the evidence."""

    rpo_steps: int | None = None
    rpo_minutes: float | None = None
    rto_s: float | None = None
    consistency: str | None = None  # agents.protocol.DATA_CONSISTENCY
    semantics: str | None = None  # agents.protocol.SERVING_SEMANTICS
    goodput_target: float | None = None
    sources: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> Objectives:
        raw = raw or {}
        return cls(
            rpo_steps=None if raw.get("rpo_steps") is None else int(raw["rpo_steps"]),
            rpo_minutes=None if raw.get("rpo_minutes") is None else float(raw["rpo_minutes"]),
            rto_s=None if raw.get("rto_s") is None else float(raw["rto_s"]),
            consistency=raw.get("consistency"),
            semantics=raw.get("semantics"),
            goodput_target=(
                None if raw.get("goodput_target") is None else float(raw["goodput_target"])
            ),
            sources=dict(raw.get("sources") or {}),
        )


@dataclass(frozen=True, slots=True)
class ContractFinding:
    kind: str
    subject: str
    evidence: Mapping[str, Any]
    ts: datetime | None = None
    generation: int | None = None  # the violation's own (ContractViolation.generation)


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    """A correctness probe's answer: a fixed input's `value` and/or `checksum`,
    from a training rank (`rank`, `step`) or a serving worker (`worker`, `model_version`)."""

    ts: datetime
    generation: int
    probe: str
    rank: int | None = None
    worker: str | None = None
    step: int | None = None
    value: float | None = None
    checksum: str | None = None
    model_version: str | None = None


# -- host, network and kernel evidence ------------------------------------------
@dataclass(frozen=True, slots=True)
class HostEvent:
    """A kernel-log event of a node (agents/kmsg.py codes: oom_kill, mce, aer_*, ...)."""

    ts: datetime
    node: str | None
    event: str
    device: str | None = None
    code: int | None = None
    pid: int | None = None
    comm: str | None = None
    severity: str | None = None


@dataclass(frozen=True, slots=True)
class NetEvent:
    """A link flap, rate drop or moved error counters on one port of a node."""

    ts: datetime
    node: str | None
    port: str
    link: str
    event: str  # link_down | link_up | rate_drop | errors
    state: str | None = None
    rate_gbps: float | None = None
    prev_rate_gbps: float | None = None
    counters: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NetPort:
    """A port's newest sample: state, rate and the counter deltas of its last round."""

    ts: datetime
    node: str | None
    port: str
    link: str
    state: str | None = None
    rate_gbps: float | None = None
    counters: Mapping[str, int] = field(default_factory=dict)
    interval_s: float | None = None  # the deltas' span


@dataclass(frozen=True, slots=True)
class DiskState:
    root: str
    device: str | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    io_errors: int | None = None


@dataclass(frozen=True, slots=True)
class HostState:
    """A node's newest host sample."""

    ts: datetime
    node: str | None
    mem_some_avg10: float | None = None
    mem_full_avg10: float | None = None
    io_full_avg10: float | None = None
    swap_used_bytes: int | None = None
    swap_total_bytes: int | None = None
    d_state: int | None = None
    disks: tuple[DiskState, ...] = ()
