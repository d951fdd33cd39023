"""Collective rule family: correctness before timeouts.

Lines up every rank's latest collective window by sequence number. A rank whose
(pg, op, numel, dtype) differs from the majority at a seq is a `collective_mismatch`
root cause. Ranks blocked in a started collective at a seq some rank never entered get
`collective_timeout` symptoms linked to whatever stopped that rank (mismatch, GPU,
node, process); with no such evidence they are `undetermined` and say what is missing.
Must run after `device`, `nodes` and `process`, whose findings it links to.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime

from console.diagnosis.findings import (
    CRITICAL,
    MAJOR,
    ROOT_CAUSE,
    SEVERITY_RANK,
    SYMPTOM,
    UNDETERMINED,
    Finding,
    gpu_subject,
    node_subject,
    rank_subject,
)
from console.diagnosis.rules.base import Context
from console.diagnosis.snapshot import CollectiveEntry

ENTERED = frozenset({"started", "completed"})
LINK_KINDS = frozenset({"nvlink_errors", "network_slow"})


def _sig(sig: tuple[object, ...]) -> dict[str, object]:
    return dict(zip(("pg", "op", "numel", "dtype"), sig, strict=True))


def _mismatches(ctx: Context, by_seq: dict[int, dict[int, CollectiveEntry]]) -> dict[int, Finding]:
    """Seq -> one mismatch finding per deviating rank (first deviation per rank only)."""
    out: dict[int, Finding] = {}
    blamed: set[int] = set()
    for seq in sorted(by_seq):
        entries = by_seq[seq]
        if len(entries) < 2:
            continue
        counts = Counter(e.signature for e in entries.values())
        if len(counts) == 1:
            continue
        (major_sig, major_n), *rest = sorted(counts.items(), key=lambda kv: (-kv[1], repr(kv[0])))
        # A tie cannot say who is wrong: report it, but as undetermined.
        tie = bool(rest) and rest[0][1] == major_n
        for rank, e in sorted(entries.items()):
            if e.signature == major_sig or rank in blamed:
                continue
            blamed.add(rank)
            r = ctx.ranks[rank]
            diff = [
                k
                for k, a, b in zip(
                    ("pg", "op", "numel", "dtype"), e.signature, major_sig, strict=True
                )
                if a != b
            ]
            f = ctx.put(
                ctx.new(
                    kind="collective_mismatch",
                    subject=rank_subject(ctx.snap.group, rank),
                    role=UNDETERMINED if tie else ROOT_CAUSE,
                    severity=CRITICAL,
                    summary=f"Collective mismatch on rank {rank} at seq {seq}: "
                    f"{e.op}({e.numel}, {e.dtype}) on pg {e.pg} where {major_n} rank(s) "
                    f"called {major_sig[1]}({major_sig[2]}, {major_sig[3]}) on pg {major_sig[0]}",
                    first_seen=e.started_ts or ctx.now,
                    evidence={
                        "rank": rank,
                        "node": r.node,
                        "gpu": r.gpu,
                        "seq": seq,
                        "rank_call": _sig(e.signature),
                        "majority_call": _sig(major_sig),
                        "majority_ranks": major_n,
                        "ranks_at_seq": len(entries),
                        "differs_in": diff,
                        "tie": tie,
                    },
                    key=str(seq),
                )
            )
            ctx.unsafe_reasons[f.id] = (
                "collective mismatch: a restart replays the same program and hangs again"
            )
            out.setdefault(seq, f)
    return out


def _link_cause(ctx: Context, ranks: list[int]) -> Finding | None:
    for rk in ranks:
        r = ctx.ranks[rk]
        subjects = [gpu_subject(r.gpu)] if r.gpu else []
        subjects += [node_subject(r.node)] if r.node else []
        for s in subjects:
            for f in ctx.on(s):
                if f.kind in LINK_KINDS:
                    return f
    return None


def _suspect(ctx: Context, rank: int, seq: int, waiters: int) -> Finding:
    r = ctx.ranks[rank]
    return ctx.put(
        ctx.new(
            kind="rank_hang",
            subject=rank_subject(ctx.snap.group, rank),
            role=UNDETERMINED,
            severity=CRITICAL,
            summary=f"Rank {rank} on {r.node or '?'} never entered collective seq {seq} "
            f"({waiters} rank(s) wait): no exit, device or node evidence",
            first_seen=ctx.last_progress(r) or ctx.now,
            last_seen=ctx.now,
            evidence={
                "rank": rank,
                "node": r.node,
                "gpu": r.gpu,
                "seq": seq,
                "last_progress": ctx.last_progress(r),
                "missing_evidence": "no process exit, device fault or node loss reported "
                "for this rank; collect a stack dump (py-spy) or flight recorder",
            },
        )
    )


def run(ctx: Context) -> None:
    windows = {r.rank: r.collective for r in ctx.snap.ranks if r.collective is not None}
    if not windows:
        return
    by_seq: dict[int, dict[int, CollectiveEntry]] = defaultdict(dict)
    for rank, w in windows.items():
        for e in w.entries:
            by_seq[e.seq][rank] = e
    mismatches = _mismatches(ctx, by_seq)
    if ctx.quiet:
        return  # ranks wait in barriers while a checkpoint is written: not a timeout
    threshold = ctx.stall_threshold_s or ctx.cfg.hang_floor_s
    pending: dict[int, list[tuple[int, CollectiveEntry, datetime]]] = defaultdict(list)
    for rank, w in sorted(windows.items()):
        waits = [(e, e.started_ts) for e in w.entries if e.state == "started" and e.started_ts]
        if not waits or ctx.covered(rank):
            continue
        e, since = min(waits, key=lambda x: x[0].seq)
        pending[e.seq].append((rank, e, since))
    for seq, all_waiting in sorted(pending.items()):
        at_seq = by_seq[seq]
        missing = [rk for rk in ctx.ranks if rk not in at_seq or at_seq[rk].state not in ENTERED]
        # A wait already explained by a root cause (the rank it waits for lost its GPU, exited,
        # or mismatched) is a symptom at once: the page names the cause within a second
        # instead of after a timeout. An unexplained wait must outlast the stall threshold.
        explained = seq in mismatches or any(ctx.rank_cause(rk) for rk in missing)
        waiting = [
            (rank, e, since)
            for rank, e, since in all_waiting
            if explained or (ctx.now - since).total_seconds() > threshold
        ]
        if not waiting:
            continue
        causes: list[Finding] = []
        if seq in mismatches:
            causes.append(mismatches[seq])
        else:
            for rk in missing:
                c = ctx.rank_cause(rk)
                if c is not None and c.id not in {x.id for x in causes}:
                    causes.append(c)
        unexplained = [rk for rk in missing if ctx.rank_cause(rk) is None]
        role = SYMPTOM
        note = None
        if not causes and missing:
            causes = [_suspect(ctx, rk, seq, len(waiting)) for rk in unexplained[:16]]
            role = UNDETERMINED
        elif not causes:
            link = _link_cause(ctx, [rk for rk, _, _ in waiting])
            if link is not None:
                causes = [link]
            else:
                role = UNDETERMINED
                note = (
                    "every rank entered this collective and none mismatched, exited or lost "
                    "its GPU: suspect links or congestion; missing network counters"
                )
        causes.sort(key=lambda f: (SEVERITY_RANK[f.severity], f.id))
        head = causes[0].summary if causes else None
        for rank, e, since in waiting:
            r = ctx.ranks[rank]
            waited = (ctx.now - since).total_seconds()
            why = (
                f"caused by {head}"
                if role == SYMPTOM and head
                else (
                    f"rank(s) {', '.join(map(str, missing[:4]))} never entered"
                    if missing
                    else "cause undetermined"
                )
            )
            ctx.put(
                ctx.new(
                    kind="collective_timeout",
                    subject=rank_subject(ctx.snap.group, rank),
                    role=role,
                    severity=MAJOR,
                    summary=f"Rank {rank} waiting {waited:.0f}s in {e.op} seq {seq}: {why}",
                    first_seen=since,
                    last_seen=ctx.now,
                    evidence={
                        "rank": rank,
                        "node": r.node,
                        "gpu": r.gpu,
                        "seq": seq,
                        "pg": e.pg,
                        "op": e.op,
                        "numel": e.numel,
                        "dtype": e.dtype,
                        "started_ts": e.started_ts,
                        "waiting_s": round(waited, 3),
                        "threshold_s": round(threshold, 3),
                        "missing_ranks": ctx.capped(missing),
                        "unexplained_missing": ctx.capped(unexplained),
                        **({"missing_evidence": note} if note else {}),
                    },
                    caused_by=[c.id for c in causes[: ctx.cfg.max_evidence_items]],
                    key=str(seq),
                )
            )
