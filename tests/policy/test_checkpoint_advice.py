"""Checkpoint-interval and hot-spare advice: closed forms on textbook inputs, and
the advised interval minimises its model's expected waste (numerically, over a grid)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console.policy import checkpoint_advice as ca


def test_young_and_daly_on_textbook_inputs() -> None:
    # C = 5 min, M = 24 h: sqrt(2 * 300 * 86400) = 7200 s exactly.
    assert ca.young(300, 86400) == pytest.approx(7200.0)
    assert ca.daly_first_order(300, 86400) == pytest.approx(6900.0)
    # Daly's higher order: sqrt(2CM)(1 + sqrt(x)/3 + x/9) - C with x = C/2M = 1/576.
    assert ca.daly_higher_order(300, 86400) == pytest.approx(7200 * (1 + 1 / 72 + 1 / 5184) - 300)
    # C >= 2M: checkpointing cannot keep up; Daly advises M.
    assert ca.daly_higher_order(500, 200) == 200


def _grid_argmin(model: str, cost: float, mtbf: float, restart: float = 0.0) -> float:
    lo, hi = cost * 0.05, mtbf * 2
    best, best_w = lo, math.inf
    n = 4000
    for i in range(n + 1):
        t = lo * (hi / lo) ** (i / n)  # log grid: intervals span decades
        w = ca.expected_waste(t, cost, mtbf, model, restart_s=restart)
        if w < best_w:
            best, best_w = t, w
    return best


@settings(max_examples=60, deadline=None)
@given(
    cost=st.floats(min_value=1.0, max_value=1800.0),
    mtbf_h=st.floats(min_value=0.5, max_value=5000.0),
)
def test_the_advised_interval_minimises_the_models_expected_waste(
    cost: float, mtbf_h: float
) -> None:
    mtbf = mtbf_h * 3600.0
    if cost * 20 > mtbf:
        return  # the first-order models assume C << M
    step = 10 ** (math.log10((mtbf * 2) / (cost * 0.05)) / 4000) - 1  # grid resolution
    for model, advised in (
        ("young", ca.young(cost, mtbf)),
        ("daly", ca.daly_first_order(cost, mtbf)),
    ):
        found = _grid_argmin(model, cost, mtbf)
        assert found == pytest.approx(advised, rel=2 * step + 1e-9), model
        # and no grid point beats it
        w = ca.expected_waste(advised, cost, mtbf, model)
        assert w <= ca.expected_waste(found, cost, mtbf, model) + 1e-12


@settings(max_examples=30, deadline=None)
@given(cost=st.floats(min_value=5.0, max_value=600.0), mtbf_h=st.floats(min_value=2, max_value=500))
def test_daly_higher_order_is_near_the_exact_models_optimum(cost: float, mtbf_h: float) -> None:
    mtbf = mtbf_h * 3600.0
    if cost * 20 > mtbf:
        return
    found = _grid_argmin("exact", cost, mtbf, restart=120.0)
    higher = ca.daly_higher_order(cost, mtbf)
    exact = ca.expected_waste(found, cost, mtbf, "exact", restart_s=120.0)
    # The approximation costs almost nothing: within 0.1 % of wall time of the optimum.
    assert ca.expected_waste(higher, cost, mtbf, "exact", restart_s=120.0) - exact < 1e-3


def test_mtbf_blends_a_prior_until_enough_failures_back_it() -> None:
    few = ca.mtbf(failures=0, node_hours=720.0, nodes=4)
    assert few.basis == "observed+prior" and few.failures == 0
    assert few.node_mtbf_h == pytest.approx(720.0 + ca.PRIOR_NODE_MTBF_H)
    assert few.group_mtbf_h == pytest.approx(few.node_mtbf_h / 4)
    many = ca.mtbf(failures=6, node_hours=2880.0, nodes=4)
    assert many.basis == "observed" and many.node_mtbf_h == 480.0 and many.group_mtbf_h == 120.0


def test_interval_advice_compares_the_interval_in_use_and_says_what_it_rests_on() -> None:
    est = ca.mtbf(failures=6, node_hours=6 * 24 * 3600 / 3600 * 1.0, nodes=1)  # M = 24 h
    assert est.group_mtbf_h == pytest.approx(24.0)
    commits = [i * 1800.0 for i in range(6)]  # every 30 min
    adv = ca.interval_advice(
        checkpoint_costs_s=[300.0, 290.0, 310.0], commit_times_s=commits, mtbf_estimate=est, gpus=64
    )
    assert adv.cost_s == 300.0 and adv.actual_s == 1800.0 and adv.daly_s == pytest.approx(6900.0)
    assert adv.waste_at_actual is not None and adv.waste_at_advised is not None
    assert adv.waste_at_advised < adv.waste_at_actual
    assert adv.gpu_hours_per_day_saved == pytest.approx(
        round((adv.waste_at_actual - adv.waste_at_advised) * 64 * 24, 2)
    )
    assert any("3 checkpoint record(s)" in b for b in adv.basis)
    assert any("6 failure(s)" in b for b in adv.basis)
    none = ca.interval_advice(checkpoint_costs_s=[], commit_times_s=[], mtbf_estimate=est, gpus=8)
    assert none.daly_s is None and any("no checkpoint write cost" in b for b in none.basis)


def test_hot_spares_pay_only_when_failures_are_frequent_and_restarts_slow() -> None:
    frequent = ca.mtbf(failures=10, node_hours=100.0, nodes=100)  # group MTBF 0.1 h
    pays = ca.spare_advice(
        group_gpus=800, spare_gpus=8, mtbf_estimate=frequent, restart_costs_s=[900.0]
    )
    # 240 failures/day x 800 GPUs x 0.25 h = 48,000 GPU-h saved vs 192 GPU-h idle.
    assert pays.spares_pay and pays.saved_gpu_hours_per_day == pytest.approx(48000.0)
    rare = ca.mtbf(failures=3, node_hours=30000.0, nodes=2)  # group MTBF 5,000 h
    no = ca.spare_advice(group_gpus=16, spare_gpus=8, mtbf_estimate=rare, restart_costs_s=[60.0])
    assert not no.spares_pay and no.idle_gpu_hours_per_day == 192.0
    assert no.break_even_mtbf_h == pytest.approx(16 * 60 / 3600 / 8)
    prior = ca.spare_advice(group_gpus=16, spare_gpus=8, mtbf_estimate=rare, restart_costs_s=[])
    assert prior.restart_s == ca.PRIOR_RESTART_S and "prior" in prior.restart_basis
