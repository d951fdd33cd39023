"""MFU, HFU, memory-bandwidth and network utilisation of a training group, per rank and whole.

Owns turning each rank's newest steps (`model_flops`, `hw_flops`, `duration_ms`) and its
GPU's peak dense FLOP/s (agents.flops, keyed by the NVML name its samples carry) into
MFU and HFU, NVML's memory utilisation of the rank's GPU, and its node's NIC throughput
(byte counter deltas over their span). A figure that cannot be had is None with the
reason, never 0: a CPU rank, a GPU missing from the peak table, a job that reports no
FLOPs. Pure: no I/O, no clock (the caller's `now`).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from agents import flops

from console.diagnosis.snapshot import (
    DeviceSample,
    GroupSnapshot,
    NetPort,
    RankState,
    StepRecord,
)

# A rank's figure is over its newest steps of the active generation: at most this many,
# within WINDOW_S of its newest (a figure for now, not for the run; and cheap at 16k ranks).
MAX_STEPS = 4
WINDOW_S = 60.0
# A port sample older than this says nothing about the network now.
NET_FRESH_S = 120.0
# Ranks listed in the summary (the lowest MFU first; all of them in a group this small).
RANKS_KEPT = 64

NO_FLOPS = "no FLOPs reported"
NO_GPU = "no GPU"
NO_NAME = "GPU name unknown"


# (model FLOPs, hardware FLOPs, seconds) over a rank's newest steps.
RankFlops = tuple[float, float, float]
_WINDOW = timedelta(seconds=WINDOW_S)


def rank_flops(steps: tuple[StepRecord, ...]) -> RankFlops | None:
    """The newest steps' FLOPs and wall time (`steps` oldest first); None without FLOPs.

    Runs for every rank that stepped since the last pass (16k ranks at 1 Hz: all of them),
    so it reads at most MAX_STEPS steps and compares times only when they span more than
    the window."""
    if not steps:
        return None
    last = steps[-1]
    if last.model_flops is None:
        return None  # a job that reports no FLOPs costs one attribute read per rank
    window = steps[-MAX_STEPS:]
    if window[0].ts < last.ts - _WINDOW:  # slow steps: only those inside the window count
        since = last.ts - _WINDOW
        window = tuple([s for s in window if s.ts >= since])
    model = hardware = ms = 0.0
    for s in window:
        f, d = s.model_flops, s.duration_ms
        if f is None or not d or d <= 0:
            continue
        h = s.hw_flops
        model += f
        hardware += f if h is None else h
        ms += d
    return (model, hardware, ms / 1000.0) if ms > 0 else None


def node_throughput(ports: Iterable[NetPort], now: datetime) -> dict[str, float]:
    """Bytes/s through each node's fabric ports (InfiniBand/RoCE and Ethernet, both ways):
    their newest `tx_bytes` + `rx_bytes` deltas over the span the agent read them in."""
    out: dict[str, float] = {}
    fresh = now - timedelta(seconds=NET_FRESH_S)
    for p in ports:
        if p.link == "tcp" or p.node is None or p.ts < fresh or not p.interval_s:
            continue
        moved = [p.counters.get(k) for k in ("tx_bytes", "rx_bytes")]
        if all(v is None for v in moved):
            continue
        out[p.node] = out.get(p.node, 0.0) + sum(v or 0 for v in moved) / p.interval_s
    return out


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 4) if den > 0 else None


def utilisation(
    snap: GroupSnapshot,
    now: datetime,
    *,
    steps: Callable[[RankState], tuple[StepRecord, ...]] | None = None,
    per_rank: Callable[[str, RankState, Callable[[], Any]], Any] | None = None,
    net: dict[str, float] | None = None,
) -> dict[str, Any] | None:
    """The group's utilisation as the summary keeps it; None for a group without ranks.

    `steps(rank)`: its steps of the active generation (the engine's index; default the
    rank's own); `per_rank`: the engine's memo for ranks that did not change; `net`:
    `node_throughput` of the snapshot's ports at `now`, when the caller has it."""
    if not snap.ranks:
        return None
    samples = {d.gpu: d.sample for d in snap.devices}
    # GPU -> (its NVML name, that name's peak FLOP/s): one table lookup per name, not rank.
    peaks: dict[str | None, float | None] = {}
    named: dict[str, tuple[str | None, float | None]] = {}
    for uuid, sample in samples.items():
        device = sample.name if sample is not None else None
        if device not in peaks:
            found = flops.peak(device)
            peaks[device] = None if found is None else found.flops
        named[uuid] = (device, peaks[device])
    unknown: tuple[str | None, float | None] = (None, None)
    model_total = hw_total = capacity = 0.0
    with_flops = 0
    absent: Counter[str] = Counter()
    # (has an MFU, MFU, rank, its figures...): the lowest first, those without one before.
    ranked: list[tuple[bool, float, int, RankState, RankFlops | None, str | None]] = []
    append = ranked.append
    for r in snap.ranks:
        mine = steps(r) if steps is not None else r.current_steps
        if not mine or mine[-1].model_flops is None:
            got: RankFlops | None = None  # rank_flops's answer, without its memo's lookup
        elif per_rank is None:
            got = rank_flops(mine)
        else:
            got = per_rank("utilisation", r, partial(rank_flops, mine))
        gpu = r.gpu
        device, peak = named.get(gpu, unknown) if gpu else unknown
        if got is not None and peak is not None and gpu:
            model, hardware, seconds = got
            model_total += model
            hw_total += hardware
            capacity += seconds * peak
            with_flops += 1
            append((True, model / (seconds * peak), r.rank, r, got, device))
            continue
        if got is None:
            reason = NO_FLOPS
        else:
            with_flops += 1
            reason = _why(gpu, device)
        absent[reason] += 1
        append((False, -1.0, r.rank, r, got, device))
    # Tuples compare on (has an MFU, MFU, rank): ranks are unique, so never further.
    kept = heapq.nsmallest(RANKS_KEPT, ranked)
    if net is None:
        net = node_throughput(snap.net_ports, now)
    rows = [
        _row(r, got, device, peaks.get(device), samples.get(r.gpu) if r.gpu else None, net)
        for _, _, _, r, got, device in sorted(kept, key=lambda e: e[2])
    ]
    measured = [e[1] for e in ranked if e[0]]
    return {
        "window_s": WINDOW_S,
        "max_steps": MAX_STEPS,
        "mfu": _ratio(model_total, capacity),
        "hfu": _ratio(hw_total, capacity),
        "lowest_rank_mfu": round(min(measured), 4) if measured else None,
        "ranks": len(ranked),
        "ranks_with_flops": with_flops,
        "ranks_with_mfu": len(measured),
        # Why the ranks without an MFU have none, most common first.
        "absent": [{"reason": k, "ranks": n} for k, n in absent.most_common()],
        "per_rank": rows,
    }


def _why(gpu: str | None, device: str | None) -> str:
    """Why a rank that reports FLOPs has no MFU."""
    if not gpu:
        return NO_GPU
    if device is None:
        return NO_NAME
    return f"no peak FLOPs for {device!r}"


def _row(
    r: RankState,
    got: RankFlops | None,
    device: str | None,
    peak: float | None,
    sample: DeviceSample | None,
    net: dict[str, float],
) -> dict[str, Any]:
    """One rank as the page shows it."""
    row: dict[str, Any] = {
        "rank": r.rank,
        "device": device,
        "mfu": None,
        "hfu": None,
        "model_flops_per_s": None if got is None else round(got[0] / got[2], 1),
        "hbm_util_pct": None if sample is None else sample.mem_util_pct,
        "node_net_bytes_per_s": None if r.node is None else net.get(r.node),
        "absent": None,
    }
    if got is None:
        row["absent"] = NO_FLOPS
    elif not r.gpu or peak is None:
        row["absent"] = _why(r.gpu, device)
    else:
        row["mfu"] = _ratio(got[0], got[2] * peak)
        row["hfu"] = _ratio(got[1], got[2] * peak)
    return row
