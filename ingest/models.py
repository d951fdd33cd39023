"""Agent-facing storage: credentials, per-agent delivery bookkeeping, and raw telemetry.

Telemetry rows are written with COPY by ingest.store and read by console.queries.telemetry;
they keep the contract's field names so a row turns back into a contract record unchanged.
DeviceSample, StepRecord, CollectiveWindow and ServingWindow are partitioned by day in
Postgres (migration 0002, ingest.partitions): the models stay managed and describe the
columns and indexes; the real primary key is (id, ts), which Django need not know since
`id` alone is unique (one sequence). Foreign keys carry no index of their own: every read
leads with group or gpu, and each index costs the 8-rows-per-GPU-per-second insert path.
`stale` marks records from a generation older than the group's active one: stored for
the evidence, never applied to live state.
"""

from __future__ import annotations

from django.contrib.postgres.indexes import BrinIndex
from django.db import models

from console.models import ConsistencyGroup, Node


class AgentCredential(models.Model):
    """An agent token, bound to one node; only its SHA-256 is stored.

    A launcher token (`launcher_group` set) may also send transitions of that one group
    from a node that hosts none of its ranks (docs/security.md, trust model).
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="credentials")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    launcher_group = models.CharField(max_length=128, blank=True, default="")
    created = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.node.name})"


class AgentState(models.Model):
    """What an operator checks after an outage: batches, replays, gaps and clock skew."""

    agent_id = models.CharField(max_length=64, unique=True)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="agents")
    version = models.CharField(max_length=32, blank=True, default="")
    boot_id = models.CharField(max_length=64, blank=True, default="")
    last_seq = models.BigIntegerField(null=True)
    batches = models.BigIntegerField(default=0)
    records = models.BigIntegerField(default=0)
    duplicates = models.BigIntegerField(default=0)
    gaps = models.BigIntegerField(default=0)
    gap_ranges = models.JSONField(default=list, blank=True)  # newest 100 [first, last] ranges
    # Receipts with seq <= this were pruned (ingest.retention): below it a seq outside
    # `gap_ranges` was already stored, so a replay is known without its receipt.
    receipts_pruned_through = models.BigIntegerField(null=True, blank=True)
    last_seen = models.DateTimeField(null=True)
    clock_skew_ms = models.FloatField(null=True)
    spool_depth = models.BigIntegerField(default=0)
    dropped = models.BigIntegerField(default=0)
    # The scheduler jobs its newest heartbeat attests run on its node (None: it has no
    # scheduler to ask). A group bound to a job takes ranks and transitions only from
    # nodes whose agent attests it (ingest.ownership).
    jobs = models.JSONField(null=True, blank=True)

    def __str__(self) -> str:
        return self.agent_id


class GroupMember(models.Model):
    """A node that may place the ranks of a group not bound to a scheduler job: it placed
    one during the group's first rendezvous, or a host or the launcher declared it for a
    generation (a transition's `nodes`). Written by ingest only (ingest.ownership).

    Keyed by the node's name, not its row: a declared spare may not have reported yet. A
    node a later declaration left out keeps its row with the generation it left at: its
    old process still writing is the group's split brain, not a stranger's claim.
    """

    group = models.ForeignKey(ConsistencyGroup, on_delete=models.CASCADE, related_name="+")
    node = models.CharField(max_length=128)
    left_generation = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["group", "node"], name="group_member_unique")
        ]

    def __str__(self) -> str:
        return f"{self.group_id}:{self.node_id}"


class BatchReceipt(models.Model):
    """(agent_id, seq) seen once: the idempotency key of the contract.

    Kept for `FAULTLINE_RECEIPT_RETENTION_HOURS` only; older ones are pruned and the
    agent's high-water mark plus its gap list answer for them (ingest.store.receipts).
    """

    agent_id = models.CharField(max_length=64)
    seq = models.BigIntegerField()
    received_at = models.DateTimeField()
    records = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent_id", "seq"], name="batch_once_per_agent_seq")
        ]

    def __str__(self) -> str:
        return f"{self.agent_id}#{self.seq}"


class DeviceSample(models.Model):
    """Periodic GPU health sample (contract kind `device_sample`)."""

    ts = models.DateTimeField()
    node = models.ForeignKey(Node, on_delete=models.CASCADE, db_constraint=False, db_index=False)
    gpu = models.CharField(max_length=96)
    index = models.PositiveIntegerField()
    temp_c = models.FloatField(null=True)
    power_w = models.FloatField(null=True)
    sm_clock_mhz = models.FloatField(null=True)
    mem_clock_mhz = models.FloatField(null=True)
    util_pct = models.FloatField(null=True)
    mem_used_bytes = models.BigIntegerField(null=True)
    ecc_sbe = models.BigIntegerField(null=True)
    ecc_dbe = models.BigIntegerField(null=True)
    retired_or_remapped_pending = models.BigIntegerField(null=True)
    throttle_reasons = models.JSONField(default=list)
    nvlink_errors = models.BigIntegerField(null=True)
    pcie_replays = models.BigIntegerField(null=True)
    mem_util_pct = models.FloatField(null=True)  # NVML's memory utilisation: a percentage

    class Meta:
        # BRIN on ts: minute rollups scan by time; rows arrive roughly in time order.
        indexes = [
            models.Index(fields=["gpu", "-ts"]),
            BrinIndex(fields=["ts"], name="ingest_devi_ts_brin"),
        ]

    def __str__(self) -> str:
        return f"{self.gpu} {self.ts:%H:%M:%S}"


class DeviceEvent(models.Model):
    """Xid, DBE, thermal or gpu_lost event, sent the moment NVML raises it."""

    ts = models.DateTimeField()
    node = models.ForeignKey(Node, on_delete=models.CASCADE, db_constraint=False)
    gpu = models.CharField(max_length=96)
    event = models.CharField(max_length=64)
    code = models.IntegerField(null=True)
    detail = models.CharField(max_length=256, null=True)
    # The driver's GPU recovery action when the event was read (none, gpu_reset, ...).
    recovery_action = models.CharField(max_length=32, null=True)

    class Meta:
        indexes = [models.Index(fields=["gpu", "-ts"]), models.Index(fields=["node", "-ts"])]

    def __str__(self) -> str:
        return f"{self.event} {self.code} on {self.gpu}"


class _GroupRecord(models.Model):
    ts = models.DateTimeField()
    node = models.ForeignKey(Node, on_delete=models.CASCADE, db_constraint=False, db_index=False)
    group = models.ForeignKey(
        ConsistencyGroup, on_delete=models.CASCADE, db_constraint=False, db_index=False
    )
    generation = models.PositiveIntegerField()
    stale = models.BooleanField(default=False)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{type(self).__name__} {self.group_id}@{self.generation} {self.ts:%H:%M:%S}"


class StepRecord(_GroupRecord):
    """One training step of one rank; loss may be NaN/Infinity and is kept as such."""

    rank = models.PositiveIntegerField()
    step = models.BigIntegerField()
    tokens = models.BigIntegerField(default=0)
    data_cursor = models.BigIntegerField(null=True)
    duration_ms = models.FloatField(null=True)
    phases = models.JSONField(null=True)
    loss = models.FloatField(null=True)
    grad_norm = models.FloatField(null=True)
    loss_scale = models.FloatField(null=True)
    overflow = models.BooleanField(null=True)
    model_flops = models.FloatField(null=True)  # MFU's numerator (agents.flops)
    hw_flops = models.FloatField(null=True)  # HFU's: rematerialisation included
    lr = models.FloatField(null=True)

    class Meta:
        indexes = [
            models.Index(fields=["group", "generation", "-ts"]),
            models.Index(fields=["group", "rank", "-ts"]),
            BrinIndex(fields=["ts"], name="ingest_step_ts_brin"),
        ]


class CollectiveWindow(_GroupRecord):
    """A rank's latest window of collective calls (seq, pg, op, numel, dtype, state)."""

    rank = models.PositiveIntegerField()
    entries = models.JSONField(default=list)

    class Meta:
        # The snapshot takes the newest window per rank of the active generation.
        indexes = [models.Index(fields=["group", "generation", "rank", "-ts"])]


class ProcessGroupsRecord(_GroupRecord):
    """The process groups one rank belongs to (pg, size, member ranks), once per generation."""

    rank = models.PositiveIntegerField()
    groups = models.JSONField(default=list)

    class Meta:
        # The snapshot takes the newest report per rank of the active generation.
        indexes = [models.Index(fields=["group", "generation", "rank", "-ts"])]


class ProcessRecord(_GroupRecord):
    """A rank process started or exited (exit code, signal, reason such as oom)."""

    rank = models.PositiveIntegerField()
    event = models.CharField(max_length=16)
    pid = models.BigIntegerField(null=True)
    gpu = models.CharField(max_length=96, null=True)
    exit_code = models.IntegerField(null=True)
    signal = models.IntegerField(null=True)
    reason = models.CharField(max_length=64, null=True)
    error_type = models.CharField(max_length=128, null=True)
    message = models.CharField(max_length=256, null=True)  # scrubbed (ingest/scrub.py)
    # The launcher that named this exit its root cause ("torchelastic"), else NULL.
    launcher_root_cause = models.CharField(max_length=64, null=True)

    class Meta:
        indexes = [models.Index(fields=["group", "-ts"])]


class CheckpointRecord(_GroupRecord):
    """A checkpoint phase change with its manifest (shards, sizes, checksums)."""

    checkpoint_id = models.CharField(max_length=128)
    step = models.BigIntegerField(null=True)
    phase = models.CharField(max_length=16)
    manifest = models.JSONField(null=True)
    duration_ms = models.FloatField(null=True)
    detail = models.CharField(max_length=256, null=True)
    data_cursor = models.BigIntegerField(null=True)  # where a restore resumes

    class Meta:
        indexes = [models.Index(fields=["group", "checkpoint_id", "ts"])]


class TransitionRecord(_GroupRecord):
    """A group state-machine transition; the only record that may raise the generation."""

    from_state = models.CharField(max_length=16, null=True)
    to_state = models.CharField(max_length=16)
    reason = models.CharField(max_length=64, null=True)
    restart_count = models.IntegerField(null=True)
    world_size = models.IntegerField(null=True)
    topology = models.JSONField(null=True)
    data_cursor = models.BigIntegerField(null=True)
    model_version = models.CharField(max_length=128, null=True)

    class Meta:
        indexes = [models.Index(fields=["group", "ts"])]


class ServingWindow(_GroupRecord):
    """One serving worker's counters over a window (requests, SLO met, latency, KV)."""

    worker = models.CharField(max_length=128)
    model_version = models.CharField(max_length=128, null=True)
    adapter_version = models.CharField(max_length=128, null=True)
    kv_schema = models.CharField(max_length=128, null=True)
    ready = models.BooleanField(default=False)
    draining = models.BooleanField(default=False)
    window = models.JSONField(default=dict)

    class Meta:
        indexes = [models.Index(fields=["group", "-ts"])]


class ProbeRecord(_GroupRecord):
    """A correctness probe's answer: a fixed input's loss or output checksum.

    Event-sized (every N steps per rank, or every few seconds per serving worker), so not
    partitioned; the diagnosis compares answers across ranks at one step and over time.
    """

    probe = models.CharField(max_length=64)
    rank = models.PositiveIntegerField(null=True)
    worker = models.CharField(max_length=128, null=True)
    step = models.BigIntegerField(null=True)
    value = models.FloatField(null=True)
    checksum = models.CharField(max_length=128, null=True)
    duration_ms = models.FloatField(null=True)
    model_version = models.CharField(max_length=128, null=True)

    class Meta:
        indexes = [models.Index(fields=["group", "generation", "-ts"])]


class ContractViolation(models.Model):
    """A correctness-contract breach seen at ingest (stale generation, non-monotonic...).

    Ownership refusals that name no group (a GPU another node owns, a node over its
    device or new-group limit) have no group; their subject names the GPU or node.
    """

    ts = models.DateTimeField()
    group = models.ForeignKey(ConsistencyGroup, on_delete=models.CASCADE, null=True, blank=True)
    generation = models.PositiveIntegerField()
    kind = models.CharField(max_length=48)
    subject = models.CharField(max_length=256)
    evidence = models.JSONField(default=dict)
    agent_id = models.CharField(max_length=64)

    class Meta:
        indexes = [models.Index(fields=["group", "-ts"])]

    def __str__(self) -> str:
        return f"{self.kind} {self.subject}"


class StepRollup(models.Model):
    """One group's training steps over one minute: p50/p99 step time, tokens, ranks.

    Maintained by ingest.rollups from non-stale StepRecord rows; a re-run recomputes the
    minute in place (unique group+minute), so late rows are folded in, never counted twice.
    """

    group = models.ForeignKey(ConsistencyGroup, on_delete=models.CASCADE, db_constraint=False)
    minute = models.DateTimeField()
    generation = models.PositiveIntegerField()
    steps = models.PositiveIntegerField()
    ranks = models.PositiveIntegerField()
    tokens = models.BigIntegerField()
    step_ms_p50 = models.FloatField(null=True)
    step_ms_p99 = models.FloatField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["group", "minute"], name="steprollup_group_minute")
        ]

    def __str__(self) -> str:
        return f"{self.group_id} {self.minute:%H:%M}"


class DeviceRollup(models.Model):
    """One node's GPU samples over one minute: hottest GPU, slowest SM clock, throttling."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, db_constraint=False)
    minute = models.DateTimeField()
    samples = models.PositiveIntegerField()
    gpus = models.PositiveIntegerField()
    max_temp_c = models.FloatField(null=True)
    min_sm_clock_mhz = models.FloatField(null=True)
    throttled_gpus = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "minute"], name="devicerollup_node_minute")
        ]

    def __str__(self) -> str:
        return f"{self.node_id} {self.minute:%H:%M}"


class StepBinRollup(models.Model):
    """One rank block's steps over one 5 s bucket: slowest, sum and count (the heatmap).

    Maintained by ingest.step_bins from non-stale StepRecord rows; `rank_lo` is the block's
    first rank (blocks are a power of two of ranks). A re-run recomputes the bucket in
    place (unique key), so late rows are folded in, never counted twice.
    """

    group = models.ForeignKey(
        ConsistencyGroup, on_delete=models.CASCADE, db_constraint=False, db_index=False
    )
    generation = models.PositiveIntegerField()
    bucket = models.DateTimeField()
    rank_lo = models.PositiveIntegerField()
    steps = models.PositiveIntegerField()
    max_ms = models.FloatField()
    sum_ms = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["group", "generation", "bucket", "rank_lo"], name="stepbin_key"
            )
        ]
        # The rollup's and retention's deletes go by bucket across groups.
        indexes = [models.Index(fields=["bucket"], name="stepbin_bucket")]

    def __str__(self) -> str:
        return f"{self.group_id}@{self.generation} {self.bucket:%H:%M:%S} r{self.rank_lo}"


class StepHistRollup(models.Model):
    """Step count per log-scale step-time bucket per 5 s bucket (the chart's percentiles)."""

    group = models.ForeignKey(
        ConsistencyGroup, on_delete=models.CASCADE, db_constraint=False, db_index=False
    )
    generation = models.PositiveIntegerField()
    bucket = models.DateTimeField()
    hist_bucket = models.IntegerField()  # floor(ln(step ms) * HIST_RESOLUTION)
    steps = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["group", "generation", "bucket", "hist_bucket"], name="stephist_key"
            )
        ]
        indexes = [models.Index(fields=["bucket"], name="stephist_bucket")]

    def __str__(self) -> str:
        return f"{self.group_id}@{self.generation} {self.bucket:%H:%M:%S} h{self.hist_bucket}"


class RollupMark(models.Model):
    """The bucket range [rolled_from, rolled_until) a fine rollup covers, by rollup name.

    Readers take rollup rows inside it and raw rows outside it; one row per rollup,
    written in the same transaction as the rollup rows.
    """

    name = models.CharField(max_length=32, primary_key=True)
    rolled_from = models.DateTimeField()
    rolled_until = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} [{self.rolled_from:%H:%M:%S}, {self.rolled_until:%H:%M:%S})"


# -- host, network and kernel evidence ------------------------------------------
# Event-sized tables (host_event, net_event) keep their rows: incidents cite them. The
# per-round samples (net_sample, host_sample) are trimmed to a day by retention.run; the
# snapshot reads only their newest row per node and port.
class HostEvent(models.Model):
    """A kernel-log line that matters: OOM kill, MCE, AER, hung task, I/O error, SXid."""

    ts = models.DateTimeField()
    node = models.ForeignKey(Node, on_delete=models.CASCADE, db_constraint=False)
    event = models.CharField(max_length=32)
    device = models.CharField(max_length=64, null=True)
    code = models.IntegerField(null=True)
    pid = models.BigIntegerField(null=True)
    comm = models.CharField(max_length=16, null=True)
    severity = models.CharField(max_length=16, null=True)

    class Meta:
        indexes = [models.Index(fields=["node", "-ts"])]

    def __str__(self) -> str:
        return f"{self.event} on node {self.node_id} {self.ts:%H:%M:%S}"


class NetEvent(models.Model):
    """A link flap, rate drop or moved error counters on one port of a node."""

    ts = models.DateTimeField()
    node = models.ForeignKey(Node, on_delete=models.CASCADE, db_constraint=False)
    port = models.CharField(max_length=64)
    link = models.CharField(max_length=8)
    event = models.CharField(max_length=16)
    state = models.CharField(max_length=64, null=True)
    rate_gbps = models.FloatField(null=True)
    prev_rate_gbps = models.FloatField(null=True)
    counters = models.JSONField(default=dict)

    class Meta:
        indexes = [models.Index(fields=["node", "-ts"])]

    def __str__(self) -> str:
        return f"{self.event} {self.port} {self.ts:%H:%M:%S}"


class NetSample(models.Model):
    """One port's state, rate and counter deltas, per agent round."""

    ts = models.DateTimeField()
    node = models.ForeignKey(Node, on_delete=models.CASCADE, db_constraint=False)
    port = models.CharField(max_length=64)
    link = models.CharField(max_length=8)
    state = models.CharField(max_length=64, null=True)
    rate_gbps = models.FloatField(null=True)
    counters = models.JSONField(default=dict)
    interval_s = models.FloatField(null=True)  # the counter deltas' span

    class Meta:
        indexes = [
            models.Index(fields=["node", "port", "-ts"]),
            BrinIndex(fields=["ts"], name="ingest_netsample_ts_brin"),
        ]

    def __str__(self) -> str:
        return f"{self.port} {self.ts:%H:%M:%S}"


class HostSample(models.Model):
    """Memory/I-O pressure, swap, D-state tasks and checkpoint disks of a node, per round."""

    ts = models.DateTimeField()
    node = models.ForeignKey(Node, on_delete=models.CASCADE, db_constraint=False)
    mem_some_avg10 = models.FloatField(null=True)
    mem_full_avg10 = models.FloatField(null=True)
    io_full_avg10 = models.FloatField(null=True)
    swap_used_bytes = models.BigIntegerField(null=True)
    swap_total_bytes = models.BigIntegerField(null=True)
    d_state = models.IntegerField(null=True)
    disks = models.JSONField(default=list)

    class Meta:
        indexes = [
            models.Index(fields=["node", "-ts"]),
            BrinIndex(fields=["ts"], name="ingest_hostsample_ts_brin"),
        ]

    def __str__(self) -> str:
        return f"host of node {self.node_id} {self.ts:%H:%M:%S}"
