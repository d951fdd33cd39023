"""The diagnosis engine: runs the rule registry in order and attaches recovery advice.

Owns the rule order (evidence first, collective correctness before timeouts, hangs
only for what nothing else explains, slowdowns last), the ordering of findings, the
`Recovery` of every root cause and the `Diagnosis` result. Must stay pure: no Django,
no I/O, no clock reads; the caller passes `now`. Same snapshot and `now`, same result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Any

from console.diagnosis.config import DiagnosisConfig
from console.diagnosis.findings import (
    MINOR,
    RISK_KINDS,
    ROOT_CAUSE,
    SEVERITY_RANK,
    UNDETERMINED,
    Finding,
    Recovery,
)
from console.diagnosis.goodput import Goodput, compute_goodput
from console.diagnosis.rules import (
    checkpoints,
    collectives,
    contracts,
    device,
    host,
    network,
    nodes,
    numerics,
    objectives,
    probes,
    process,
    progress,
    restarts,
    serving,
    stragglers,
)
from console.diagnosis.rules.base import HARD_DEVICE_KINDS, Context
from console.diagnosis.rules.digest import RankDigest
from console.diagnosis.snapshot import GroupSnapshot, StepRecord
from console.diagnosis.stats import median
from console.diagnosis.utilisation import node_throughput, utilisation

Rule = Callable[[Context], None]

# Order matters: a rule may link only to findings of rules before it.
RULES: tuple[tuple[str, Rule], ...] = (
    ("contracts", contracts.run),
    ("checkpoints", checkpoints.run),
    ("restarts", restarts.run),
    ("objectives", objectives.run),  # needs the valid checkpoint
    ("numerics", numerics.run),
    ("probes", probes.run),
    ("device", device.run),
    ("nodes", nodes.run),
    ("host", host.run),
    ("network", network.run),
    ("process", process.run),
    ("collectives", collectives.run),
    ("progress", progress.run),
    ("stragglers", stragglers.run),
    ("serving", serving.run),
)

# Root causes that need no restart at all: the group keeps running, slower or noisier.
NO_RESTART = (
    frozenset(
        {
            "thermal_throttle",
            "power_throttle",
            "row_remap_pending",
            "nvlink_errors",
            "agent_silent",
            "input_stall",
            "network_slow",
            "slo_breach",
            "checkpoint_partial",
            "checkpoint_corrupt",
            "checkpoint_missing_shard",
            "checkpoint_modified",
            # host evidence: the group keeps running; the node needs a look
            "machine_check",
            "pcie_aer",
            "nvswitch_error",
            "io_error",
        }
    )
    | RISK_KINDS
)  # a risk (RPO/RTO) needs no restart and never blocks one
# Root causes whose node must be left out of the restarted group.
EXCLUDE_NODE = HARD_DEVICE_KINDS | {"node_down"}
ROLE_ORDER = {"root_cause": 0, "undetermined": 1, "symptom": 2}


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Everything one `diagnose` call concluded about one group at `now`."""

    group: str
    generation: int
    at: datetime
    findings: tuple[Finding, ...]
    goodput: Goodput
    tail_ratio: float | None = None
    phase_medians_ms: dict[str, float] = field(default_factory=dict)
    step_scale_ms: dict[str, float] = field(default_factory=dict)  # median, straggler limit
    checkpoint: str | None = None  # newest valid checkpoint id
    recovery: Recovery | None = None  # group-level advice; None when nothing is wrong
    serving_state: dict[str, Any] | None = None  # serving groups only (rules.serving)
    utilisation: dict[str, Any] | None = None  # training groups: MFU, HFU, HBM, network
    # When a verdict may next change with no new record (a rank's hang threshold): the
    # pipeline schedules a pass for then (console.scheduling.schedule_check).
    next_check: datetime | None = None

    @property
    def root_causes(self) -> list[Finding]:
        return [f for f in self.findings if f.role == ROOT_CAUSE]

    def symptoms_of(self, finding_id: str) -> list[Finding]:
        return [f for f in self.findings if finding_id in f.caused_by]

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "generation": self.generation,
            "at": self.at.isoformat(),
            "findings": [f.to_dict() for f in self.findings],
            "goodput": self.goodput.to_dict(),
            "tail_ratio": self.tail_ratio,
            "phase_medians_ms": dict(self.phase_medians_ms),
            "step_scale_ms": dict(self.step_scale_ms),
            "checkpoint": self.checkpoint,
            "recovery": None if self.recovery is None else self.recovery.to_dict(),
            "serving_state": self.serving_state,
            "utilisation": self.utilisation,
        }


def _step_totals(ctx: Context) -> tuple[int, float | None] | None:
    """(newest step, median tokens per step) over every rank's steps; None without steps."""
    by_step: dict[int, int] = {}
    for r in ctx.snap.ranks:
        for s in ctx.steps(r):
            by_step[s.step] = by_step.get(s.step, 0) + (s.tokens or 0)
    if not by_step:
        return None
    return max(by_step), median(list(by_step.values()))


def _live_step_totals(ctx: Context, state: dict[str, Any]) -> tuple[int, float | None] | None:
    """`_step_totals` from per-step token totals kept between passes in `state` (the memo):
    a rank whose digest slid from the one already counted adds its appended steps and takes
    away its dropped ones (rules/digest.py lineage), any other change swaps its whole
    contribution. Token counts are integers, so the totals are exact whatever the order;
    a step with non-integer tokens makes the pass count from scratch."""
    digests = ctx.digests
    if any([d.inexact for d in digests.values()]):
        state.clear()
        return _step_totals(ctx)
    held: dict[int, RankDigest] = state.setdefault("held", {})  # rank -> digest counted
    tot: dict[int, list[int]] = state.setdefault("totals", {})  # step -> [tokens, steps]
    for rk, d in digests.items():
        had = held.get(rk)
        if had is d:
            continue
        if had is not None and d.base == had.serial:
            added, dropped = d.added, d.dropped
            if len(added) == 1 and len(dropped) <= 1:
                # The live shape (16k ranks a pass): `_count` spelled out for one step in,
                # at most one out.
                if dropped:
                    s = dropped[0]
                    got = tot.get(s.step)
                    if got is None:
                        tot[s.step] = [-(s.tokens or 0), -1]
                    else:
                        got[0] -= s.tokens or 0
                        got[1] -= 1
                        if not got[1]:
                            del tot[s.step]
                s = added[0]
                got = tot.get(s.step)
                if got is None:
                    tot[s.step] = [s.tokens or 0, 1]
                else:
                    got[0] += s.tokens or 0
                    got[1] += 1
                    if not got[1]:
                        del tot[s.step]
            else:
                if dropped:
                    _count(tot, dropped, -1)
                _count(tot, added, 1)
        else:
            if had is not None:
                _count(tot, had.cur, -1)
            _count(tot, d.cur, 1)
        held[rk] = d
    if len(held) != len(digests):  # every rank here is held: the others left
        for rk in [rk for rk in held if rk not in digests]:
            _count(tot, held.pop(rk).cur, -1)
    if not tot:
        return None
    return max(tot), median([t for t, _ in tot.values()])


def _count(tot: dict[int, list[int]], steps: tuple[StepRecord, ...], sign: int) -> None:
    for s in steps:
        tokens = sign * (s.tokens or 0)
        got = tot.get(s.step)
        if got is None:
            tot[s.step] = [tokens, sign]
            continue
        got[0] += tokens
        got[1] += sign
        if not got[1]:
            del tot[s.step]


def _losses(ctx: Context) -> tuple[int | None, int | None, float | None]:
    """Steps, tokens and GPU-hours lost if the group restarts from the valid checkpoint."""
    live = ctx.slot("step_totals_live")
    count = partial(_step_totals, ctx) if live is None else partial(_live_step_totals, ctx, live)
    totals = ctx.per_pass("step_totals", None, count)
    if totals is None:
        return None, None, None
    current, tokens_per_step = totals
    ckpt = ctx.valid_checkpoint
    base = ckpt.step if ckpt is not None and ckpt.step is not None else 0
    lost = max(current - base, 0)
    tokens = round(lost * tokens_per_step) if tokens_per_step is not None else None
    durs = ctx.median_duration_s
    gpu_h = round(lost * durs * len(ctx.snap.ranks) / 3600.0, 3) if durs is not None else None
    return lost, tokens, gpu_h


def _recovery(
    ctx: Context, f: Finding, losses: tuple[int | None, int | None, float | None]
) -> Recovery:
    """May automation restart the group for root cause `f`, from where, at what cost."""
    ckpt = ctx.valid_checkpoint
    ckpt_id = None if ckpt is None else ckpt.checkpoint_id
    storm = next(
        (r for fid, r in ctx.unsafe_reasons.items() if ctx.findings[fid].kind == "retry_storm"),
        None,
    )
    if f.role == UNDETERMINED:
        missing = f.evidence.get("missing_evidence") or f.summary
        return Recovery(
            False,
            f"cause undetermined ({missing}): a human must look before "
            "restarting, or the same fault recurs",
            ckpt_id,
            *losses,
        )
    if f.id in ctx.unsafe_reasons:
        return Recovery(False, ctx.unsafe_reasons[f.id], ckpt_id, *losses)
    if storm is not None:
        return Recovery(False, storm, ckpt_id, *losses)
    if f.kind in NO_RESTART or f.severity == MINOR:
        return Recovery(True, f"no restart needed: {f.summary}", ckpt_id)
    if ctx.restart_unsafe is not None:  # the group's data consistency
        return Recovery(False, ctx.restart_unsafe, ckpt_id, *losses)
    if ctx.snap.kind == "training" and ckpt is None:
        return Recovery(
            False, "no committed, checksummed checkpoint to restore from", None, *losses
        )
    where = f.evidence.get("node")
    reason = f"restart from checkpoint {ckpt_id}" if ckpt_id else "restart the worker"
    # An Xid takes its node out only when its class is hardware (agents/xid.py).
    if where and f.kind in EXCLUDE_NODE and f.evidence.get("takes_gpu_out", True):
        reason += f" without {where}"
    if f.evidence.get("action"):
        reason += f"; {f.evidence['action']}"
    return Recovery(True, reason, ckpt_id, *losses)


def _group_recovery(roots: list[Finding]) -> Recovery | None:
    if not roots:
        return None
    blocking = [f for f in roots if f.recovery is not None and not f.recovery.auto_restart_safe]
    lead = blocking[0] if blocking else roots[0]
    rec = lead.recovery
    if rec is None:  # every root cause got advice above; stay safe if that ever changes
        return Recovery(auto_restart_safe=False, reason=f"no advice for {lead.kind}")
    if blocking:
        return replace(rec, reason=f"{lead.kind} on {lead.subject}: {rec.reason}")
    return rec


def _heads(f: Finding) -> bool:
    """Root causes, and undetermined findings that head their own cluster, get advice."""
    return f.role == ROOT_CAUSE or (f.role == UNDETERMINED and not f.caused_by)


def _order(f: Finding) -> tuple[object, ...]:
    return (ROLE_ORDER[f.role], SEVERITY_RANK[f.severity], f.first_seen, f.kind, f.subject)


def diagnose(
    snapshot: GroupSnapshot,
    now: datetime,
    config: DiagnosisConfig | None = None,
    memo: dict[str, Any] | None = None,
) -> Diagnosis:
    """Run every rule over `snapshot` at `now`; root causes first, then symptoms.

    `memo` (optional, kept by the caller between passes: `LiveGroup.memo`) lets per-rank
    values of ranks whose `RankState` is unchanged be reused; the result is the same."""
    cfg = config or DiagnosisConfig()
    ctx = Context(snapshot, now, cfg, memo)
    for _name, rule in RULES:
        rule(ctx)
    losses = _losses(ctx)
    findings = [
        replace(f, recovery=_recovery(ctx, f, losses)) if _heads(f) else f
        for f in ctx.findings.values()
    ]
    findings.sort(key=_order)
    roots = [f for f in findings if f.role == ROOT_CAUSE and f.kind not in RISK_KINDS]
    unknown = [f for f in findings if f.role == UNDETERMINED and f.recovery is not None]
    return Diagnosis(
        group=snapshot.group,
        generation=snapshot.generation,
        at=now,
        findings=tuple(findings),
        goodput=compute_goodput(
            snapshot,
            now,
            window_s=cfg.goodput_window_s,
            stall_threshold_s=ctx.stall_threshold_s,
            per_rank=ctx.per_rank,
            live=ctx.slot("goodput_live"),
            digests=ctx.digests,
        ),
        tail_ratio=ctx.tail_ratio,
        phase_medians_ms=dict(ctx.phase_medians_ms),
        step_scale_ms=dict(ctx.step_scale_ms),
        checkpoint=None if ctx.valid_checkpoint is None else ctx.valid_checkpoint.checkpoint_id,
        recovery=_group_recovery([f for f in roots if f.severity != MINOR] or unknown or roots),
        serving_state=(
            serving.serving_state(snapshot.serving, snapshot.slo, now)
            if snapshot.kind == "serving" or snapshot.serving
            else None
        ),
        next_check=ctx.next_check,
        utilisation=None if snapshot.kind == "serving" else _utilisation(ctx, now),
    )


def _utilisation(ctx: Context, now: datetime) -> dict[str, Any] | None:
    """MFU and the rest (console.diagnosis.utilisation): a pass in which no rank changed,
    no GPU sample changed and the ports' throughput is the same reuses the last one."""
    snap = ctx.snap
    net = node_throughput(snap.net_ports, now)
    compute = partial(utilisation, snap, now, steps=ctx.steps, per_rank=ctx.per_rank, net=net)
    value: dict[str, Any] | None = ctx.per_pass("utilisation", (snap.devices, net), compute)
    return value
