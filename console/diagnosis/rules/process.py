"""Process rule family: a rank's process exited, ran out of memory or raised.

Owns `process_exit`, `oom` and `exception`, and spotting a deterministic OOM (the same
step failing again after a restart). The first exit of a generation is the
initiator; later exits (launcher teardown, peers' NCCL errors) are its symptoms. An
application or consequence Xid on the rank's GPU (agents/xid.py class) folds under the
exit as its evidence: the program faulted, the GPU did not. Must run after `device` so a
crash explained by the rank's GPU is filed as that GPU's symptom, not as a second root
cause.
"""

from __future__ import annotations

from dataclasses import replace

from agents import xid as catalog

from console.diagnosis.findings import (
    CRITICAL,
    MAJOR,
    ROOT_CAUSE,
    SYMPTOM,
    Finding,
    gpu_subject,
    rank_subject,
)
from console.diagnosis.rules.base import TERMINAL_STATES, Context
from console.diagnosis.rules.host import kernel_oom
from console.diagnosis.snapshot import ProcessRecord, RankState


def _step_at(r: RankState, p: ProcessRecord) -> int | None:
    """The last step the rank reported before `p` (in p's generation)."""
    steps = [s.step for s in r.steps if s.generation == p.generation and s.ts <= p.ts]
    return steps[-1] if steps else None


def _kind(p: ProcessRecord) -> str:
    if p.reason == "oom":
        return "oom"
    if p.reason == "exception":
        return "exception"
    return "process_exit"


def deterministic_ooms(ctx: Context) -> dict[int, list[int]]:
    """Step -> generations in which some rank went OOM at that step (2+ = deterministic)."""
    by_step: dict[int, set[int]] = {}
    for r in ctx.snap.ranks:
        for p in r.processes:
            if p.event == "exited" and p.reason == "oom":
                step = _step_at(r, p)
                if step is not None:
                    by_step.setdefault(step, set()).add(p.generation)
    return {s: sorted(g) for s, g in by_step.items() if len(g) > 1}


PROCESS_XID_CLASSES = frozenset({catalog.APPLICATION, catalog.CONSEQUENCE})


def _process_xids(ctx: Context, r: RankState, gpu: str | None) -> list[Finding]:
    """Application/consequence Xid findings the device rule left standing for this rank."""
    subjects = [rank_subject(ctx.snap.group, r.rank)] + ([gpu_subject(gpu)] if gpu else [])
    return [
        f
        for s in subjects
        for f in ctx.on(s)
        if f.kind == "xid"
        and f.role == ROOT_CAUSE
        and f.evidence.get("xid_class") in PROCESS_XID_CLASSES
    ]


def _exits(ctx: Context) -> list[tuple[RankState, ProcessRecord, bool]]:
    """(rank, exit record, clean) for ranks whose latest record is an exit, oldest first."""
    out = []
    for r in ctx.snap.ranks:
        p = r.last_process
        if p is None or p.event != "exited" or p.generation != ctx.snap.generation:
            continue
        clean = p.reason == "clean" or (p.exit_code == 0 and p.signal is None and not p.reason)
        if clean and ctx.snap.state in TERMINAL_STATES:
            continue  # the job finished; a clean exit is the expected end
        out.append((r, p, clean))
    out.sort(key=lambda x: (x[1].ts, x[0].rank))
    return out


def run(ctx: Context) -> None:
    repeats = deterministic_ooms(ctx)
    exits = _exits(ctx)
    first_ts = exits[0][1].ts if exits else None
    initiator: Finding | None = None
    for r, p, clean in exits:
        kind = _kind(p)
        # The kernel's OOM killer ended the process (host memory): its line is the evidence.
        killer = kernel_oom(ctx, r, p)
        if killer is not None:
            kind = "oom"
        step = _step_at(r, p)
        cause = ctx.device_cause(p.gpu or r.gpu) or ctx.node_cause(r.node)
        # Exits after the first one are the teardown or cascade it set off (peers killed by
        # the launcher, NCCL errors raised by the survivors); an OOM is always its own.
        late = (
            first_ts is not None and (p.ts - first_ts).total_seconds() > ctx.cfg.cascade_tolerance_s
        )
        teardown = cause is None and initiator is not None and late and kind != "oom"
        if teardown and initiator is not None:
            cause = ctx.root_of(initiator)
        what = {
            "oom": "was killed by the kernel's OOM killer (host memory)"
            if killer is not None
            else "out of memory",
            "exception": f"raised {p.error_type or 'an exception'}",
            "process_exit": (
                "exited cleanly mid-run"
                if clean
                else f"exited (code {p.exit_code}, signal {p.signal}, {p.reason or 'no reason'})"
            ),
        }[kind]
        ev: dict[str, object] = {
            "rank": r.rank,
            "node": r.node,
            "gpu": p.gpu or r.gpu,
            "pid": p.pid,
            "exit_code": p.exit_code,
            "signal": p.signal,
            "reason": p.reason,
            "error_type": p.error_type,
            "message": p.message,
            "exited_at": p.ts,
            "last_step": step,
            "teardown": teardown,
        }
        if killer is not None:
            ev["kernel"] = {"event": killer.event, "pid": killer.pid, "comm": killer.comm,
                            "at": killer.ts, "source": "kernel_log"}  # fmt: skip
            ev["memory"] = "host"
        xids = _process_xids(ctx, r, p.gpu or r.gpu)
        if xids:
            ev["xids"] = [
                {k: x.evidence.get(k) for k in ("code", "mnemonic", "xid_class", "action")}
                for x in xids
            ]
        again = repeats.get(step) if kind == "oom" and step is not None else None
        if again:
            ev["deterministic"] = {"step": step, "generations": again}
        f = ctx.put(
            ctx.new(
                kind=kind,
                subject=rank_subject(ctx.snap.group, r.rank),
                role=SYMPTOM if cause else ROOT_CAUSE,
                severity=MAJOR if cause else CRITICAL,
                summary=f"Rank {r.rank} on {r.node or '?'} {what}"
                + (f" at step {step}" if step is not None else "")
                + (f" after Xid {xids[0].evidence.get('code')}" if xids else ""),
                first_seen=p.ts,
                evidence=ev,
                caused_by=(cause.id,) if cause else (),
            )
        )
        for x in xids:  # the Xid is the exit's evidence, not a second story
            ctx.put(replace(x, role=SYMPTOM, caused_by=(f.id,)))
        if initiator is None:
            initiator = f
        if again:
            ctx.unsafe_reasons[f.id] = (
                f"deterministic OOM: step {step} ran out of memory in generations "
                f"{again}; the same configuration will fail again"
            )
