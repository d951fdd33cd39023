"""Process rule family: a rank's process exited, ran out of memory or raised.

Owns `process_exit`, `oom` and `exception`, and spotting a deterministic OOM (the same
step failing again after a restart). The first exit of a generation is the
initiator; later exits (launcher teardown, peers' NCCL errors) are its symptoms, and so
are the peers' errors stamped up to `ordering_tolerance_s` before a death no peer causes
(a kill or crash signal, a failed GPU or node): which record is stamped first must not
decide the verdict. An
application or consequence Xid on the rank's GPU (agents/xid.py class) folds under the
exit as its evidence: the program faulted, the GPU did not. Must run after `device` so a
crash explained by the rank's GPU is filed as that GPU's symptom, not as a second root
cause.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from functools import partial

from agents import xid as catalog

from console.diagnosis.findings import (
    CRITICAL,
    MAJOR,
    ROOT_CAUSE,
    SYMPTOM,
    UNDETERMINED,
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


# Deaths no peer's error causes within seconds: killed outright (a lost node, the kernel's
# OOM killer, a scheduler's preemption: SIGKILL) or crashed on a fault of its own (SIGSEGV,
# SIGBUS, SIGILL, SIGFPE). SIGTERM, SIGINT and SIGHUP are how launchers tear a job down, and
# SIGABRT is how a process dies of an uncaught C++ error (a peer's lost connection among them).
PEER_PROOF_SIGNALS = frozenset({4, 7, 8, 9, 11})


def _peer_proof(p: ProcessRecord) -> bool:
    return p.signal in PEER_PROOF_SIGNALS


def _may_follow(p: ProcessRecord, clean: bool) -> bool:
    """An exit a peer's death can set off: an exception (a lost connection is a plain
    RuntimeError under gloo), an error exit code, an abort or a teardown signal."""
    return not clean and p.reason != "oom" and not _peer_proof(p)


def _causes_peers(ctx: Context, r: RankState, p: ProcessRecord) -> bool:
    """A death no peer's error sets off: a kill or crash signal, or a failed GPU or node."""
    return _peer_proof(p) or bool(ctx.device_cause(p.gpu or r.gpu) or ctx.node_cause(r.node))


def _initiator(
    ctx: Context, exits: list[tuple[RankState, ProcessRecord, bool]]
) -> ProcessRecord | None:
    """The exit that set the others off: the first one, unless the first ones are errors a
    peer's death sets off (the survivors' lost connections) and, stamped within
    `ordering_tolerance_s` after them, a death no peer causes or the exit of a rank whose
    GPU or node failed. A launcher stamps a rank's death when it reaps the process, after
    the dying process closed its sockets: on a loaded node the peers' errors are often
    stamped first."""
    if not exits:
        return None
    first = exits[0][1]
    for r, p, clean in exits:
        if (p.ts - first.ts).total_seconds() > ctx.cfg.ordering_tolerance_s:
            break
        if _causes_peers(ctx, r, p):
            return p
        if not _may_follow(p, clean):
            break  # a clean exit or an OOM came first: it leads
    return first


def _lost_node(ctx: Context, r: RankState, p: ProcessRecord) -> Finding | None:
    """A node of the group that went down (or was cut off) no later than the tolerance
    after this error: its ranks died with it, unreported, and the error is their peers'."""
    limit = p.ts + timedelta(seconds=ctx.cfg.ordering_tolerance_s)
    for node in ctx.snap.nodes:
        if node.name == r.node or node.last_heartbeat is None or node.last_heartbeat > limit:
            continue
        found = ctx.node_cause(node.name)
        if found is not None:
            return found
    return None


def _unheard(ctx: Context, r: RankState, p: ProcessRecord) -> list[str]:
    """Nodes of the group, hosting ranks still running, whose newest delivery is older
    than this error plus the tolerance and that lag (an agent between sends, a spool after
    an outage): a death there stamped within the tolerance is not known yet."""
    limit = p.ts + timedelta(seconds=ctx.cfg.ordering_tolerance_s)
    out = []
    for name, delivered in sorted(ctx.lagging_nodes.items()):
        if name == r.node or delivered >= limit:
            continue
        running = [
            rk
            for rk in ctx.ranks_on_node.get(name, ())
            if (q := ctx.ranks[rk].last_process) is None or q.event != "exited"
        ]
        if running:
            out.append(name)
    return out


def run(ctx: Context) -> None:
    # Functions of the ranks (and the group's state and generation): a pass in which no
    # rank changed reuses them. `exits` is sorted below: a copy.
    repeats = ctx.per_pass("ooms", None, partial(deterministic_ooms, ctx))
    exits = list(ctx.per_pass("exits", (ctx.snap.state, ctx.snap.generation), partial(_exits, ctx)))
    lead = _initiator(ctx, exits)
    # The initiator is judged first: the exits before it that it set off link to it.
    exits.sort(key=lambda x: (x[1] is not lead, x[1].ts, x[0].rank))
    # A death no peer causes: the peers' errors stamped before it (or with it) are its own.
    overtook = lead is not None and _causes_peers(ctx, exits[0][0], lead)
    # An error that leads with no such death known: a node lost with its ranks (no exit
    # reported for them) explains it; a node not heard from since may still report one.
    lost: Finding | None = None
    unheard: list[str] = []
    if lead is not None and not overtook and _may_follow(lead, exits[0][2]):
        lost = _lost_node(ctx, exits[0][0], lead)
        if lost is None:
            unheard = _unheard(ctx, exits[0][0], lead)
    initiator: Finding | None = None
    for r, p, clean in exits:
        kind = _kind(p)
        # The kernel's OOM killer ended the process (host memory): its line is the evidence.
        killer = kernel_oom(ctx, r, p)
        if killer is not None:
            kind = "oom"
        step = _step_at(r, p)
        cause = ctx.device_cause(p.gpu or r.gpu) or ctx.node_cause(r.node)
        if p is lead and cause is None:
            cause = lost
        # Exits after the initiator are the teardown or cascade it set off (peers killed by
        # the launcher, NCCL errors raised by the survivors), and so are the errors stamped
        # just before a death no peer causes; an OOM is always its own.
        late = lead is not None and (
            (p.ts - lead.ts).total_seconds() > ctx.cfg.cascade_tolerance_s
            or (overtook and p.ts <= lead.ts and _may_follow(p, clean))
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
            ev["kernel"] = {
                "event": killer.event,
                "pid": killer.pid,
                "comm": killer.comm,
                "at": killer.ts,
                "source": "kernel_log",
            }
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
        role = SYMPTOM if cause else ROOT_CAUSE
        if p is lead and cause is None and unheard:
            role = UNDETERMINED
            since = min(ctx.lagging_nodes[n] for n in unheard)
            ev["unheard_nodes"] = ctx.capped(unheard)
            ev["missing_evidence"] = (
                f"{', '.join(unheard[:4])} not heard from since {since.isoformat()}: a rank's "
                f"death there, stamped up to {ctx.cfg.ordering_tolerance_s:g} s after this "
                "error, would be its cause"
            )
        f = ctx.put(
            ctx.new(
                kind=kind,
                subject=rank_subject(ctx.snap.group, r.rank),
                role=role,
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
