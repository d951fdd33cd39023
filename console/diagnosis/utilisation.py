"""MFU, HFU, memory-bandwidth and network utilisation of a training group, per rank and whole.

Owns turning each rank's newest steps (`model_flops`, `hw_flops`, `duration_ms`) and its
GPU's peak dense FLOP/s (agents.flops, keyed by the NVML name its samples carry) into
MFU and HFU, NVML's memory utilisation of the rank's GPU, and its node's NIC throughput
(byte counter deltas over their span). A figure that cannot be had is None with the
reason, never 0: a CPU rank, a GPU missing from the peak table, a job that reports no
FLOPs. Pure: no I/O, no clock (the caller's `now`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from agents import flops

from console.diagnosis.snapshot import GroupSnapshot, NetPort, RankState, StepRecord

# A rank's figure is over its newest steps of the active generation: at most this many,
# within WINDOW_S of its newest (a figure for now, not for the run; and cheap at 16k ranks).
MAX_STEPS = 8
WINDOW_S = 60.0
# A port sample older than this says nothing about the network now.
NET_FRESH_S = 120.0
# Ranks listed in the summary (the lowest MFU first; all of them in a group this small).
RANKS_KEPT = 64

NO_FLOPS = "no FLOPs reported"
NO_GPU = "no GPU"
NO_NAME = "GPU name unknown"


@dataclass(frozen=True, slots=True)
class RankFlops:
    model: float  # FLOPs by the model's count over the steps read
    hardware: float  # and by the hardware's
    seconds: float  # the steps' wall time

    def rate(self) -> float:
        return self.model / self.seconds


def rank_flops(steps: tuple[StepRecord, ...]) -> RankFlops | None:
    """The newest steps' FLOPs and wall time (`steps` oldest first); None without FLOPs."""
    if not steps or steps[-1].model_flops is None:
        return None
    since = steps[-1].ts - timedelta(seconds=WINDOW_S)
    model = hardware = seconds = 0.0
    for s in steps[-MAX_STEPS:]:
        if s.ts < since or s.model_flops is None or not s.duration_ms or s.duration_ms <= 0:
            continue
        model += s.model_flops
        hardware += s.model_flops if s.hw_flops is None else s.hw_flops
        seconds += s.duration_ms / 1000.0
    return RankFlops(model, hardware, seconds) if seconds > 0 else None


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
) -> dict[str, Any] | None:
    """The group's utilisation as the summary keeps it; None for a group without ranks.

    `steps(rank)`: its steps of the active generation (the engine's index; default the
    rank's own); `per_rank`: the engine's memo for ranks that did not change."""
    if not snap.ranks:
        return None
    samples = {d.gpu: d.sample for d in snap.devices}
    net = node_throughput(snap.net_ports, now)
    rows: list[dict[str, Any]] = []
    absent: Counter[str] = Counter()
    model_total = hw_total = capacity = 0.0
    with_flops = 0
    for r in snap.ranks:
        mine = steps(r) if steps is not None else r.current_steps
        compute = partial(rank_flops, mine)
        got: RankFlops | None = (
            per_rank("utilisation", r, compute) if per_rank is not None else compute()
        )
        sample = samples.get(r.gpu) if r.gpu else None
        device = sample.name if sample is not None else None
        peak = flops.peak(device)
        reason = None
        if got is None:
            reason = NO_FLOPS
        elif not r.gpu:
            reason = NO_GPU
        elif device is None:
            reason = NO_NAME
        elif peak is None:
            reason = f"no peak FLOPs for {device!r}"
        row: dict[str, Any] = {
            "rank": r.rank,
            "device": device,
            "mfu": None,
            "hfu": None,
            "model_flops_per_s": None if got is None else round(got.rate(), 1),
            "hbm_util_pct": None if sample is None else sample.mem_util_pct,
            "node_net_bytes_per_s": None if r.node is None else net.get(r.node),
            "absent": reason,
        }
        if got is not None:
            with_flops += 1
        if got is not None and peak is not None:
            row["mfu"] = _ratio(got.model, got.seconds * peak.flops)
            row["hfu"] = _ratio(got.hardware, got.seconds * peak.flops)
            model_total += got.model
            hw_total += got.hardware
            capacity += got.seconds * peak.flops
        else:
            absent[reason or NO_FLOPS] += 1
        rows.append(row)
    measured = [row["mfu"] for row in rows if row["mfu"] is not None]
    # The lowest MFU first (ranks without one before them: they need looking at), kept
    # in rank order for the page.
    rows.sort(key=lambda row: (row["mfu"] is not None, row["mfu"] or 0.0, row["rank"]))
    kept = sorted(rows[:RANKS_KEPT], key=lambda row: row["rank"])
    return {
        "window_s": WINDOW_S,
        "max_steps": MAX_STEPS,
        "mfu": _ratio(model_total, capacity),
        "hfu": _ratio(hw_total, capacity),
        "lowest_rank_mfu": min(measured) if measured else None,
        "ranks": len(rows),
        "ranks_with_flops": with_flops,
        "ranks_with_mfu": len(measured),
        # Why the ranks without an MFU have none, most common first.
        "absent": [{"reason": k, "ranks": n} for k, n in absent.most_common()],
        "per_rank": kept,
    }
