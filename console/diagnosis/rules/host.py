"""Host rule family: kernel-log evidence of a group's nodes, and checkpoint disks.

Owns `machine_check`, `pcie_aer`, `hung_task`, `io_error`, `nvswitch_error` and
`disk_full`, plus the lookups other rules use: `kernel_oom` (the OOM-killer
line behind a rank's exit, for `process`) and `net_evidence` (the port and counter behind
a slow collective, for `stragglers`). A full checkpoint disk is the root cause of the
checkpoint that failed on it: the finding names the disk, the checkpoint is its symptom.
Kernel Xid lines need nothing here: the agent sends them as device_event (one event with
NVML's), so the device rule files them. Must run after `checkpoints`, before `process`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from console.diagnosis.findings import (
    CRITICAL,
    MAJOR,
    MINOR,
    ROOT_CAUSE,
    SYMPTOM,
    UNDETERMINED,
    Finding,
    checkpoint_subject,
    node_subject,
)
from console.diagnosis.rules.base import IN_PROGRESS_PHASES, Context
from console.diagnosis.snapshot import HostEvent, NetEvent, ProcessRecord, RankState

# kernel event -> (finding kind, role, severity)
_KINDS: dict[str, tuple[str, str, str]] = {
    "mce": ("machine_check", ROOT_CAUSE, MAJOR),
    "aer_corrected": ("pcie_aer", ROOT_CAUSE, MINOR),
    "aer_nonfatal": ("pcie_aer", ROOT_CAUSE, MAJOR),
    "aer_fatal": ("pcie_aer", ROOT_CAUSE, CRITICAL),
    # A task stuck in D state is what something else (a disk, NFS, the driver) did.
    "hung_task": ("hung_task", UNDETERMINED, MAJOR),
    "io_error": ("io_error", ROOT_CAUSE, MAJOR),
    "sxid": ("nvswitch_error", ROOT_CAUSE, MINOR),
}
_WHAT = {
    "machine_check": "machine check (CPU/memory hardware error)",
    "pcie_aer": "PCIe AER error",
    "hung_task": "hung task (blocked in D state)",
    "io_error": "block I/O error",
    "nvswitch_error": "NVSwitch SXid",
}
# Counters whose movement means the link itself misbehaved (a flap or a bad cable).
LINK_COUNTERS = ("link_downed", "link_error_recovery", "carrier_changes")


def _lead(moved: dict[str, int]) -> str | None:
    """The counter to cite: the link's own (a flap) before error counts, then the largest."""
    flap = [c for c in LINK_COUNTERS if moved.get(c)]
    return flap[0] if flap else max(moved, key=lambda k: moved[k]) if moved else None


def _node_ranks(ctx: Context, node: str | None) -> list[int]:
    return sorted(ctx.ranks_on_node.get(node or "", ()))


def kernel_oom(ctx: Context, r: RankState, p: ProcessRecord) -> HostEvent | None:
    """The OOM-killer line that killed this rank's process: same node, same pid, or (no
    pid reported) a kill within a minute before the exit."""
    for e in reversed(ctx.snap.host_events):
        if e.event != "oom_kill" or e.node != r.node:
            continue
        if p.pid is not None and e.pid == p.pid:
            return e
        if p.pid is None and timedelta(0) <= p.ts - e.ts <= timedelta(seconds=60):
            return e
    return None


def net_evidence(ctx: Context, node: str, since_s: float) -> dict[str, object] | None:
    """The port and the counters that moved on `node` (net events first, then the newest
    samples' error counters), or None when no port of the node moved."""
    since = ctx.now - timedelta(seconds=since_s)
    events = [e for e in ctx.snap.net_events if e.node == node and e.ts >= since]

    def rank_of(e: NetEvent) -> tuple[int, object]:
        flap = e.event in ("link_down", "link_up") or any(e.counters.get(c) for c in LINK_COUNTERS)
        return (0 if flap else 1 if e.event == "rate_drop" else 2, e.ts)

    if events:
        worst = min(events, key=rank_of)
        moved: dict[str, int] = {}
        for e in events:
            if e.port == worst.port:
                for k, v in e.counters.items():
                    moved[k] = moved.get(k, 0) + v
        what = (
            "link flap"
            if rank_of(worst)[0] == 0
            else "rate drop"
            if worst.event == "rate_drop"
            else "error counters"
        )
        return {
            "port": worst.port,
            "link": worst.link,
            "net_event": worst.event,
            "what": what,
            "counters": dict(sorted(moved.items())),
            "counter": _lead(moved),
            "rate_gbps": worst.rate_gbps,
            "prev_rate_gbps": worst.prev_rate_gbps,
            "state": worst.state,
            "at": worst.ts,
        }
    for port in ctx.snap.net_ports:
        moved = {k: v for k, v in port.counters.items() if v > 0 and k != "port_xmit_wait"}
        if port.node == node and moved:
            return {
                "port": port.port,
                "link": port.link,
                "what": "error counters",
                "counters": dict(sorted(moved.items())),
                "counter": _lead(moved),
                "rate_gbps": port.rate_gbps,
                "state": port.state,
                "at": port.ts,
            }
    return None


def net_missing(ctx: Context, node: str) -> str:
    """Why network_slow has no port evidence on `node`."""
    if any(p.node == node for p in ctx.snap.net_ports):
        return f"no port counter moved on {node}"
    return f"no network counters from {node} (agent without host evidence, or no HCA)"


def _kernel_findings(ctx: Context) -> None:
    since = ctx.now - timedelta(seconds=ctx.cfg.host_event_window_s)
    if (restart := ctx.placement_unknown_since) is not None:
        since = max(since, restart)  # the nodes may still be the last generation's
    grouped: dict[tuple[str, str | None, str | None], list[HostEvent]] = {}
    for e in ctx.snap.host_events:
        if e.event in _KINDS and e.ts >= since:
            kind = _KINDS[e.event][0]
            grouped.setdefault((kind, e.node, e.device), []).append(e)
    for (kind, node, device), evs in sorted(grouped.items(), key=lambda kv: str(kv[0])):
        _, role, severity = max(
            (_KINDS[e.event] for e in evs), key=lambda k: {CRITICAL: 2, MAJOR: 1}.get(k[2], 0)
        )
        if kind == "nvswitch_error" and any(e.severity == "fatal" for e in evs):
            severity = CRITICAL
        last = evs[-1]
        where = f" on {device}" if device else ""
        ev: dict[str, object] = {
            "node": node,
            "device": device,
            "events": [e.event for e in evs][-ctx.cfg.max_evidence_items :],
            "count": len(evs),
            "codes": sorted({e.code for e in evs if e.code is not None})[:16],
            "ranks": ctx.capped(_node_ranks(ctx, node)),
            "source": "kernel_log",
        }
        if kind == "hung_task":
            ev["tasks"] = [{"pid": e.pid, "comm": e.comm} for e in evs][
                : ctx.cfg.max_evidence_items
            ]
            host = next((h for h in ctx.snap.hosts if h.node == node), None)
            ev["d_state"] = None if host is None else host.d_state
            ev["io_full_avg10"] = None if host is None else host.io_full_avg10
            ev["missing_evidence"] = "what the task waits on (disk, network filesystem, driver)"
        ctx.put(
            ctx.new(
                kind=kind,
                subject=node_subject(node or "?"),
                role=role,
                severity=severity,
                summary=f"{_WHAT[kind].capitalize()}{where} on {node or '?'}"
                + (f" ({len(evs)}x)" if len(evs) > 1 else ""),
                first_seen=evs[0].ts,
                last_seen=last.ts,
                evidence=ev,
                key=device or "",
            )
        )


def _failed_checkpoints(ctx: Context) -> list[str]:
    """Checkpoints that did not complete: still staging/written, or corrupt."""
    return [
        c.checkpoint_id
        for c in ctx.snap.checkpoints
        if c.phase in IN_PROGRESS_PHASES or c.phase == "corrupt"
    ]


def _disk_full(ctx: Context) -> None:
    limit = ctx.cfg.disk_full_free_fraction
    for host in ctx.snap.hosts:
        for disk in host.disks:
            if disk.free_bytes is None or not disk.total_bytes:
                continue
            if disk.free_bytes / disk.total_bytes > limit:
                continue
            failed = _failed_checkpoints(ctx)
            name = disk.device or disk.root
            f = ctx.put(
                ctx.new(
                    kind="disk_full",
                    subject=node_subject(host.node or "?"),
                    role=ROOT_CAUSE,
                    severity=MAJOR,
                    summary=f"Checkpoint disk {name} ({disk.root}) on {host.node or '?'} is "
                    f"full: {disk.free_bytes / 2**30:.1f} GiB free of "
                    f"{disk.total_bytes / 2**30:.0f} GiB",
                    first_seen=host.ts,
                    last_seen=host.ts,
                    evidence={
                        "node": host.node,
                        "device": disk.device,
                        "root": disk.root,
                        "free_bytes": disk.free_bytes,
                        "total_bytes": disk.total_bytes,
                        "io_errors": disk.io_errors,
                        "failed_checkpoints": failed[: ctx.cfg.max_evidence_items],
                    },
                    key=name,
                )
            )
            ctx.unsafe_reasons[f.id] = (
                f"checkpoint disk {name} on {host.node} is full: free space before restarting, "
                "or the next checkpoint fails too"
            )
            for cid in failed:
                _blame(ctx, cid, f)


def _blame(ctx: Context, checkpoint_id: str, disk: Finding) -> None:
    """File the failed checkpoint as the full disk's symptom."""
    subject = checkpoint_subject(ctx.snap.group, checkpoint_id)
    own = ctx.on(subject)
    for x in own:
        ctx.put(replace(x, role=SYMPTOM, caused_by=(disk.id,)))
        ctx.unsafe_reasons.pop(x.id, None)
    if own:
        return
    state = next(c for c in ctx.snap.checkpoints if c.checkpoint_id == checkpoint_id)
    ctx.put(
        ctx.new(
            kind="checkpoint_failed",
            subject=subject,
            role=SYMPTOM,
            severity=MAJOR,
            summary=f"Checkpoint {checkpoint_id} did not complete ({state.phase}): {disk.summary}",
            first_seen=state.events[0].ts,
            last_seen=state.events[-1].ts,
            evidence={
                "checkpoint_id": checkpoint_id,
                "step": state.step,
                "phases": [e.phase for e in state.events],
                "disk": disk.evidence.get("device") or disk.evidence.get("root"),
            },
            caused_by=(disk.id,),
        )
    )


def run(ctx: Context) -> None:
    _kernel_findings(ctx)
    _disk_full(ctx)
