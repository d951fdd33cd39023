"""Checkpoint-interval and hot-spare advice from a group's own numbers.

Owns the closed forms — Young's optimal interval sqrt(2*C*M), Daly's first-order
sqrt(2*C*M) - C and his higher-order correction — the expected-waste models they minimise,
the MTBF estimate from failures on the group's nodes (blended with a documented prior when
there are few), and whether hot spares pay (restart cost avoided vs. idle GPU-hours). Every
figure carries what it was computed from. Pure: plain numbers in, no ORM, no clock.

Models (failures Poisson with mean time between failures M, checkpoint write cost C, the
interval t of useful work between checkpoints), as fractions of wall time wasted:
- young:  C/t + t/(2M)              (Young 1974; minimised at t = sqrt(2CM))
- daly:   C/(t+C) + (t+C)/(2M)      (first order in the period t+C; minimised at
                                     t = sqrt(2CM) - C, Daly 2006 eq. 20)
- exact:  1 - t / (M*e^{R/M}*(e^{(t+C)/M} - 1))   (Daly's exponential model with restart
                                     cost R; the higher-order formula approximates its
                                     minimum)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from console import formats

# The prior when a group's nodes have too few failures of their own: Llama 3's 405B run saw
# 419 unexpected interruptions in 54 days on 16,384 GPUs (2,048 nodes of 8), about one per
# node every 6,300 node-hours; weighted as one failure, so three observed failures outweigh it.
PRIOR_NODE_MTBF_H = 54 * 24 * 2048 / 419
PRIOR_FAILURES = 1.0
ENOUGH_FAILURES = 3
# A restart's cost when the group has no measured recovery yet (10 minutes).
PRIOR_RESTART_S = 600.0


def young(cost_s: float, mtbf_s: float) -> float:
    """Young's optimal checkpoint interval sqrt(2*C*M)."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_first_order(cost_s: float, mtbf_s: float) -> float:
    """Daly's first-order optimum sqrt(2*C*M) - C (never below C: write at least as long
    as the interval makes no sense)."""
    return max(math.sqrt(2.0 * cost_s * mtbf_s) - cost_s, cost_s)


def daly_higher_order(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order estimate; M itself once C >= 2M (checkpointing cannot keep up)."""
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - cost_s


def expected_waste(
    interval_s: float, cost_s: float, mtbf_s: float, model: str = "daly", restart_s: float = 0.0
) -> float:
    """Fraction of wall time lost to checkpoints and rework at interval t (module doc)."""
    tau, c, m = interval_s, cost_s, mtbf_s
    if tau <= 0 or m <= 0:
        raise ValueError("interval and MTBF must be positive")
    if model == "young":
        return c / tau + tau / (2.0 * m)
    if model == "daly":
        return c / (tau + c) + (tau + c) / (2.0 * m)
    if model == "exact":
        wall = m * math.exp(restart_s / m) * math.expm1((tau + c) / m)
        return 1.0 - tau / wall
    raise ValueError(f"unknown model {model!r}: young, daly or exact")


@dataclass(frozen=True)
class Mtbf:
    """The group's mean time between failures and what backs it."""

    group_mtbf_h: float
    node_mtbf_h: float
    failures: int  # observed on the group's nodes in the window
    node_hours: float  # observed exposure
    nodes: int
    basis: str  # "observed" or "observed+prior"


def mtbf(
    *,
    failures: int,
    node_hours: float,
    nodes: int,
    prior_node_mtbf_h: float = PRIOR_NODE_MTBF_H,
    prior_failures: float = PRIOR_FAILURES,
) -> Mtbf:
    """Group MTBF = node MTBF / nodes (any node's failure stops a synchronous job). With
    fewer than ENOUGH_FAILURES the node rate is the Gamma-Poisson posterior mean
    (failures + k0) / (node_hours + k0*prior MTBF); otherwise the observed rate."""
    nodes = max(nodes, 1)
    if failures >= ENOUGH_FAILURES and node_hours > 0:
        node_h, basis = node_hours / failures, "observed"
    else:
        node_h = (node_hours + prior_failures * prior_node_mtbf_h) / (failures + prior_failures)
        basis = "observed+prior"
    return Mtbf(
        group_mtbf_h=node_h / nodes,
        node_mtbf_h=node_h,
        failures=failures,
        node_hours=node_hours,
        nodes=nodes,
        basis=basis,
    )


def median(values: Sequence[float]) -> float | None:
    vals = sorted(values)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2.0


@dataclass(frozen=True)
class IntervalAdvice:
    cost_s: float | None  # median measured checkpoint write cost C
    cost_samples: int
    mtbf: Mtbf
    young_s: float | None
    daly_s: float | None  # the advised interval (first order)
    daly_higher_order_s: float | None
    actual_s: float | None  # median gap between the group's committed checkpoints
    actual_samples: int
    waste_at_actual: float | None  # daly model
    waste_at_advised: float | None
    gpu_hours_per_day_saved: float | None  # switching from actual to advised
    gpus: int
    basis: list[str] = field(default_factory=list)  # what each figure was computed from

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def interval_advice(
    *,
    checkpoint_costs_s: Sequence[float],
    commit_times_s: Sequence[float],
    mtbf_estimate: Mtbf,
    gpus: int,
) -> IntervalAdvice:
    """Young/Daly intervals from the measured C and the MTBF, against the interval used.

    `commit_times_s`: the group's commit instants (any epoch, seconds), oldest first."""
    costs = [c for c in checkpoint_costs_s if c > 0]
    cost = median(costs)
    gaps = [b - a for a, b in itertools.pairwise(commit_times_s) if b > a]
    actual = median(gaps)
    m_s = mtbf_estimate.group_mtbf_h * 3600.0
    mt = mtbf_estimate
    basis = [
        f"MTBF {formats.number(mt.group_mtbf_h, 'h')} = node MTBF "
        f"{formats.number(mt.node_mtbf_h, 'h')} / {mt.nodes} node(s); "
        f"{mt.failures} failure(s) in {formats.number(mt.node_hours)} node-hours"
        + (
            f" blended with a prior of {PRIOR_NODE_MTBF_H:.0f} node-hours per failure "
            f"(Llama 3, weight {PRIOR_FAILURES:g} failure)"
            if mt.basis != "observed"
            else ""
        ),
    ]
    if cost is None:
        basis.append("no checkpoint write cost measured (no checkpoint with duration_ms)")
        return IntervalAdvice(
            None, 0, mt, None, None, None, actual, len(gaps), None, None, None, gpus, basis
        )
    basis.append(f"C = {cost:.1f} s, median duration_ms of {len(costs)} checkpoint record(s)")
    y, d, dh = young(cost, m_s), daly_first_order(cost, m_s), daly_higher_order(cost, m_s)
    at_adv = expected_waste(d, cost, m_s)
    at_act = None if actual is None else expected_waste(max(actual - cost, 1e-9), cost, m_s)
    if actual is None:
        basis.append("no interval in use measured (fewer than two committed checkpoints)")
    else:
        basis.append(
            f"interval in use {actual:.0f} s, median gap of {len(gaps)} commit pair(s) "
            "(the write cost included)"
        )
    saved = None if at_act is None else round(max(at_act - at_adv, 0.0) * gpus * 24.0, 2)
    return IntervalAdvice(
        cost_s=cost,
        cost_samples=len(costs),
        mtbf=mt,
        young_s=y,
        daly_s=d,
        daly_higher_order_s=dh,
        actual_s=actual,
        actual_samples=len(gaps),
        waste_at_actual=at_act,
        waste_at_advised=at_adv,
        gpu_hours_per_day_saved=saved,
        gpus=gpus,
        basis=basis,
    )


@dataclass(frozen=True)
class SpareAdvice:
    spares_pay: bool
    saved_gpu_hours_per_day: float  # restart cost avoided
    idle_gpu_hours_per_day: float  # what the spares cost standing by
    break_even_mtbf_h: float  # spares pay when the group's MTBF is below this
    restart_s: float
    restart_basis: str
    spare_gpus: int
    basis: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def spare_advice(
    *,
    group_gpus: int,
    spare_gpus: int,
    mtbf_estimate: Mtbf,
    restart_costs_s: Sequence[float],
) -> SpareAdvice:
    """Hot spares pay when the GPU time a failure costs the whole group while it waits for a
    replacement (upper bound: the measured restart, restore included) exceeds the spares'
    idle time: failures/day x G x R  >  spare GPUs x 24 h."""
    measured = median([r for r in restart_costs_s if r > 0])
    restart = PRIOR_RESTART_S if measured is None else measured
    restart_basis = (
        f"prior {PRIOR_RESTART_S:.0f} s (no measured recovery)"
        if measured is None
        else f"median of {len([r for r in restart_costs_s if r > 0])} measured recovery(ies)"
    )
    per_day = 24.0 / mtbf_estimate.group_mtbf_h
    saved = per_day * group_gpus * restart / 3600.0
    idle = spare_gpus * 24.0
    break_even = group_gpus * restart / 3600.0 / max(spare_gpus, 1)
    return SpareAdvice(
        spares_pay=saved > idle,
        saved_gpu_hours_per_day=round(saved, 3),
        idle_gpu_hours_per_day=round(idle, 3),
        break_even_mtbf_h=break_even,
        restart_s=restart,
        restart_basis=restart_basis,
        spare_gpus=spare_gpus,
        basis=[
            f"{per_day:.3f} failures/day from the group MTBF ({mtbf_estimate.basis})",
            f"restart cost {restart:.0f} s ({restart_basis}) x {group_gpus} GPU(s)",
            f"{spare_gpus} spare GPU(s) idle 24 h/day",
        ],
    )
