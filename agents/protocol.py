"""The agent -> service wire contract, version 1 (DESIGN.md §3), as msgspec Structs.

This module is the single definition of the contract: ingest validates against it and the
agent's tests check what the agent sends against it. It depends on msgspec only, never on
the service. The agent's runtime modules build plain dicts and do not import it, so a GPU
node runs the agent with the standard library alone.

Renaming or removing a field is a versioned change (/api/v2); adding an optional field is not.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, get_args

import msgspec
from msgspec import Meta, Struct

from agents import vocab, wire

PROTOCOL_VERSION = 1

# Limits that keep one batch bounded; ingest answers 400/413 beyond them.
MAX_RECORDS_PER_BATCH = 5000
# One limit for both sides: the agent (stdlib only) builds batches under it, ingest refuses
# bodies over it (413), and Django's DATA_UPLOAD_MAX_MEMORY_SIZE is set from it.
MAX_BATCH_BYTES = wire.MAX_BATCH_BYTES
MAX_SEND_INTERVAL_S = wire.MAX_SEND_INTERVAL_S
# Timestamps a real clock can show; anything else is a broken clock or a probe, and would
# overflow the skew arithmetic in ingest (a year-9999 sent_at was a 500).
EARLIEST_TS = datetime(2000, 1, 1, tzinfo=UTC)
LATEST_TS = datetime(2100, 1, 1, tzinfo=UTC)
MAX_COLLECTIVE_ENTRIES = 512
MAX_SHARDS = 4096
MAX_ATTESTED_JOBS = 64  # scheduler jobs one node's heartbeat attests
MAX_GROUP_NODES = 4096  # nodes one transition may declare for a generation


UtcTime = Annotated[datetime, Meta(tz=True)]
Name = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@/\-]+$")]
Code = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:\-]+$")]
Short = Annotated[str, Meta(max_length=256)]
GpuId = Annotated[str, Meta(min_length=1, max_length=96)]
Count = Annotated[int, Meta(ge=0)]
Rank = Annotated[int, Meta(ge=0, le=1_000_000)]
Generation = Annotated[int, Meta(ge=0)]
Pct = Annotated[float, Meta(ge=0, le=100)]
NonNeg = Annotated[float, Meta(ge=0)]
# JSON has no NaN: non-finite floats travel as these strings and are kept (a NaN loss is
# the very fault the console exists to catch).
Real = float | Literal["NaN", "Infinity", "-Infinity"]

# The group states are agents/vocab.py's (the console and the pages share them).
GroupState = vocab.GroupStateName
GROUP_STATES: tuple[str, ...] = vocab.GROUP_STATES


# gc=False on every Struct: records are trees (no cycles), and a 1,000-record batch would
# otherwise hand the cyclic GC thousands of objects to track and scan on every request.
class _Record(Struct, gc=False, forbid_unknown_fields=True, tag_field="kind", omit_defaults=True):
    ts: UtcTime


class Heartbeat(_Record, tag="heartbeat"):
    uptime_s: NonNeg = 0.0
    spool_depth: Count = 0
    dropped: Count = 0
    # The scheduler jobs running on this node as the agent read them from its scheduler
    # (Slurm: the node's allocations; Kubernetes: its pods' jobs). None: the agent has no
    # scheduler to ask; []: it asked, and nothing runs here. Who may write a group bound
    # to a job follows from it (docs/security.md, "Who owns a group").
    jobs: Annotated[list[Name], Meta(max_length=MAX_ATTESTED_JOBS)] | None = None


class DeviceSample(_Record, tag="device_sample"):
    gpu: GpuId
    index: Annotated[int, Meta(ge=0, le=1024)]
    temp_c: Annotated[float, Meta(ge=-50, le=200)] | None = None
    power_w: Annotated[float, Meta(ge=0, le=10_000)] | None = None
    sm_clock_mhz: NonNeg | None = None
    mem_clock_mhz: NonNeg | None = None
    util_pct: Pct | None = None
    mem_used_bytes: Count | None = None
    ecc_sbe: Count | None = None
    ecc_dbe: Count | None = None
    retired_or_remapped_pending: Count | None = None
    throttle_reasons: Annotated[list[Code], Meta(max_length=32)] = []
    nvlink_errors: Count | None = None
    pcie_replays: Count | None = None
    # What NVML calls the device ("NVIDIA H100 80GB HBM3"): the key of its peak FLOPs
    # (agents/flops.py), hence of its ranks' MFU. Added to v1 additively.
    name: Annotated[str, Meta(max_length=96)] | None = None
    # NVML's memory utilisation: the share of the last sample period in which device
    # memory was read or written (a percentage, not bytes/s). Added to v1 additively.
    mem_util_pct: Pct | None = None


# -- Xid recovery action ---------------------------------------------------
# What the GPU needs, as the driver says it: NVML's nvmlDeviceGetGpuRecoveryAction when the
# event was read, else the kernel log's own words (the Xid 154 line "GPU recovery action
# changed from ... to ...", or NVIDIA's decode of an NVLink5 Xid's fields: a fatal decode
# is gpu_reset, any other none; agents/xid_decode.py). Names as in agents/xid.py
# RECOVERY_ACTIONS; absent when nothing says.
RecoveryAction = Literal["none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset"]
RECOVERY_ACTIONS: tuple[str, ...] = RecoveryAction.__args__  # type: ignore[attr-defined]  # Literal aliases carry __args__ at run time; typeshed omits it
# -- end Xid recovery action -----------------------------------------------------------


class DeviceEvent(_Record, tag="device_event"):
    gpu: GpuId
    event: Code
    code: int | None = None
    detail: Short | None = None
    recovery_action: RecoveryAction | None = None  # see RecoveryAction above


class Process(_Record, tag="process"):
    group: Name
    generation: Generation
    rank: Rank
    event: Literal["started", "exited"]
    pid: Count | None = None
    gpu: GpuId | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: Code | None = None
    error_type: Annotated[str, Meta(max_length=128)] | None = None
    job: Name | None = None  # the scheduler's job id (Slurm job id): restart_group's target
    # -- failures as the launcher saw them --
    # The exception's message, bounded by the sender and scrubbed again by ingest
    # (ingest/scrub.py): an uncaught exception's, or a TorchElastic error file's.
    message: Short | None = None
    # The launcher that named this exit the generation's root cause ("torchelastic":
    # torchrun's "Root Cause (first observed failure)"), shown beside Faultline's own.
    launcher_root_cause: Code | None = None


class Phases(Struct, gc=False, forbid_unknown_fields=True, omit_defaults=True):
    compute: NonNeg | None = None
    collective: NonNeg | None = None
    input: NonNeg | None = None
    checkpoint: NonNeg | None = None
    optimizer: NonNeg | None = None


class Step(_Record, tag="step"):
    group: Name
    generation: Generation
    rank: Rank
    step: Count
    tokens: Count = 0
    data_cursor: Count | None = None
    duration_ms: NonNeg | None = None
    phases: Phases | None = None
    loss: Real | None = None
    grad_norm: Real | None = None
    loss_scale: Real | None = None
    overflow: bool | None = None
    # Correlation: the logical step's stable id, the same on every rank.
    step_id: Name | None = None
    # Utilisation, added to v1 additively: the FLOPs this rank's step did by the model's
    # count (MFU's numerator) and by the hardware's (rematerialisation included: HFU's),
    # and the optimizer's learning rate for the step (a schedule bug is the first thing to
    # rule out when the loss diverges).
    model_flops: Annotated[float, Meta(ge=0)] | None = None
    hw_flops: Annotated[float, Meta(ge=0)] | None = None
    lr: Real | None = None


# -- collectives: process groups and per-call detail -----------------------
# Matching needs to know who is in which process group and what each call moved. Every
# field below is optional: a payload from before these fields existed means what it meant.
MAX_PG_RANKS = 16384
MAX_PROCESS_GROUPS = 1024
MAX_SPLITS = 16384
PgName = Annotated[str, Meta(max_length=64)]


class CollectiveEntry(Struct, gc=False, forbid_unknown_fields=True, omit_defaults=True):
    # `seq` counts this rank's collectives on `pg` (1, 2, ...); the members of one coalesced
    # batch share it. Point-to-point entries (`peer` set) count separately (see `p2p_seq`).
    seq: Count
    op: Code
    pg: PgName = "default"
    numel: Count | None = None  # input numel
    dtype: Code | None = None  # input dtype
    state: Literal["scheduled", "started", "completed"] = "scheduled"
    started_ts: UtcTime | None = None
    step_id: Name | None = None  # correlation: the step this call belongs to
    out_numel: Count | None = None
    out_dtype: Code | None = None
    # all_to_all: elements sent to / received from each member, in the group's rank order.
    in_splits: Annotated[list[Count], Meta(max_length=MAX_SPLITS)] | None = None
    out_splits: Annotated[list[Count], Meta(max_length=MAX_SPLITS)] | None = None
    peer: Rank | None = None  # send/recv: the other side's global rank
    p2p_seq: Count | None = None  # send/recv: k-th send to (or recv from) `peer` on `pg`
    coalesced: Count | None = None  # id of the coalesced batch this call belongs to


class ProcessGroupInfo(Struct, gc=False, forbid_unknown_fields=True, omit_defaults=True):
    pg: PgName
    size: Annotated[int, Meta(ge=1, le=1_000_001)]
    # Global ranks of the members in group-rank order; absent means 0 .. size-1 (the world).
    ranks: Annotated[list[Rank], Meta(max_length=MAX_PG_RANKS)] | None = None
    desc: Code | None = None  # what the job calls it: tp, dp, pp, ep, ...
    backend: Code | None = None


class ProcessGroups(_Record, tag="process_groups"):
    """The process groups one rank belongs to, sent once per generation (and on change)."""

    group: Name
    generation: Generation
    rank: Rank
    groups: Annotated[list[ProcessGroupInfo], Meta(max_length=MAX_PROCESS_GROUPS)]


# -- end of the process-group block -----------------------------------------------------


class Collective(_Record, tag="collective"):
    group: Name
    generation: Generation
    rank: Rank
    entries: Annotated[list[CollectiveEntry], Meta(max_length=MAX_COLLECTIVE_ENTRIES)]


class Shard(Struct, gc=False, forbid_unknown_fields=True, omit_defaults=True):
    path: Annotated[str, Meta(min_length=1, max_length=512)]
    bytes: Count | None = None
    sha256: Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")] | None = None


class Manifest(Struct, gc=False, forbid_unknown_fields=True, omit_defaults=True):
    shards: Annotated[list[Shard], Meta(max_length=MAX_SHARDS)] = []
    total_bytes: Count | None = None
    format: Code | None = None


class Checkpoint(_Record, tag="checkpoint"):
    group: Name
    generation: Generation
    checkpoint_id: Name
    phase: Literal["staging", "written", "committed", "verified", "corrupt", "modified"]
    step: Count | None = None
    manifest: Manifest | None = None
    duration_ms: NonNeg | None = None
    detail: Short | None = None
    # the data cursor a restore from this checkpoint resumes at (the samples its
    # saved loader state has consumed, in the steps' `data_cursor` units). Absent: the
    # checkpoint saved no loader state, so exactly-once resume cannot be proven.
    data_cursor: Count | None = None


# -- recovery objectives -------------------------------------------------------
# What a group promises about recovery (the seed's RPO, RTO, data consistency and serving
# semantics, plus its goodput SLO). The one definition of the vocabularies: the service's
# REST, pool defaults and diagnosis import them from here.
DataConsistency = Literal["exact", "allow_repeat", "allow_skip"]
DATA_CONSISTENCY: tuple[str, ...] = get_args(DataConsistency)
ServingSemantics = Literal["at_most_once", "at_least_once", "idempotent_replay"]
SERVING_SEMANTICS: tuple[str, ...] = get_args(ServingSemantics)
MAX_RPO_STEPS = 100_000_000
MAX_RPO_MINUTES = 7 * 24 * 60.0
MAX_RTO_S = 7 * 24 * 3600.0


class Objectives(Struct, gc=False, forbid_unknown_fields=True, omit_defaults=True):
    """A group's recovery objectives; every field optional (absent: not promised)."""

    rpo_steps: Annotated[int, Meta(ge=1, le=MAX_RPO_STEPS)] | None = None
    rpo_minutes: Annotated[float, Meta(gt=0, le=MAX_RPO_MINUTES)] | None = None
    rto_s: Annotated[float, Meta(gt=0, le=MAX_RTO_S)] | None = None
    consistency: DataConsistency | None = None
    semantics: ServingSemantics | None = None
    goodput_target: Annotated[float, Meta(gt=0, le=1)] | None = None


OBJECTIVE_KEYS: tuple[str, ...] = Objectives.__struct_fields__


def validate_objectives(raw: Any) -> dict[str, Any]:
    """The objectives as plain values, or ValueError naming what is wrong (REST and pool
    defaults go through the same Struct the wire does)."""
    try:
        obj = msgspec.convert(raw, Objectives)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None
    return {k: getattr(obj, k) for k in OBJECTIVE_KEYS if getattr(obj, k) is not None}


# -- end of recovery objectives --------------------------------------------------------------


class Topology(Struct, gc=False, forbid_unknown_fields=True, omit_defaults=True):
    dp: Annotated[int, Meta(ge=1)] = 1
    tp: Annotated[int, Meta(ge=1)] = 1
    pp: Annotated[int, Meta(ge=1)] = 1
    ep: Annotated[int, Meta(ge=1)] = 1


class Transition(_Record, tag="transition"):
    group: Name
    generation: Generation
    to_state: GroupState
    from_state: GroupState | None = None
    reason: Code | None = None
    restart_count: Count | None = None
    world_size: Count | None = None
    topology: Topology | None = None
    data_cursor: Count | None = None
    model_version: Name | None = None
    job: Name | None = None  # the scheduler's job id (Slurm job id): restart_group's target
    # The nodes of this generation's rendezvous (node names): from the group's launcher or
    # one of its hosts, they become the nodes that may place the group's ranks.
    nodes: Annotated[list[Name], Meta(max_length=MAX_GROUP_NODES)] | None = None
    # the launcher's recovery objectives for the group (replace what it declared
    # before, key by key; an operator's REST overrides win).
    objectives: Objectives | None = None


SloTerm = Literal["ttft", "tpot", "e2e"]


class ServingWindowStats(Struct, gc=False, forbid_unknown_fields=True, omit_defaults=True):
    seconds: Annotated[float, Meta(gt=0, le=3600)]
    requests: Count = 0
    slo_met: Count = 0
    ttft_ms_p50: NonNeg | None = None
    ttft_ms_p99: NonNeg | None = None
    tpot_ms_p50: NonNeg | None = None
    tpot_ms_p99: NonNeg | None = None
    e2e_ms_p99: NonNeg | None = None
    queued: Count = 0
    active: Count = 0
    preempted: Count = 0
    cancelled: Count = 0
    kv_used_pct: Pct | None = None
    prefix_hit_pct: Pct | None = None
    evictions: Count = 0
    oom: Count = 0
    timeouts: Count = 0
    retries: Count = 0
    duplicate_tokens: Count = 0
    # Correlation: the window's first and last request ids (its requests, end to end).
    first_request_id: Name | None = None
    last_request_id: Name | None = None
    # The worker's process ended: sent by whoever saw it exit (its launcher,
    # supervisor or router) as the worker's last window, `active`/`queued` = the requests
    # the sender knew in flight on it. A worker's next window (after a restart) supersedes it.
    exited: bool = False
    exit_code: int | None = None
    # What an engine measures that a serving process seldom counts itself (the agent's
    # scrape of vLLM/SGLang, docs/serving.md): each absent where the engine exports none.
    queue_ms_p50: NonNeg | None = None
    queue_ms_p99: NonNeg | None = None
    prefill_ms_p50: NonNeg | None = None
    prefill_ms_p99: NonNeg | None = None
    decode_ms_p50: NonNeg | None = None
    decode_ms_p99: NonNeg | None = None
    graph_miss_pct: Pct | None = None  # forward passes not served by a captured graph
    # The SLO terms `slo_met` counted (absent: every term, per request, by the process
    # itself); an engine's per-token TPOT histogram cannot count requests.
    slo_checked: Annotated[list[SloTerm], Meta(max_length=3)] | None = None
    # Count fields the sender cannot see (an engine exports no OOM or retry count): absent
    # from the window means unknown, not zero.
    unmeasured: Annotated[list[Code], Meta(max_length=32)] | None = None


class Serving(_Record, tag="serving"):
    group: Name
    worker: Name
    window: ServingWindowStats
    model_version: Name | None = None
    adapter_version: Name | None = None
    kv_schema: Name | None = None
    ready: bool = False
    draining: bool = False
    # None: the worker takes no part in generation fencing and follows the group's.
    generation: Generation | None = None


# ---- correctness probes ---------------------------------------------------------
# The seed's fourth health check: a fixed input still gives the expected answer. A training
# rank reports a fixed batch's loss (`value`) or a checksum of a deterministic forward pass
# every N steps; a serving worker a fixed request's output checksum. Compared across ranks at
# the same step and over time by the diagnosis rule `probe_divergence`.
Checksum = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[0-9a-f]+$")]


class Probe(_Record, tag="probe"):
    group: Name
    probe: Code  # which fixed input (a name; its answer is only compared with its own kind)
    generation: Generation | None = None  # None: a serving worker outside fencing
    rank: Rank | None = None  # training
    worker: Name | None = None  # serving
    step: Count | None = None
    step_id: Name | None = None
    value: Real | None = None
    checksum: Checksum | None = None
    duration_ms: NonNeg | None = None
    model_version: Name | None = None


# ---- end of correctness probes ---------------------------------------------------------------
# -- host, network and kernel evidence ----------------------------------------
# Bounded records of the layers below the GPU. No free text: event codes (agents/kmsg.py,
# agents/host.py define the vocabularies), device names and numbers only.
PortName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:@/\-]+$")]
Comm = Annotated[str, Meta(max_length=16)]  # a task name (TASK_COMM_LEN)
HostEventCode = Literal[
    "sxid",
    "aer_corrected",
    "aer_nonfatal",
    "aer_fatal",
    "oom_kill",
    "mce",
    "hung_task",
    "io_error",
]
HOST_EVENT_CODES: tuple[str, ...] = get_args(HostEventCode)
# Host events that are diagnosed at once, like a GPU's critical device events (an OOM kill,
# a machine check, a fatal PCIe error): ingest schedules the urgent diagnosis lane for them.
URGENT_HOST_EVENTS = frozenset({"oom_kill", "mce", "aer_fatal"})
NetEventCode = Literal["link_down", "link_up", "rate_drop", "errors"]
NET_EVENT_CODES: tuple[str, ...] = get_args(NetEventCode)
# Counters a port reports (deltas since the agent's previous read): at most 32 per record.
Counters = Annotated[dict[Code, Count], Meta(max_length=32)]


class HostEvent(_Record, tag="host_event"):
    """A kernel-log line that matters (the Xid lines travel as device_event)."""

    event: HostEventCode
    device: PortName | None = None  # PCI address (0000:3b:00) or block device (nvme0n1)
    code: int | None = None  # SXid number
    pid: Count | None = None
    comm: Comm | None = None
    severity: Literal["fatal", "nonfatal", "corrected"] | None = None


class NetSample(_Record, tag="net_sample"):
    """One InfiniBand/RoCE port (`mlx5_0/1`) or Ethernet interface (`eth0`) per round, and
    the node's TCP segment counters (port `tcp`, link `tcp`: retransmits name a lossy or
    shaped link that no interface counter shows)."""

    port: PortName
    link: Literal["ib", "eth", "tcp"]
    state: Code | None = None  # ACTIVE / DOWN / INIT (ib), up / down (eth)
    rate_gbps: NonNeg | None = None
    counters: Counters = {}  # deltas since the previous sample; only counters that exist
    # Seconds since the previous sample, the deltas' span: `tx_bytes` / `rx_bytes` over it
    # is the port's throughput. Added to v1 additively.
    interval_s: Annotated[float, Meta(gt=0, le=86_400)] | None = None


class NetEvent(_Record, tag="net_event"):
    """A link flap, a rate drop or error counters that moved, on one port."""

    port: PortName
    link: Literal["ib", "eth"]
    event: NetEventCode
    state: Code | None = None
    rate_gbps: NonNeg | None = None
    prev_rate_gbps: NonNeg | None = None
    counters: Counters = {}  # the error counters that moved (deltas)


class DiskFree(Struct, gc=False, forbid_unknown_fields=True, omit_defaults=True):
    """The filesystem under one checkpoint root."""

    root: Annotated[str, Meta(min_length=1, max_length=512)]
    device: PortName | None = None  # block device (nvme1n1), or the fs source
    free_bytes: Count | None = None
    total_bytes: Count | None = None
    io_errors: Count | None = None  # kernel I/O error lines for the device since start


class HostSample(_Record, tag="host_sample"):
    """Memory and I/O pressure, swap, D-state tasks and checkpoint disks, per round."""

    mem_some_avg10: Pct | None = None  # /proc/pressure/memory "some avg10"
    mem_full_avg10: Pct | None = None
    io_full_avg10: Pct | None = None
    swap_used_bytes: Count | None = None
    swap_total_bytes: Count | None = None
    d_state: Count | None = None  # tasks in uninterruptible sleep
    disks: Annotated[list[DiskFree], Meta(max_length=16)] = []


HOST_RECORDS = (HostEvent, NetSample, NetEvent, HostSample)
# -- end host, network and kernel evidence -----------------------------------------------


# Every record kind of the contract, once: the batch's union. RECORD_TYPES, RECORD_KINDS and
# the service's registry of handlers, tables, retention and readers (ingest.store.kinds)
# are read from it, so a new kind is its struct here and its entry in this union.
Record = (
    Heartbeat
    | DeviceSample
    | DeviceEvent
    | Process
    | Step
    | Collective
    | Checkpoint
    | Transition
    | Serving
    | Probe
    | HostEvent
    | NetSample
    | NetEvent
    | HostSample
    | ProcessGroups
)
RECORD_TYPES: tuple[type[_Record], ...] = get_args(Record)


def kind_of(struct: type[Struct]) -> str:
    """The `kind` a record struct is tagged with on the wire."""
    return str(struct.__struct_config__.tag)


RECORD_KINDS: tuple[str, ...] = tuple(kind_of(t) for t in RECORD_TYPES)
HOST_KINDS: frozenset[str] = frozenset(kind_of(t) for t in HOST_RECORDS)


class AgentInfo(Struct, gc=False, forbid_unknown_fields=True, omit_defaults=True):
    id: Annotated[str, Meta(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9\-]+$")]
    node: Name
    version: Annotated[str, Meta(max_length=32)] = "unknown"
    boot_id: Annotated[str, Meta(max_length=64)] | None = None


class Batch(Struct, gc=False, forbid_unknown_fields=True):
    agent: AgentInfo
    seq: Annotated[int, Meta(ge=0)]
    sent_at: UtcTime
    records: Annotated[list[Record], Meta(max_length=MAX_RECORDS_PER_BATCH)]


class ContractError(ValueError):
    """A batch that breaks the contract; `message` names the record, field, value and fix."""

    def __init__(self, message: str, *, index: int | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.index = index
        self.field = field

    def as_dict(self) -> dict[str, Any]:
        return {"error": self.message, "record": self.index, "field": self.field}


_decoder = msgspec.json.Decoder(Batch)
_PATH = re.compile(r"`\$\.(?P<path>[^`]+)`")
_RECORD_PATH = re.compile(r"^records\[(?P<index>\d+)\]\.?(?P<field>.*)$")


def decode_batch(body: bytes) -> Batch:
    """Decode and validate one batch; raise ContractError that a human can act on."""
    try:
        batch = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _explain(str(exc), body) from None
    except msgspec.DecodeError as exc:
        raise ContractError(f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ContractError(
            "batch: JSON nested too deeply (the contract is a few levels)"
        ) from None
    _check_times(batch)
    if b"\\u0000" in body:  # JSON can carry NUL only escaped; Postgres cannot store it
        # Depth is bounded here: the typed decode above accepted the body.
        _refuse_nul(msgspec.json.decode(body))
    return batch


def _out_of_range(ts: datetime) -> bool:
    return not EARLIEST_TS <= ts < LATEST_TS


def _check_times(batch: Batch) -> None:
    window = f"outside {EARLIEST_TS:%Y-%m-%d} .. {LATEST_TS:%Y-%m-%d}: check the node's clock"
    if _out_of_range(batch.sent_at):
        raise ContractError(
            f'batch field "sent_at": {batch.sent_at.isoformat()} is {window}', field="sent_at"
        )
    for index, rec in enumerate(batch.records):
        if _out_of_range(rec.ts):
            raise ContractError(
                f'record {index}: field "ts": {rec.ts.isoformat()} is {window}',
                index=index,
                field="ts",
            )


def _refuse_nul(value: Any, path: tuple[str | int, ...] = ()) -> None:
    if isinstance(value, str):
        if "\x00" in value:
            index = path[1] if len(path) > 1 and path[0] == "records" else None
            field = ".".join(str(p) for p in (path[2:] if index is not None else path))
            where = f"record {index}: " if index is not None else "batch "
            raise ContractError(
                f'{where}field "{field}": NUL (0x00) characters are not allowed',
                index=index if isinstance(index, int) else None,
                field=field,
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_nul(key, (*path, "<key>"))
            _refuse_nul(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_nul(item, (*path, i))


def _explain(raw: str, body: bytes) -> ContractError:
    match = _PATH.search(raw)
    reason = _PATH.sub("", raw)
    reason = re.sub(r"\s*-\s*at\s*$", "", reason).strip()
    reason = re.sub(r"^Expected `([^`]+)`, got `[^`]+`$", r"expected \1", reason)
    if not match:
        return ContractError(f"batch: {reason}")
    path = match.group("path")
    rec = _RECORD_PATH.match(path)
    if rec is None:
        return ContractError(f'batch field "{path}": {reason}', field=path)
    index = int(rec.group("index"))
    field = rec.group("field")
    unknown = re.match(r"^Object contains unknown field `([^`]+)`$", reason)
    if unknown:
        name = f"{field}.{unknown.group(1)}" if field else unknown.group(1)
        return ContractError(
            f'record {index}: field "{name}" is not part of contract v1 (remove it)',
            index=index,
            field=name,
        )
    field = field or "kind"
    value = _lookup(body, index, field)
    got = f", got {value}" if value is not None else ""
    return ContractError(
        f'record {index}: field "{field}": {reason}{got}', index=index, field=field
    )


def _lookup(body: bytes, index: int, field: str) -> str | None:
    """Best-effort: fetch the offending raw value for the error message (error path only)."""
    try:
        node: Any = msgspec.json.decode(body)["records"][index]
        for part in re.findall(r"[^.\[\]]+", field):
            node = node[int(part)] if isinstance(node, list) else node[part]
    except (msgspec.DecodeError, KeyError, IndexError, TypeError, ValueError, RecursionError):
        return None  # RecursionError: a deeply nested body; the message goes without a value
    text = msgspec.json.encode(node).decode()
    return text if len(text) <= 80 else text[:77] + "..."
