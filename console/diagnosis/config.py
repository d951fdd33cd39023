"""Thresholds and defaults for the diagnosis engine.

Owns every tunable number the rules use, so docs/diagnosis.md and the code cannot drift.
Must not read settings or the environment: the caller builds a `DiagnosisConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.xid import XidCatalog, active


@dataclass(frozen=True, slots=True)
class DiagnosisConfig:
    """Tunable thresholds; defaults are documented in docs/diagnosis.md."""

    # progress: a rank is hung after max(multiplier x (median + k*MAD) step time, floor)
    hang_mad_k: float = 5.0
    hang_multiplier: float = 3.0
    # 4 s leaves room for the sweep (1 s) inside the goal: silent hang seen within
    # max(3 x median step, 5 s); a pass queued for the crossing itself usually comes
    # sooner (Diagnosis.next_check). The MAD term keeps jittery groups quiet.
    hang_floor_s: float = 4.0
    # a group that never reported a step is only stalled after this long in its generation
    warmup_timeout_s: float = 1800.0
    # a checkpoint in progress excuses silence for
    # min(checkpoint_grace_s, max(factor x its measured duration, floor)); the measure is
    # the longest of the quiet step's checkpoint phase and the group's recent checkpoints
    # (their duration_ms, or first event to commit). Unmeasured: the cap alone.
    checkpoint_grace_s: float = 1800.0
    checkpoint_grace_factor: float = 2.0
    checkpoint_grace_floor_s: float = 10.0
    # process: exits this much later than the first one are its teardown/cascade
    # (0: any later exit; gloo/NCCL peers raise within milliseconds of the first exit)
    cascade_tolerance_s: float = 0.0
    # process: a rank's death that no peer's error causes (SIGKILL, a crash signal) stamped
    # up to this long after the first exits, which are errors a peer's death sets off, is
    # their initiator: the launcher stamps the death when it reaps the process, after the
    # peers saw the connection drop. Under the 5 s an incident's verdict may be revised in
    # (docs/diagnosis.md, "Ordering"), with room for the record's delivery.
    ordering_tolerance_s: float = 3.0
    # nodes: heartbeat older than this counts as stopped
    heartbeat_timeout_s: float = 45.0
    # stragglers
    straggler_ratio: float = 1.25
    straggler_mad_k: float = 5.0
    straggler_min_steps: int = 3
    clock_drop_ratio: float = 0.9
    # numerics
    grad_explosion_factor: float = 10.0
    loss_scale_floor: float = 1.0
    loss_scale_collapse_factor: float = 1024.0
    # probes: answers to a fixed input agree within this relative tolerance (data-parallel
    # ranks share weights, so their fixed-batch loss is equal up to reduction order)
    probe_rel_tol: float = 1e-5
    # devices: cumulative NVLink error counter above which a link is suspect
    nvlink_errors_limit: int = 10
    # restarts: more than `retry_limit` restarts within `retry_window_s` is a storm
    retry_window_s: float = 3600.0
    retry_limit: int = 3
    # goodput window
    goodput_window_s: float = 3600.0
    # serving
    slo_target: float = 0.95
    serving_retry_ratio: float = 0.1
    serving_retry_min: int = 20
    # host: kernel events older than this explain nothing now; a checkpoint
    # disk with at most this fraction free is full
    host_event_window_s: float = 1800.0
    disk_full_free_fraction: float = 0.01
    # evidence lists are capped so 4,096-rank findings stay small
    max_evidence_items: int = 16
    # the Xid catalog with the operator's overrides (agents/xid.py; the service installs
    # FAULTLINE_XID_OVERRIDES at startup, so the default is the process's active catalog)
    xids: XidCatalog = field(default_factory=active)
