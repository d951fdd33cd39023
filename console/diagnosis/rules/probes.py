"""Correctness-probe rule family: a fixed input whose answer differs (`probe_divergence`).

Owns the seed's fourth health check. Training ranks answer the same fixed batch on the
same weights, so at one step every data-parallel rank must give the same loss (within
`probe_rel_tol`) or checksum; the rank(s) outside a strict majority are named, over the
recent probed steps (from the first step they diverged). No strict majority (two ranks that
disagree) is `undetermined`: the group, not a rank. Every rank's answer non-finite is a
group root cause. Serving workers of one model version answer a fixed request the same
way, across workers and over time (a worker whose own answer changed under the same
version). Byzantine-like corruption that restart-on-crash never catches: restart is
blocked. Must not read other rules' findings beyond `covered`, nor judge a rank without peers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from math import isfinite
from typing import Any

from console.diagnosis.findings import (
    CRITICAL,
    ROOT_CAUSE,
    UNDETERMINED,
    checkpoint_subject,
    group_subject,
    rank_subject,
    worker_subject,
)
from console.diagnosis.rules.base import Context
from console.diagnosis.snapshot import ProbeRecord

# ("checksum", hex) or ("value", number | "non-finite"): what ranks are compared by.
Answer = tuple[str, float | str]


def _answer(p: ProbeRecord, tol: float) -> Answer | None:
    """The comparable part of an answer: the checksum, else the value (NaN: 'non-finite')."""
    if p.checksum:
        return ("checksum", p.checksum)
    if p.value is None:
        return None
    return ("value", p.value) if isfinite(p.value) else ("value", "non-finite")


def _same(a: Answer, b: Answer, tol: float) -> bool:
    if a == b:
        return True
    (ka, va), (kb, vb) = a, b
    if ka != "value" or kb != "value" or isinstance(va, str) or isinstance(vb, str):
        return False
    return abs(va - vb) <= tol * max(abs(va), abs(vb), 1e-12)


def _clusters(answers: dict[Any, Answer], tol: float) -> list[list[Any]]:
    """Who agrees with whom: members grouped by equal answers (values within `tol`)."""
    out: list[tuple[Answer, list[Any]]] = []
    for who, ans in sorted(answers.items(), key=lambda kv: str(kv[0])):
        for rep, members in out:
            if _same(rep, ans, tol):
                members.append(who)
                break
        else:
            out.append((ans, [who]))
    return sorted((m for _, m in out), key=len, reverse=True)


def _shown(ans: Answer | None) -> Any:
    return None if ans is None else ans[1]


def _emit(
    ctx: Context,
    *,
    subject: str,
    role: str,
    summary: str,
    first_seen: datetime,
    last_seen: datetime,
    evidence: dict[str, Any],
    unsafe: str,
) -> None:
    f = ctx.put(
        ctx.new(
            kind="probe_divergence",
            subject=subject,
            role=role,
            severity=CRITICAL,
            summary=summary,
            first_seen=first_seen,
            last_seen=last_seen,
            evidence=evidence,
        )
    )
    if role == ROOT_CAUSE:
        ctx.unsafe_reasons[f.id] = unsafe


def _distrust_since(ctx: Context, step: int) -> None:
    """A checkpoint written at or after the first divergent step may carry the corruption:
    recovery must use the newest valid one before it (the `checkpoints` rule's choice,
    stepped back)."""
    ckpt = ctx.valid_checkpoint
    if ckpt is None or ckpt.step is None or ckpt.step < step:
        return
    earlier = [
        c
        for c in ctx.snap.checkpoints
        if c.step is not None
        and c.step < step
        and c.phase in ("committed", "verified")
        and not ctx.on(checkpoint_subject(ctx.snap.group, c.checkpoint_id))
        and c.manifest is not None
        and all(s.sha256 for s in c.manifest.shards)
    ]
    ctx.valid_checkpoint = max(earlier, key=lambda c: c.step or 0, default=None)


def _training(ctx: Context, probes: Sequence[ProbeRecord]) -> None:
    cfg, group = ctx.cfg, ctx.snap.group
    by_name: dict[str, dict[int, dict[int, ProbeRecord]]] = defaultdict(lambda: defaultdict(dict))
    for p in probes:
        if p.rank is not None and p.step is not None:
            by_name[p.probe][p.step][p.rank] = p  # newest answer per (step, rank)
    for name, steps in sorted(by_name.items()):
        # Every loaded probed step (the loader bounds them): the first divergent step must
        # not fall out of a window while the rank stays divergent.
        recent = sorted(s for s, ranks in steps.items() if len(ranks) >= 2)
        if not recent:
            continue
        divergent: dict[int, list[int]] = defaultdict(list)  # rank -> steps it was outside
        nonfinite_since = 0
        last_verdict: tuple[str, list[Any], list[list[Any]]] | None = None
        for s in recent:
            answers = {rk: a for rk, p in steps[s].items() if (a := _answer(p, cfg.probe_rel_tol))}
            if len(answers) < 2:
                continue
            clusters = _clusters(answers, cfg.probe_rel_tol)
            if len(clusters) == 1:
                if answers and all(a == ("value", "non-finite") for a in answers.values()):
                    nonfinite_since = (
                        s
                        if last_verdict is None or last_verdict[0] != ("nonfinite")
                        else nonfinite_since
                    )
                    last_verdict = ("nonfinite", [s], clusters)
                else:
                    last_verdict = None
                continue
            if len(clusters[0]) * 2 > len(answers):
                for members in clusters[1:]:
                    for rk in members:
                        divergent[rk].append(s)
                last_verdict = ("majority", [s], clusters)
            else:
                last_verdict = ("tie", [s], clusters)
        if last_verdict is None:
            continue  # the newest probed step agrees: whatever diverged before is over
        verdict, (newest,), clusters = last_verdict
        at = steps[newest]
        ts = max(p.ts for p in at.values())
        if verdict == "nonfinite":
            _distrust_since(ctx, nonfinite_since)
            _emit(
                ctx,
                subject=group_subject(group),
                role=ROOT_CAUSE,
                summary=f"Probe {name!r}: every rank's answer to the fixed input is "
                f"non-finite at step {newest}: the model state is corrupt everywhere",
                first_seen=ts,
                last_seen=ts,
                evidence={
                    "probe": name,
                    "step": newest,
                    "first_step": nonfinite_since,
                    "ranks": ctx.capped(sorted(at)),
                },
                unsafe="probe_divergence: the fixed input gives a non-finite answer on every "
                "rank; the newest checkpoints may carry the corruption",
            )
            continue
        if verdict == "tie":
            _emit(
                ctx,
                subject=group_subject(group),
                role=UNDETERMINED,
                summary=f"Probe {name!r} disagrees at step {newest} with no majority "
                f"({' vs '.join(str(c[:4]) for c in clusters[:3])}): which rank is "
                "corrupt cannot be told",
                first_seen=ts,
                last_seen=ts,
                evidence={
                    "probe": name,
                    "step": newest,
                    "sides": [ctx.capped(c) for c in clusters[:4]],
                    "answers": {
                        str(c[0]): _shown(_answer(at[c[0]], cfg.probe_rel_tol)) for c in clusters
                    },
                    "missing_evidence": "no majority: rerun the probe on more ranks or "
                    "compare each rank's weights with the last verified checkpoint",
                },
                unsafe="",
            )
            continue
        majority = clusters[0]
        expected = _shown(_answer(at[majority[0]], cfg.probe_rel_tol))
        for rk in sorted(r for c in clusters[1:] for r in c):
            if ctx.covered(rk) or newest not in divergent[rk]:
                continue
            bad_steps = divergent[rk]
            first = min(bad_steps)
            first_ts = steps[first][rk].ts
            r = ctx.ranks.get(rk)
            node = None if r is None else r.node
            got = _shown(_answer(at[rk], cfg.probe_rel_tol))
            _distrust_since(ctx, first)
            _emit(
                ctx,
                subject=rank_subject(group, rk),
                role=ROOT_CAUSE,
                summary=f"Rank {rk} on {node or '?'} answers probe {name!r} differently from "
                f"{len(majority)} of {len(at)} ranks since step {first} "
                f"({got} vs {expected}): silent corruption of its state",
                first_seen=first_ts,
                last_seen=at[rk].ts,
                evidence={
                    "probe": name,
                    "rank": rk,
                    "node": node,
                    "gpu": None if r is None else r.gpu,
                    "first_step": first,
                    "step": newest,
                    "divergent_steps": ctx.capped(bad_steps),
                    "answer": got,
                    "majority_answer": expected,
                    "agreeing_ranks": ctx.capped(majority),
                },
                unsafe=f"probe_divergence: rank {rk}'s state is silently corrupt since step "
                f"{first}; checkpoints written since may carry it and a restart on the same "
                "hardware may repeat it: isolate its GPU/node and verify first",
            )


def _serving(ctx: Context, probes: Sequence[ProbeRecord]) -> None:
    cfg, group = ctx.cfg, ctx.snap.group
    # (probe, version) -> worker -> answers, oldest first
    seen: dict[tuple[str, str], dict[str, list[ProbeRecord]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for p in probes:
        if p.worker is not None and _answer(p, cfg.probe_rel_tol) is not None:
            seen[(p.probe, p.model_version or "?")][p.worker].append(p)
    for (name, version), workers in sorted(seen.items()):
        newest = {w: ps[-1] for w, ps in workers.items()}
        answers = {
            w: a for w, p in newest.items() if (a := _answer(p, cfg.probe_rel_tol)) is not None
        }
        clusters = _clusters(answers, cfg.probe_rel_tol)
        named: set[str] = set()
        if len(clusters) > 1 and len(clusters[0]) * 2 > len(answers):
            expected = _shown(answers[clusters[0][0]])
            for w in sorted(x for c in clusters[1:] for x in c):
                named.add(w)
                _emit(
                    ctx,
                    subject=worker_subject(group, w),
                    role=ROOT_CAUSE,
                    summary=f"Worker {w} answers the fixed request {name!r} differently from "
                    f"{len(clusters[0])} of {len(answers)} workers on {version}",
                    first_seen=newest[w].ts,
                    last_seen=newest[w].ts,
                    evidence={
                        "probe": name,
                        "worker": w,
                        "model_version": version,
                        "answer": _shown(answers[w]),
                        "majority_answer": expected,
                        "agreeing_workers": ctx.capped(clusters[0]),
                    },
                    unsafe=f"probe_divergence: worker {w} serves wrong answers on {version}; "
                    "drain it rather than restart it into traffic",
                )
        elif len(clusters) > 1:
            first = min(newest.values(), key=lambda p: p.ts)
            _emit(
                ctx,
                subject=group_subject(group),
                role=UNDETERMINED,
                summary=f"Workers disagree on the fixed request {name!r} on {version} with no "
                "majority",
                first_seen=first.ts,
                last_seen=max(p.ts for p in newest.values()),
                evidence={
                    "probe": name,
                    "model_version": version,
                    "sides": [ctx.capped(c) for c in clusters[:4]],
                    "missing_evidence": "no majority of workers: compare with a reference "
                    "worker or the canary's recorded answer",
                },
                unsafe="",
            )
        # Over time: the same worker, the same version, a different answer than before.
        for w, ps in sorted(workers.items()):
            if w in named or len(ps) < 2:
                continue
            then, now_ = _answer(ps[0], cfg.probe_rel_tol), answers[w]
            if then is None or now_ is None or _same(then, now_, cfg.probe_rel_tol):
                continue
            changed = next(
                p
                for p in ps
                if (a := _answer(p, cfg.probe_rel_tol)) is not None
                and not _same(a, then, cfg.probe_rel_tol)
            )
            _emit(
                ctx,
                subject=worker_subject(group, w),
                role=ROOT_CAUSE,
                summary=f"Worker {w}'s answer to the fixed request {name!r} changed under the "
                f"same version {version}",
                first_seen=changed.ts,
                last_seen=ps[-1].ts,
                evidence={
                    "probe": name,
                    "worker": w,
                    "model_version": version,
                    "answer": _shown(now_),
                    "earlier_answer": _shown(then),
                },
                unsafe=f"probe_divergence: worker {w}'s output drifted without a version "
                "change; drain it and compare its weights and KV schema",
            )


def run(ctx: Context) -> None:
    probes = [p for p in ctx.snap.probes if p.generation == ctx.snap.generation]
    if not probes:
        return
    _training(ctx, [p for p in probes if p.rank is not None])
    _serving(ctx, [p for p in probes if p.worker is not None])
