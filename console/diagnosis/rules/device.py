"""Device rule family: Xid, ECC, lost GPUs, row remaps, throttling, NVLink errors.

Owns one finding per GPU fault, judged by the Xid catalog (agents/xid.py, with the
operator's overrides, via `DiagnosisConfig.xids`): hardware-class Xids, lost GPUs and
DBEs are root causes for the ranks on the GPU and take the node out; application-class
Xids stand on the rank as an application root cause (the process rule folds them under
the rank's exit); consequence-class Xids are symptoms of what they follow; informational
ones are minor; codes NVIDIA does not list are undetermined. Must not judge step times:
slowdown attribution lives in `stragglers`.
"""

from __future__ import annotations

from dataclasses import replace

from agents import xid as catalog
from agents.gpu_health import WARNING_REASONS, throttle_kind

from console.diagnosis.findings import (
    CRITICAL,
    MAJOR,
    MINOR,
    ROOT_CAUSE,
    SEVERITY_RANK,
    SYMPTOM,
    UNDETERMINED,
    Finding,
    gpu_subject,
    rank_subject,
)
from console.diagnosis.rules.base import Context
from console.diagnosis.snapshot import DeviceEvent, DeviceState

# Hardware buckets that stop the GPU outright; the others (NVLink workflows, support,
# mechanics, firmware) are major until the driver's recovery action says more.
CRITICAL_BUCKETS = frozenset(
    {"RESET_GPU", "RESTART_BM", "RESTART_VM", "WORKFLOW_XID_48", "XID_154"}
)


def _where(ctx: Context, dev: DeviceState) -> str:
    ranks = sorted(ctx.ranks_on_gpu.get(dev.gpu, ()))
    label = ctx.gpu_label(dev.gpu)
    if not ranks:
        return label
    names = ", ".join(str(r) for r in ranks[:4])
    return f"{label} (rank {names})" if len(ranks) == 1 else f"{label} (ranks {names})"


class _Judged:
    """One Xid event with its catalog row and the class it acts with."""

    __slots__ = ("cls", "event", "info", "recovery")

    def __init__(self, ctx: Context, event: DeviceEvent, recovery: str | None = None) -> None:
        self.event = event
        self.info = ctx.cfg.xids.get(event.code)
        self.recovery = event.recovery_action or recovery
        self.cls = catalog.effective_class(self.info, self.recovery)

    @property
    def severity(self) -> str:
        if self.cls != catalog.HARDWARE:
            return MAJOR
        if self.info.immediate in CRITICAL_BUCKETS or catalog.recovery_requires_action(
            self.recovery
        ):
            return CRITICAL
        return MAJOR


def _judge(ctx: Context, events: tuple[DeviceEvent, ...]) -> list[_Judged]:
    """The GPU's Xids, each judged with the recovery action its other witness carried: the
    agent sends a second sighting of one Xid (NVML's and the kernel log's, within the dedup
    window) when it adds a recovery action, and the pair is one Xid, judged once."""
    xids = [e for e in events if e.event == "xid"]
    known = [e for e in xids if e.recovery_action is not None]
    out = []
    for e in xids:
        recovery = None
        if e.recovery_action is None and known:
            recovery = next(
                (
                    k.recovery_action
                    for k in known
                    if k.code == e.code
                    and abs((k.ts - e.ts).total_seconds()) <= catalog.DEDUP_WINDOW_S
                ),
                None,
            )
        out.append(_Judged(ctx, e, recovery))
    return out


def _recovery_action(events: list[DeviceEvent]) -> str | None:
    """The newest recovery action the driver reported for this GPU."""
    for e in reversed(events):
        if e.recovery_action is not None:
            return e.recovery_action
    return None


def _advice(info: catalog.XidInfo, recovery: str | None, cls: str) -> str:
    """The bucket's action and, when the driver asks for one, its recovery action."""
    if cls == catalog.APPLICATION and info.immediate == "IGNORE":
        # NVIDIA: nothing to do to the GPU (43, 137); the faulted program still restarts.
        return catalog.IMMEDIATE_ACTIONS["RESTART_APP"]
    if catalog.recovery_requires_action(recovery):
        said = catalog.RECOVERY_ACTIONS[recovery or ""]
        if info.immediate == "XID_154":
            return said
        return f"{info.action}; {said}"
    return info.action


def _xid_evidence(ctx: Context, dev: DeviceState, group: list[_Judged]) -> dict[str, object]:
    lead = group[0]
    info = lead.info
    recovery = _recovery_action([j.event for j in group])
    return {
        "gpu": dev.gpu,
        "node": dev.node,
        "index": dev.index,
        "ranks": ctx.capped(sorted(ctx.ranks_on_gpu.get(dev.gpu, ()))),
        "code": info.code,
        "codes": sorted({j.event.code for j in group if j.event.code is not None}),
        "mnemonic": info.mnemonic,
        "meaning": info.meaning,
        "xid_class": lead.cls,
        "immediate": info.immediate,
        "investigatory": info.investigatory,
        "action": _advice(info, recovery, lead.cls),
        "recovery_action": recovery,
        "applies_to": list(info.gpus),
        "overridden": info.overridden,
        "takes_gpu_out": lead.cls == catalog.HARDWARE,
        "detail": lead.event.detail,
        "event_ts": lead.event.ts,
    }


def _hard_fault(ctx: Context, dev: DeviceState, judged: list[_Judged]) -> Finding | None:
    """At most one hardware root cause per GPU: the worst hardware Xid, else loss, else DBE."""
    hard = [j for j in judged if j.cls == catalog.HARDWARE]
    lost = [e for e in dev.events if e.event == "gpu_lost"]
    dbe = [e for e in dev.events if e.event == "ecc_dbe"]
    sample = dev.sample
    if not (hard or lost or dbe or (sample is not None and (sample.ecc_dbe or 0) > 0)):
        return None  # the common case, checked before building any evidence
    ev: dict[str, object] = {
        "gpu": dev.gpu,
        "node": dev.node,
        "index": dev.index,
        "ranks": ctx.capped(sorted(ctx.ranks_on_gpu.get(dev.gpu, ()))),
        "takes_gpu_out": True,
    }
    if hard:
        # Xid 154 only summarises the action another Xid needs: name that Xid when present.
        hard.sort(
            key=lambda j: (j.info.immediate == "XID_154", SEVERITY_RANK[j.severity], j.event.ts)
        )
        lead = hard[0]
        kind, sev = "xid", min((j.severity for j in hard), key=SEVERITY_RANK.__getitem__)
        events = [j.event for j in hard]
        summary = f"Xid {lead.info.code} on {_where(ctx, dev)}: {lead.info.meaning}"
        ev = _xid_evidence(ctx, dev, hard) | {"also": sorted({e.event for e in lost + dbe})}
        if lost or dbe:
            sev = CRITICAL  # a lost GPU or DBE next to the Xid is fatal whatever its bucket
    elif lost:
        kind, sev, events = "gpu_lost", CRITICAL, lost
        summary = f"GPU lost on {_where(ctx, dev)}: the GPU fell off the bus"
        ev |= {"event_ts": lost[-1].ts, "detail": lost[-1].detail}
    elif dbe or (sample is not None and (sample.ecc_dbe or 0) > 0):
        kind, sev, events = "ecc_dbe", CRITICAL, dbe
        summary = f"Double-bit ECC error on {_where(ctx, dev)}"
        ev |= {"ecc_dbe": None if sample is None else sample.ecc_dbe}
    else:
        return None
    # No events means the sample's DBE count chose this branch, so there is a sample.
    times = sorted(e.ts for e in events) or ([sample.ts] if sample is not None else [])
    return ctx.put(
        ctx.new(
            kind=kind,
            subject=gpu_subject(dev.gpu),
            role=ROOT_CAUSE,
            severity=sev,
            summary=summary,
            first_seen=times[0],
            last_seen=times[-1],
            evidence=ev,
        )
    )


def _put_xid(
    ctx: Context,
    dev: DeviceState,
    group: list[_Judged],
    *,
    subject: str,
    role: str,
    severity: str,
    summary: str,
    caused_by: tuple[str, ...] = (),
    extra: dict[str, object] | None = None,
) -> Finding:
    times = sorted(j.event.ts for j in group)
    return ctx.put(
        ctx.new(
            kind="xid",
            subject=subject,
            role=role,
            severity=severity,
            summary=summary,
            first_seen=times[0],
            last_seen=times[-1],
            evidence=_xid_evidence(ctx, dev, group) | (extra or {}),
            caused_by=caused_by,
            key=group[0].cls,
        )
    )


def _soft_xids(ctx: Context, dev: DeviceState, judged: list[_Judged], hard: Finding | None) -> None:
    """Application, consequence, informational and undetermined Xids on one GPU."""
    by_class: dict[str, list[_Judged]] = {}
    for j in judged:
        if j.cls != catalog.HARDWARE:
            by_class.setdefault(j.cls, []).append(j)
    if not by_class:
        return  # the common case: nothing below has anything to say
    for group in by_class.values():
        group.sort(key=lambda j: j.event.ts)
    where = _where(ctx, dev)
    if hard is not None:
        # Whatever else the GPU logged around a hardware fault follows from it.
        for cls, group in by_class.items():
            codes = ", ".join(str(j.info.code) for j in group)
            _put_xid(
                ctx,
                dev,
                group,
                subject=gpu_subject(dev.gpu),
                role=SYMPTOM,
                severity=MINOR,
                summary=f"Xid {codes} on {where} ({cls}), after "
                f"{hard.kind} {hard.evidence.get('code') or ''}".rstrip(),
                caused_by=(hard.id,),
            )
        return
    ranks = sorted(ctx.ranks_on_gpu.get(dev.gpu, ()))
    # An application's Xid is evidence on its process: the rank, when the GPU has one.
    owner = rank_subject(ctx.snap.group, ranks[0]) if len(ranks) == 1 else gpu_subject(dev.gpu)
    app: Finding | None = None
    if apps := by_class.get(catalog.APPLICATION):
        group = apps
        info = group[0].info
        app = _put_xid(
            ctx,
            dev,
            group,
            subject=owner,
            role=ROOT_CAUSE,
            severity=MAJOR,
            summary=f"Xid {info.code} on {where}: {info.meaning} (an application "
            "fault; the GPU stays in service)",
        )
    if after := by_class.get(catalog.CONSEQUENCE):
        group = after
        info = group[0].info
        if app is not None:
            _put_xid(
                ctx,
                dev,
                group,
                subject=gpu_subject(dev.gpu),
                role=SYMPTOM,
                severity=MINOR,
                summary=f"Xid {info.code} on {where}: {info.meaning}, "
                f"after Xid {app.evidence['code']}",
                caused_by=(app.id,),
            )
        else:
            # Alone, or after a kill the process rule will see: minor until folded.
            _put_xid(
                ctx,
                dev,
                group,
                subject=owner,
                role=ROOT_CAUSE,
                severity=MINOR,
                summary=f"Xid {info.code} on {where}: {info.meaning}; no other error on this GPU",
            )
    if infos := by_class.get(catalog.INFORMATIONAL):
        group = infos
        info = group[0].info
        _put_xid(
            ctx,
            dev,
            group,
            subject=gpu_subject(dev.gpu),
            role=ROOT_CAUSE,
            severity=MINOR,
            summary=f"Xid {info.code} on {where}: {info.meaning} (informational)",
        )
    if unknown := by_class.get(catalog.UNDETERMINED):
        group = unknown
        info = group[0].info
        why = (
            "listed by NVIDIA as unused on Ampere and newer GPUs"
            if info.known and not info.gpus
            else "not in NVIDIA's Xid catalog"
            if not info.known
            else "NVIDIA lists no recovery but contacting support"
        )
        _put_xid(
            ctx,
            dev,
            group,
            subject=gpu_subject(dev.gpu),
            role=UNDETERMINED,
            severity=MAJOR,
            summary=f"Xid {info.code} on {where}: {why}",
            extra={
                "missing_evidence": f"Xid {info.code} is {why}: read the kernel "
                "log line and nvidia-smi -q, or ask NVIDIA support; add an "
                "override once it is classified"
            },
        )


def _soft_faults(ctx: Context, dev: DeviceState) -> bool:
    """The sample's soft faults; False when it has none (nothing emitted)."""
    s = dev.sample
    if s is None:
        return False
    # Only hardware slowdowns here; a software power cap alone is normal on a busy GPU and
    # becomes a finding only when `stragglers` sees it inflate compute time.
    kind = throttle_kind(r for r in s.throttle_reasons if r in WARNING_REASONS)
    nvlink = (s.nvlink_errors or 0) > ctx.cfg.nvlink_errors_limit
    if not (s.retired_or_remapped_pending or nvlink or kind is not None):
        return False  # the common case, checked before building any evidence
    subject = gpu_subject(dev.gpu)
    base = {"gpu": dev.gpu, "node": dev.node, "index": dev.index, "sample_ts": s.ts}
    where = _where(ctx, dev)
    if s.retired_or_remapped_pending:
        ctx.put(
            ctx.new(
                kind="row_remap_pending",
                subject=subject,
                role=ROOT_CAUSE,
                severity=MINOR,
                summary=f"Row remap pending on {where}: reset to apply",
                first_seen=s.ts,
                evidence={**base, "pending": s.retired_or_remapped_pending},
            )
        )
    if nvlink:
        ctx.put(
            ctx.new(
                kind="nvlink_errors",
                subject=subject,
                role=ROOT_CAUSE,
                severity=MAJOR,
                summary=f"{s.nvlink_errors} NVLink errors on {where}",
                first_seen=s.ts,
                evidence={
                    **base,
                    "nvlink_errors": s.nvlink_errors,
                    "limit": ctx.cfg.nvlink_errors_limit,
                },
            )
        )
    if kind is not None:
        ctx.put(
            ctx.new(
                kind=kind,
                subject=subject,
                role=ROOT_CAUSE,
                severity=MINOR,
                summary=f"{kind.replace('_', ' ').capitalize()} on {where}",
                first_seen=s.ts,
                evidence={
                    **base,
                    "throttle_reasons": list(s.throttle_reasons),
                    "temp_c": s.temp_c,
                    "power_w": s.power_w,
                    "sm_clock_mhz": s.sm_clock_mhz,
                },
            )
        )
    return True


def run(ctx: Context) -> None:
    """One hard fault per GPU (dominating) and, on GPUs without one, the soft faults.

    Only GPUs this group runs on: another job's GPU on a shared node is that job's
    incident, not this one's. When no rank's GPU is known, every GPU of the group's nodes
    is judged (better one extra page than a missed Xid); while a generation that follows
    another has no rank that says where it runs, only the events since it began
    (`Context.placement_unknown_since`).
    """
    used = ctx.ranks_on_gpu  # the GPUs of the ranks that name one
    # A GPU with no event whose sample shows no fault has nothing to say, whatever else the
    # pass holds (its findings would depend on the sample, the events and the NVLink limit
    # alone): one that is the very same DeviceState object as last pass (build_snapshot
    # keeps an unchanged GPU's) is not judged again. At 16k GPUs judging every clean GPU
    # was most of this rule's pass.
    memo = ctx.slot("device_clean")
    limit = ctx.cfg.nvlink_errors_limit
    since = ctx.placement_unknown_since
    was: dict[str, DeviceState] = {}
    # Judged clean with only the evidence since a restart says nothing of the whole.
    if memo is not None and memo.get("limit") == limit and memo.get("since") == since:
        was = memo.get("clean") or {}
        # The very same GPUs as last pass, every one judged then clean, for the same ranks'
        # GPUs: nothing to judge (a pass between two GPU samples walks no GPU).
        if (
            memo.get("devices") is ctx.snap.devices
            and memo.get("all_clean")
            and memo.get("used") == used.keys()
        ):
            return
    clean: dict[str, DeviceState] = {}
    judged_all = 0
    for dev in ctx.snap.devices:
        if used and dev.gpu not in used:
            continue
        judged_all += 1
        if was.get(dev.gpu) is dev:
            clean[dev.gpu] = dev
            continue
        judged_as = dev
        if since is not None:
            # A fault from before this generation belongs to the one it stopped (and to
            # the GPU's own node incident), not to a restart that may have moved away. A
            # sample's counters (DBE, NVLink errors, a pending remap) say nothing of when
            # the fault began: they wait for a rank to name the GPU.
            dev = replace(dev, events=tuple(e for e in dev.events if e.ts >= since), sample=None)
        judged = _judge(ctx, dev.events)
        hard = _hard_fault(ctx, dev, judged)
        _soft_xids(ctx, dev, judged, hard)
        if hard is None and not _soft_faults(ctx, dev) and not dev.events:
            clean[dev.gpu] = judged_as  # the snapshot's own object, as the memo compares
    if memo is not None:
        memo["limit"], memo["clean"], memo["since"] = limit, clean, since
        memo["devices"], memo["used"] = ctx.snap.devices, set(used)
        memo["all_clean"] = len(clean) == judged_all
