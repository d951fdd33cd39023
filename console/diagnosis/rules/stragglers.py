"""Straggler rule family: tail ratio and phase decomposition of slow ranks.

Owns `ctx.tail_ratio` (p99 of per-rank mean step time over the median), `straggler`
symptoms and their causes: a throttled GPU inflating compute (`thermal_throttle`,
`power_throttle`), input inflated on a healthy GPU (`input_stall`), collectives inflated
on the ranks of one node (`network_slow`). Must skip ranks another finding explains.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from operator import itemgetter

from agents.gpu_health import throttle_kind

from console.diagnosis.findings import (
    MAJOR,
    MINOR,
    ROOT_CAUSE,
    SYMPTOM,
    UNDETERMINED,
    Finding,
    gpu_subject,
    node_subject,
    rank_subject,
)
from console.diagnosis.records import PHASES, DeviceSample, DeviceState
from console.diagnosis.rules.base import RECENT_STEPS, Context
from console.diagnosis.rules.host import net_evidence, net_missing
from console.diagnosis.rules.network import sockets_seen
from console.diagnosis.snapshot import RankState
from console.diagnosis.stats import mad_sorted, median, median_sorted, percentile_sorted


def _throttling(ctx: Context, r: RankState) -> tuple[DeviceState, DeviceSample, str] | None:
    """The rank's GPU and the sample that shows it throttled while the judged steps ran:
    the newest sample, or the newest throttled one if the clocks recovered after the
    first step of the window (the slow steps it caused are still being averaged)."""
    dev = ctx.devices.get(r.gpu or "")
    if dev is None:
        return None
    for s in (dev.sample, dev.last_throttled):
        if s is None or (kind := throttle_kind(s.throttle_reasons)) is None:
            continue
        if s is dev.sample or s.ts >= ctx.steps(r)[-RECENT_STEPS:][0].ts:
            return dev, s, kind
    return None


def _throttle_cause(ctx: Context, r: RankState, ev: dict[str, object]) -> Finding | None:
    seen = _throttling(ctx, r)
    if seen is None:
        return None
    dev, s, kind = seen
    ended = s is not dev.sample
    return ctx.put(
        ctx.new(
            kind=kind,
            subject=gpu_subject(dev.gpu),
            role=ROOT_CAUSE,
            severity=MAJOR,
            summary=f"{kind.replace('_', ' ').capitalize()} on {ctx.gpu_label(dev.gpu)} "
            f"(rank {r.rank}) slows the whole group: compute {ev['compute_ms']:.0f} ms vs "
            f"median {ev['median_compute_ms']:.0f} ms"
            + (" (clocks recovered; its slow steps are still in the window)" if ended else ""),
            first_seen=s.ts,
            evidence={
                "gpu": dev.gpu,
                "node": dev.node,
                "index": dev.index,
                "throttle_reasons": list(s.throttle_reasons),
                "temp_c": s.temp_c,
                "power_w": s.power_w,
                "sm_clock_mhz": s.sm_clock_mhz,
                **({"throttle_last_seen": s.ts} if ended else {}),
                **ev,
            },
        )
    )


def _limit(ratio: float, k: float, ordered: list[float], med: float) -> float:
    return max(med * ratio, med + k * mad_sorted(ordered, med))


@dataclass(frozen=True, slots=True)
class _Stats:
    """The group's step statistics: a function of the ranks' steps and the config."""

    stats: dict[int, tuple[float, dict[str, float]]]
    busy: dict[int, float]
    med: float
    busy_med: float
    tail_ratio: float
    ph_med: dict[str, float]
    over: list[int]  # ranks over either limit, sorted
    limit: float  # the step time over which a rank is a straggler


_MEAN = itemgetter(0)
_PHASE_MEANS = itemgetter(1)


def _group_stats(ctx: Context) -> _Stats | None:
    cfg = ctx.cfg
    stats: dict[int, tuple[float, dict[str, float]]] = {}
    least = cfg.straggler_min_steps
    for rk, d in ctx.digests.items():
        # Every rank with history counts toward the tail ratio; only unexplained ranks
        # may be called stragglers below.
        if len(d.cur) >= least and d.means is not None:
            stats[rk] = d.means
    if len(stats) < 2:
        return None
    # In synchronous training every rank's step lasts as long as the slowest one's: the
    # straggler shows in its busy time (step minus collective wait), its peers in waiting.
    busy = {rk: m - ph["collective"] for rk, (m, ph) in stats.items()}
    # Each list sorted once for its median, tail percentile and MAD.
    means = sorted(map(_MEAN, stats.values()))  # C loops over 16k ranks
    busies = sorted(busy.values())
    med = median_sorted(means)
    busy_med = median_sorted(busies)
    if med <= 0 or busy_med <= 0:
        return None
    tail_ratio = max(percentile_sorted(means, 99) / med, percentile_sorted(busies, 99) / busy_med)
    phases = list(map(_PHASE_MEANS, stats.values()))
    ph_med = {p: median(list(map(itemgetter(p), phases))) for p in PHASES}
    limit = _limit(cfg.straggler_ratio, cfg.straggler_mad_k, means, med)
    busy_limit = _limit(cfg.straggler_ratio, cfg.straggler_mad_k, busies, busy_med)
    over = sorted(rk for rk, (m, _) in stats.items() if m > limit or busy[rk] > busy_limit)
    return _Stats(stats, busy, med, busy_med, tail_ratio, ph_med, over, limit)


def run(ctx: Context) -> None:
    cfg = ctx.cfg
    key = (cfg.straggler_min_steps, cfg.straggler_ratio, cfg.straggler_mad_k)
    # Medians over every rank: a pass in which no rank changed reuses last pass's.
    g = ctx.per_pass("stragglers", key, partial(_group_stats, ctx))
    if g is None:
        return
    stats, busy, med, busy_med, ph_med = g.stats, g.busy, g.med, g.busy_med, g.ph_med
    ctx.tail_ratio = g.tail_ratio
    ctx.phase_medians_ms = dict(ph_med)
    # The charts scale to these: a healthy group is one colour, a straggler stands out.
    ctx.step_scale_ms = {"median": round(med, 3), "limit": round(g.limit, 3)}
    slow = [rk for rk in g.over if not ctx.covered(rk)]
    if not slow or any(f.kind == "group_stall" for f in ctx.findings.values()):
        return
    net_slow: dict[str, list[int]] = defaultdict(list)
    socket_led: list[int] = []  # waiting in collectives where the sockets can locate it
    tomography = sockets_seen(ctx)
    causes: dict[int, Finding | None] = {}
    for rk in slow:
        r = ctx.ranks[rk]
        mean, ph = stats[rk]
        excess = {p: ph[p] - ph_med[p] for p in PHASES}
        most = max(PHASES, key=lambda p: excess[p])
        # A phase names the cause only when it explains most of what makes the rank slow
        # (its step, or its busy time, over the median). A rank slow outside every phase
        # (descheduled, shape skew) has none: a CI run's healthy CPU job got an
        # `input_stall` root cause reading "input 0 ms vs median 0 ms".
        gap = max(mean - med, busy[rk] - busy_med)
        dominant = most if excess[most] > 0 and excess[most] >= 0.5 * gap else None
        ev: dict[str, object] = {
            "rank": rk,
            "node": r.node,
            "gpu": r.gpu,
            "mean_step_ms": round(mean, 3),
            "median_step_ms": round(med, 3),
            "ratio": round(max(mean / med, busy[rk] / busy_med), 3),
            "busy_ms": round(busy[rk], 3),
            "median_busy_ms": round(busy_med, 3),
            "dominant_phase": dominant,
            "compute_ms": ph["compute"],
            "median_compute_ms": ph_med["compute"],
            "phase_ms": {p: round(ph[p], 3) for p in PHASES},
            "median_phase_ms": {p: round(ph_med[p], 3) for p in PHASES},
        }
        cause = None
        if dominant == "compute":
            cause = _throttle_cause(ctx, r, ev)
        elif dominant == "input" and _throttle_cause_kind(ctx, r) is None:
            cause = ctx.put(
                ctx.new(
                    kind="input_stall",
                    subject=rank_subject(ctx.snap.group, rk),
                    role=ROOT_CAUSE,
                    severity=MAJOR,
                    summary=f"Input pipeline stalls rank {rk} on {r.node or '?'}: "
                    f"input {ph['input']:.0f} ms vs median {ph_med['input']:.0f} ms per step",
                    first_seen=ctx.steps(r)[-RECENT_STEPS:][0].ts,
                    last_seen=ctx.steps(r)[-1].ts,
                    evidence=ev,
                    key="input",
                )
            )
        elif dominant == "collective" and r.node:
            (socket_led if tomography else net_slow[r.node]).append(rk)
        causes[rk] = cause
    # The network rule located a link from the nodes' own sockets: a synchronous
    # collective inflates every rank's collective phase, so these waits are its symptoms
    # and the node they run on is not a second suspect.
    located = next(
        (
            f
            for f in ctx.findings.values()
            if f.role == ROOT_CAUSE and f.kind in ("network_slow", "network_partition")
        ),
        None,
    )
    if located is not None:
        for ranks in [*net_slow.values(), socket_led]:
            for rk in ranks:
                causes[rk] = located
        net_slow.clear()
    # The sockets name no single node yet: hold the waiting ranks back while their slow
    # steps are under half the window (the network rule needs a few rounds of reads),
    # then call them undetermined; never name the node they wait on.
    held = set()
    if located is None:
        for rk in socket_led:
            r = ctx.ranks[rk]
            recent = ctx.steps(r)[-RECENT_STEPS:]
            over = sum(1 for s in recent if (s.duration_ms or 0.0) > med * cfg.straggler_ratio)
            if 2 * over < RECENT_STEPS:
                held.add(rk)
    # Collective time inflated only on the ranks of one node: that node's network.
    if len(net_slow) == 1:
        node, ranks = next(iter(net_slow.items()))
        # Cite the port and the counter that moved, or say there is none.
        port = net_evidence(ctx, node, ctx.cfg.host_event_window_s)
        if port is None:
            cited = ""
            port_ev: dict[str, object] = {"missing_evidence": net_missing(ctx, node)}
        else:
            moved = port["counters"]
            top = port["counter"]
            cited = f" ({port['what']} on {port['port']}" + (
                f": {top} +{moved[top]})" if isinstance(moved, dict) and top in moved else ")"
            )
            port_ev = {"port": port["port"], "counter": top, "network": port}
        c = ctx.put(
            ctx.new(
                kind="network_slow",
                subject=node_subject(node),
                role=ROOT_CAUSE,
                severity=MAJOR,
                summary=f"Slow network on {node}{cited}: collectives of rank(s) {ranks[:4]} take "
                f"{max(stats[x][1]['collective'] for x in ranks):.0f} ms vs median "
                f"{ph_med['collective']:.0f} ms",
                first_seen=ctx.steps(ctx.ranks[ranks[0]])[-RECENT_STEPS:][0].ts,
                last_seen=ctx.now,
                evidence={
                    "node": node,
                    "ranks": ctx.capped(ranks),
                    "median_collective_ms": ph_med["collective"],
                    **port_ev,
                },
            )
        )
        for rk in ranks:
            causes[rk] = c
    for rk in slow:
        if rk in held:
            continue
        r = ctx.ranks[rk]
        mean, ph = stats[rk]
        cause = causes.get(rk)
        ratio = max(mean / med, busy[rk] / busy_med)
        ctx.put(
            ctx.new(
                kind="straggler",
                subject=rank_subject(ctx.snap.group, rk),
                role=SYMPTOM if cause else UNDETERMINED,
                severity=MAJOR if ratio >= 1.5 else MINOR,
                summary=f"Rank {rk} on {r.node or '?'} straggles at {ratio:.2f}x the median "
                f"step/busy time" + (f": {cause.summary}" if cause else " (cause undetermined)"),
                first_seen=ctx.steps(r)[-RECENT_STEPS:][0].ts,
                last_seen=ctx.steps(r)[-1].ts,
                evidence={
                    "rank": rk,
                    "node": r.node,
                    "gpu": r.gpu,
                    "mean_step_ms": round(mean, 3),
                    "median_step_ms": round(med, 3),
                    "tail_ratio": round(ctx.tail_ratio, 3),
                    "phase_ms": {p: round(ph[p], 3) for p in PHASES},
                    **(
                        {}
                        if cause
                        else {
                            "missing_evidence": "the nodes' sockets name no single node: "
                            "check the links between the waiting ranks' nodes"
                            if rk in socket_led
                            else "no throttle, input or "
                            "single-node network signal; suspect shape skew or host contention"
                        }
                    ),
                },
                caused_by=[cause.id] if cause else [],
            )
        )


def _throttle_cause_kind(ctx: Context, r: RankState) -> str | None:
    seen = _throttling(ctx, r)
    return None if seen is None else seen[2]
