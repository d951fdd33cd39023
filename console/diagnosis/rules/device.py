"""Device rule family: Xid, ECC, lost GPUs, row remaps, throttling, NVLink errors.

Owns the Xid catalogue (meaning, severity, operator action) and one finding per GPU
fault, each a root cause for the ranks on that GPU. Must not judge step times: slowdown
attribution lives in `stragglers`.
"""

from __future__ import annotations

from typing import NamedTuple

from agents.gpu_health import WARNING_REASONS, throttle_kind

from console.diagnosis.findings import (
    CRITICAL,
    MAJOR,
    MINOR,
    ROOT_CAUSE,
    SEVERITY_RANK,
    gpu_subject,
)
from console.diagnosis.rules.base import Context
from console.diagnosis.snapshot import DeviceState


class Xid(NamedTuple):
    meaning: str
    severity: str
    action: str


# NVIDIA Xid catalogue, the codes a training fleet meets most (docs.nvidia.com, Xid errors).
XIDS: dict[int, Xid] = {
    48: Xid("double-bit ECC error", CRITICAL, "drain the node, reset the GPU; RMA if it recurs"),
    62: Xid("internal micro-controller halt", CRITICAL, "reset the GPU or reboot the node"),
    63: Xid("ECC page retirement or row remap recorded", MINOR, "reset the GPU at the next drain"),
    64: Xid("ECC page retirement or row remap failed", CRITICAL, "drain the node and RMA the GPU"),
    74: Xid("NVLink error", MAJOR, "check NVLink/NVSwitch health, reset the GPU"),
    79: Xid("GPU fell off the bus", CRITICAL, "drain the node, reboot, inspect PCIe/power"),
    92: Xid("high single-bit ECC error rate", MINOR, "watch the GPU, schedule a reset"),
    94: Xid("contained ECC error", MAJOR, "restart the affected process; the GPU stays usable"),
    95: Xid("uncontained ECC error", CRITICAL, "reset the GPU; every process on it is lost"),
    119: Xid("GSP RPC timeout", CRITICAL, "reset the GPU or reboot the node"),
    120: Xid("GSP error", CRITICAL, "reset the GPU or reboot the node"),
    140: Xid("unrecovered ECC error", CRITICAL, "drain the node, reset the GPU"),
    154: Xid("GPU recovery action changed", MAJOR, "apply the recovery action nvidia-smi reports"),
}
UNKNOWN_XID = Xid("unclassified Xid", MAJOR, "look the code up in NVIDIA's Xid catalogue")


def classify_xid(code: int | None) -> Xid:
    """Meaning, severity and action for an Xid code (unknown codes are major)."""
    return XIDS.get(code, UNKNOWN_XID) if code is not None else UNKNOWN_XID


def _where(ctx: Context, dev: DeviceState) -> str:
    ranks = sorted(ctx.ranks_on_gpu.get(dev.gpu, ()))
    label = ctx.gpu_label(dev.gpu)
    if not ranks:
        return label
    names = ", ".join(str(r) for r in ranks[:4])
    return f"{label} (rank {names})" if len(ranks) == 1 else f"{label} (ranks {names})"


def _hard_fault(ctx: Context, dev: DeviceState) -> bool:
    """Emit at most one hard-fault root cause per GPU: the worst Xid, else loss, else DBE.

    Returns True when the fault stops the GPU's ranks (then soft faults are not reported:
    the hard fault dominates them). Minor Xids (63, 92) are reported but stop nothing.
    """
    xids = [e for e in dev.events if e.event == "xid"]
    lost = [e for e in dev.events if e.event == "gpu_lost"]
    dbe = [e for e in dev.events if e.event == "ecc_dbe"]
    sample = dev.sample
    ranks = sorted(ctx.ranks_on_gpu.get(dev.gpu, ()))
    ev: dict[str, object] = {
        "gpu": dev.gpu,
        "node": dev.node,
        "index": dev.index,
        "ranks": ctx.capped(ranks),
    }
    if xids:
        worst = min(xids, key=lambda e: (SEVERITY_RANK[classify_xid(e.code).severity], e.ts))
        info = classify_xid(worst.code)
        kind, sev, events = "xid", info.severity, xids
        summary = f"Xid {worst.code} on {_where(ctx, dev)}: {info.meaning}"
        ev |= {
            "code": worst.code,
            "codes": sorted({e.code for e in xids if e.code is not None}),
            "meaning": info.meaning,
            "action": info.action,
            "detail": worst.detail,
            "event_ts": worst.ts,
            "also": sorted({e.event for e in lost + dbe}),
        }
        if sev == MINOR and (lost or dbe):
            sev = CRITICAL  # a lost GPU or DBE next to a bookkeeping Xid is still fatal
    elif lost:
        kind, sev, events = "gpu_lost", CRITICAL, lost
        summary = f"GPU lost on {_where(ctx, dev)}: the GPU fell off the bus"
        ev |= {"event_ts": lost[-1].ts, "detail": lost[-1].detail}
    elif dbe or (sample is not None and (sample.ecc_dbe or 0) > 0):
        kind, sev, events = "ecc_dbe", CRITICAL, dbe
        summary = f"Double-bit ECC error on {_where(ctx, dev)}"
        ev |= {"ecc_dbe": None if sample is None else sample.ecc_dbe}
    else:
        return False
    # No events means the sample's DBE count chose this branch, so there is a sample.
    times = [e.ts for e in events] or ([sample.ts] if sample is not None else [])
    ctx.put(
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
    return sev != MINOR


def _soft_faults(ctx: Context, dev: DeviceState) -> None:
    s = dev.sample
    if s is None:
        return
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
    if (s.nvlink_errors or 0) > ctx.cfg.nvlink_errors_limit:
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
    # Only hardware slowdowns here; a software power cap alone is normal on a busy GPU and
    # becomes a finding only when `stragglers` sees it inflate compute time.
    kind = throttle_kind(r for r in s.throttle_reasons if r in WARNING_REASONS)
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


def run(ctx: Context) -> None:
    """One hard fault per GPU (dominating) and, on GPUs without one, the soft faults.

    Only GPUs this group runs on: another job's GPU on a shared node is that job's
    incident, not this one's. When no rank's GPU is known, every GPU of the group's nodes
    is judged (better one extra page than a missed Xid).
    """
    used = {r.gpu for r in ctx.snap.ranks if r.gpu}
    for dev in ctx.snap.devices:
        if used and dev.gpu not in used:
            continue
        if not _hard_fault(ctx, dev):
            _soft_faults(ctx, dev)
