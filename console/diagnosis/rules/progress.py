"""Progress rule family: ranks that stopped advancing, judged against the group's own
step-time history.

Owns `rank_hang` and `group_stall`. A rank is hung after
max(multiplier x (median + k*MAD of recent step durations), floor) without a step.
Phase-aware: a checkpoint in progress or a quiescing group is not hung, for a grace
relative to the checkpoint's own measured duration (Context.quiet_grace_s, capped);
a group with no step history only stalls after the warm-up timeout. Silence is judged
up to what the rank's node has delivered: a node whose newest record lags the clock by
more than `base.DELIVERY_SLACK_S` (its agent replays a spool after a telemetry outage)
has its ranks judged at that newest record (`Context.lagging_nodes`), not now — the
steps it has not delivered yet are not missing steps — until the heartbeat timeout, when
the nodes rule speaks for it. A rank is hung only beside a rank known to have advanced:
while every other rank is merely not delivered yet, the rule waits rather than name each
rank of a group that stopped as one.
Must run after every evidence rule: a rank some finding already explains gets no second
story.

A group stall is a symptom whenever something located explains it (a stopping root cause
anywhere in the group, or a rank hang, device or node fault, or the cause of a collective
wait on a stalled rank): it joins that cause's incident instead of paging a second,
undetermined story (with every rank explained there is no stall finding at all).
`undetermined` is kept for a stall nothing locates. While a stalled
rank waits in a collective it entered after its last step, for less than the threshold,
the undetermined verdict waits (for one threshold at most): the collectives rule names
who it waits for once the wait outlasts the threshold (the wait began after the last
step, so progress would otherwise always page first, then the located cause a moment
later, beside it).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial

from console.diagnosis.findings import (
    CRITICAL,
    INFO,
    MAJOR,
    MINOR,
    ROOT_CAUSE,
    SEVERITY_RANK,
    SYMPTOM,
    UNDETERMINED,
    Finding,
    group_subject,
    rank_subject,
)
from console.diagnosis.rules.base import HARD_DEVICE_KINDS, TERMINAL_STATES, Context

# Root causes that stop a synchronous group outright.
STOPPING = frozenset(
    {
        *HARD_DEVICE_KINDS,
        "node_down",
        "oom",
        "exception",
        "process_exit",
        "collective_mismatch",
        "split_brain",
        "stale_generation",
    }
)


ROLE_ORDER = {ROOT_CAUSE: 0, UNDETERMINED: 1, SYMPTOM: 2}

# Besides the stopping root causes: what a finding on a stalled rank may blame for it.
HOLDS_RANK = STOPPING | {"rank_hang"}


def _threshold(ctx: Context) -> float | None:
    thr = ctx.stall_threshold_s
    if thr is not None:
        return thr
    # Warm-up: no step yet in this generation. Only a long silence counts.
    starts = [
        p.ts for r in ctx.snap.ranks for p in r.processes if p.generation == ctx.snap.generation
    ]
    start = ctx.generation_start or (min(starts) if starts else None)
    age = ctx.age_s(start)
    if age is None or age <= ctx.cfg.warmup_timeout_s:
        if start is not None:  # the warm-up ends then, with or without a record
            ctx.due(start + timedelta(seconds=ctx.cfg.warmup_timeout_s))
        return None
    return ctx.cfg.warmup_timeout_s


def _located(ctx: Context, ranks: list[int]) -> list[Finding]:
    """The causes located on the stalled `ranks`: a hard fault of their GPU or node, a
    stopping finding or rank hang on the rank (its head), and the causes a collective
    timeout on the rank was linked to. A wait that nothing locates is not a cause."""
    out: dict[str, Finding] = {}
    for rk in ranks:
        r = ctx.ranks[rk]
        for f in (ctx.device_cause(r.gpu), ctx.node_cause(r.node)):
            if f is not None:
                out[f.id] = f
        for f in ctx.on(rank_subject(ctx.snap.group, rk)):
            if f.kind == "collective_timeout":
                for cid in f.caused_by:
                    if (c := ctx.findings.get(cid)) is not None:
                        head = ctx.root_of(c)
                        out[head.id] = head
            elif f.kind in HOLDS_RANK:
                head = ctx.root_of(f)
                out[head.id] = head
    return list(out.values())


def _young_wait(ctx: Context, ranks: list[int], thr: float) -> bool:
    """True when a stalled rank waits in a collective it entered after its last step, for
    less than `thr`: not yet a timeout the collectives rule would judge."""
    for rk in ranks:
        r = ctx.ranks[rk]
        w = r.collective
        if w is None or w.generation != ctx.snap.generation:
            continue
        for e in w.entries:
            # Younger than `thr` while the rank has been silent for more: entered after
            # its last step.
            if (
                e.state == "started"
                and e.started_ts is not None
                and ((ctx.now - e.started_ts).total_seconds() <= thr)
            ):
                return True
    return False


def _by_progress(ctx: Context) -> tuple[list[datetime], list[int], list[int]]:
    """Each rank's last progress ascending, the ranks' positions in that order, and the
    positions of the ranks without any (a function of the ranks: kept while none changes)."""
    last_progress = ctx.last_progress
    timed: list[tuple[datetime, int]] = []
    never: list[int] = []
    for i, r in enumerate(ctx.snap.ranks):
        last = last_progress(r)
        if last is None:
            never.append(i)
        else:
            timed.append((last, i))
    timed.sort()
    return [t for t, _ in timed], [i for _, i in timed], never


def _stalled(
    ctx: Context, thr: float
) -> tuple[list[tuple[int, datetime | None]], datetime | None, int]:
    """(rank, last progress) of the ranks silent past `thr`, in rank order; the oldest
    progress of the ranks not stalled nor deferred; and how many are deferred (silent past
    `thr` by the clock, not by what their lagging node delivered).

    What a loop over every rank finds, from the ranks ordered by progress (kept while no
    rank changes: a pass between steps reads a few ranks, not 16k): judged now, silence
    grows as progress gets older, so the ranks stalled are the oldest ones, found by
    bisection. Only the ranks of a lagging node are judged one by one."""
    times, order, never = ctx.per_pass("progress_order", None, partial(_by_progress, ctx))
    now, ranks, lagging = ctx.now, ctx.snap.ranks, ctx.lagging_nodes
    lo, hi = 0, len(times)
    while lo < hi:  # the first rank not silent past the threshold now
        mid = (lo + hi) // 2
        if (now - times[mid]).total_seconds() > thr:
            lo = mid + 1
        else:
            hi = mid
    late: set[int] = set()  # positions of the ranks of lagging nodes
    if lagging:
        pos = ctx.per_pass("positions", None, lambda: {r.rank: i for i, r in enumerate(ranks)})
        late = {pos[rk] for node in lagging for rk in ctx.ranks_on_node.get(node, ())}
    if not late and not never and not lo:
        return [], times[0] if times else None, 0
    at = dict(zip(order[:lo], times[:lo], strict=True))
    stalled = [i for i in [*never, *order[:lo]] if i not in late]
    soonest = next((times[j] for j in range(lo, len(times)) if order[j] not in late), None)
    deferred = 0
    last_progress = ctx.last_progress
    for i in late:
        r = ranks[i]
        last = last_progress(r)
        if last is None or (lagging[r.node or ""] - last).total_seconds() > thr:
            stalled.append(i)
            at[i] = last
        elif (now - last).total_seconds() > thr:
            deferred += 1
        elif soonest is None or last < soonest:
            soonest = last
    stalled.sort()
    return [(ranks[i].rank, at.get(i)) for i in stalled], soonest, deferred


def run(ctx: Context) -> None:
    snap = ctx.snap
    if snap.kind != "training" or not snap.ranks or snap.state in TERMINAL_STATES:
        return
    since = ctx.quiet_since
    if ctx.quiet:
        return
    thr = _threshold(ctx)
    if thr is None:
        return
    stalled, soonest, deferred = _stalled(ctx, thr)
    if soonest is not None:
        # With no new step, that rank crosses the threshold then: judged then, not at
        # whichever sweep tick follows (at 16k ranks a tick plus a pass is seconds).
        ctx.due(soonest + timedelta(seconds=thr))
    if stalled and len(stalled) < len(snap.ranks) == len(stalled) + deferred:
        # No rank is known to have advanced: the others are only not delivered yet (an
        # agent sends every few seconds). Calling the stalled ranks hung would page each
        # rank of a group that stopped as one; wait for the late nodes (at most until the
        # heartbeat timeout, when the nodes rule speaks for them).
        return
    covered = ctx.covered_ranks()  # one look per subject, not three per stalled rank
    uncovered = [(rk, ts) for rk, ts in stalled if rk not in covered]
    if not uncovered:
        return  # every stalled rank is already explained: no second story
    everyone = len(stalled) == len(snap.ranks)
    base = {
        "threshold_s": round(thr, 3),
        "history_steps": len(ctx.recent_durations_s),
        "checkpoint_since": since,
        **(
            {}
            if since is None
            else {
                "checkpoint_grace_s": round(ctx.quiet_grace_s, 3),
                "checkpoint_measured_s": ctx.checkpoint_measured_s,
            }
        ),
    }
    if everyone:
        # A minor one stops nothing: an informational Xid on a healthy neighbour's GPU (a
        # row remapped) must not become the story of a stall.
        stopping = {
            f.id: f
            for f in ctx.findings.values()
            if f.role == ROOT_CAUSE and f.kind in STOPPING and f.severity not in (MINOR, INFO)
        }
        located = {f.id: f for f in _located(ctx, [rk for rk, _ in stalled])}
        roots = sorted(
            {**stopping, **located}.values(),
            key=lambda f: (ROLE_ORDER.get(f.role, 9), SEVERITY_RANK[f.severity], f.id),
        )
        newest = max((ts for _, ts in stalled if ts is not None), default=None)
        silent = ctx.age_s(newest)
        # Held back for one threshold at most: ranks that keep entering new calls without
        # ever stepping (a loop of collectives) are still a stall.
        if (
            not roots
            and silent is not None
            and silent <= 2 * thr
            and _young_wait(ctx, [rk for rk, _ in stalled], thr)
        ):
            return  # the collectives rule names who they wait for once it is a timeout
        last = max((ts for _, ts in stalled if ts is not None), default=None)
        age = ctx.age_s(last)
        ctx.put(
            ctx.new(
                kind="group_stall",
                subject=group_subject(snap.group),
                role=SYMPTOM if roots else UNDETERMINED,
                severity=CRITICAL,
                summary=f"{snap.group} stalled: no rank advanced for "
                f"{'ever' if age is None else f'{age:.0f}s'} (threshold {thr:.0f}s)"
                + (f"; caused by {roots[0].summary}" if roots else ""),
                first_seen=last or ctx.now,
                last_seen=ctx.now,
                evidence={
                    **base,
                    "ranks": len(snap.ranks),
                    "last_step_ts": last,
                    "unexplained_ranks": ctx.capped([rk for rk, _ in uncovered]),
                    **(
                        {}
                        if roots
                        else {
                            "missing_evidence": "no exit, device, node or "
                            "collective evidence; collect stack dumps of every rank"
                        }
                    ),
                },
                caused_by=[f.id for f in roots[: ctx.cfg.max_evidence_items]],
            )
        )
        return
    for rk, ts in uncovered:
        r = ctx.ranks[rk]
        age = ctx.age_s(ts)
        ctx.put(
            ctx.new(
                kind="rank_hang",
                subject=rank_subject(snap.group, rk),
                role=ROOT_CAUSE,
                severity=MAJOR,
                summary=f"Rank {rk} on {r.node or '?'} made no progress for "
                f"{'ever' if age is None else f'{age:.0f}s'} (threshold {thr:.0f}s)",
                first_seen=ts or ctx.now,
                last_seen=ctx.now,
                evidence={
                    **base,
                    "rank": rk,
                    "node": r.node,
                    "gpu": r.gpu,
                    "last_step_ts": ts,
                    "last_step": None if (ls := ctx.last_step(r)) is None else ls.step,
                    "missing_evidence": "no exit, device or node fault; collect a stack "
                    "dump of this rank",
                },
            )
        )
