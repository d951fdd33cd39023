"""MFU, HFU, HBM and network utilisation of a training group (console.diagnosis.utilisation):
per rank and whole, from the steps' FLOPs and the GPUs' peaks; absent with a reason, never 0."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents import flops
from console.diagnosis import diagnose
from console.diagnosis import utilisation as util

from .factory import T0, gpu_of, node_of, process, sample, snap, step, transition

H100 = "NVIDIA H100 80GB HBM3"
PEAK = 989.5e12


def _group(
    ranks: int = 4,
    *,
    flops_of: Any = lambda rank: 4e14,  # model FLOPs per step (at 1 s a step: 40 % MFU)
    hw_of: Any = lambda rank: None,
    name_of: Any = lambda rank: H100,
    gpu: Any = gpu_of,
    step_ms: float = 1000.0,
    steps: int = 6,
) -> list[dict[str, Any]]:
    start = T0 - timedelta(seconds=steps + 5)
    recs = [transition(start, "initializing", "running")]
    for rk in range(ranks):
        recs.append(process(rk, start, "started", gpu=gpu(rk)))
        name = name_of(rk)
        recs.append(sample(rk, T0, **({"name": name} if name else {}), mem_util_pct=40.0 + rk))
        for i in range(steps):
            ts = T0 - timedelta(milliseconds=step_ms * (steps - 1 - i))
            extra = {"model_flops": flops_of(rk)} if flops_of(rk) is not None else {}
            if hw_of(rk) is not None:
                extra["hw_flops"] = hw_of(rk)
            recs.append(step(rk, 100 + i, ts, duration_ms=step_ms, **extra))
    return recs


def _rank(use: dict[str, Any], rank: int) -> dict[str, Any]:
    return next(r for r in use["per_rank"] if r["rank"] == rank)


def test_it_divides_each_ranks_flops_per_second_by_its_gpus_peak() -> None:
    use = util.utilisation(snap(_group(flops_of=lambda rk: 4e14 + rk * 1e13)), T0)
    for rk in range(4):
        row = _rank(use, rk)
        assert row["mfu"] == round((4e14 + rk * 1e13) / PEAK, 4)
        assert row["hfu"] == row["mfu"]  # no hardware count: no recomputation reported
        assert row["device"] == H100 and row["hbm_util_pct"] == 40.0 + rk
        assert row["absent"] is None
    assert use["mfu"] == round(sum(4e14 + rk * 1e13 for rk in range(4)) / (4 * PEAK), 4)
    assert use["lowest_rank_mfu"] == _rank(use, 0)["mfu"]
    assert (use["ranks"], use["ranks_with_flops"], use["ranks_with_mfu"]) == (4, 4, 4)


def test_it_counts_recomputation_in_hfu_not_mfu() -> None:
    hw = flops.hardware_flops(4e14, recompute=True)
    use = util.utilisation(snap(_group(hw_of=lambda rk: hw)), T0)
    assert use["hfu"] == round(hw / PEAK, 4) and use["mfu"] == round(4e14 / PEAK, 4)


@pytest.mark.parametrize(
    ("variant", "reason"),
    [
        ({"gpu": lambda rk: None if rk == 2 else gpu_of(rk)}, "no GPU"),  # a CPU rank
        ({"name_of": lambda rk: None if rk == 2 else H100}, "GPU name unknown"),
        (
            {"name_of": lambda rk: "Tesla V100" if rk == 2 else H100},
            "no peak FLOPs for 'Tesla V100'",
        ),
        ({"flops_of": lambda rk: None if rk == 2 else 4e14}, "no FLOPs reported"),
    ],
)
def test_a_rank_without_what_mfu_needs_is_absent_with_why_never_zero(variant, reason) -> None:
    use = util.utilisation(snap(_group(**variant)), T0)
    row = _rank(use, 2)
    assert (row["mfu"], row["hfu"], row["absent"]) == (None, None, reason)
    assert use["absent"] == [{"reason": reason, "ranks": 1}]
    # The others' MFU stands, and the group's is theirs alone (not diluted by a zero).
    assert use["mfu"] == round(4e14 / PEAK, 4) and use["ranks_with_mfu"] == 3


def test_a_cpu_run_has_no_mfu_at_all_and_says_why() -> None:
    use = util.utilisation(snap(_group(gpu=lambda rk: None)), T0)
    assert (use["mfu"], use["hfu"], use["lowest_rank_mfu"]) == (None, None, None)
    assert use["absent"] == [{"reason": "no GPU", "ranks": 4}]
    assert all(r["model_flops_per_s"] == 4e14 for r in use["per_rank"])  # still measured


def test_it_reads_only_the_newest_steps_within_the_window() -> None:
    recs = _group(steps=util.MAX_STEPS)
    # Older, slower steps of rank 0 beyond the last MAX_STEPS: they do not count.
    for i in range(5):
        ts = T0 - timedelta(seconds=util.MAX_STEPS + 10 - i)
        recs.append(step(0, 50 + i, ts, duration_ms=9000.0, model_flops=4e14))
    use = util.utilisation(snap(recs), T0)
    assert _rank(use, 0)["mfu"] == _rank(use, 1)["mfu"] == round(4e14 / PEAK, 4)


def test_a_group_figure_weighs_ranks_by_their_time_not_their_count() -> None:
    slow = _group(ranks=2, step_ms=2000.0)
    fast = [r for r in _group(ranks=2, step_ms=1000.0) if r.get("rank") == 1]
    recs = [r for r in slow if r.get("rank") != 1] + fast
    use = util.utilisation(snap(recs), T0)
    got = [_rank(use, 0)["mfu"], _rank(use, 1)["mfu"]]
    assert got == [round(4e14 / 2 / PEAK, 4), round(4e14 / PEAK, 4)]
    assert use["mfu"] == round((6 * 4e14 + 6 * 4e14) / ((12 + 6) * PEAK), 4)


def test_it_keeps_the_lowest_ranks_and_the_ones_without_an_mfu_first(monkeypatch) -> None:
    monkeypatch.setattr(util, "RANKS_KEPT", 3)
    recs = _group(
        ranks=8,
        flops_of=lambda rk: 1e14 * (rk + 1),
        gpu=lambda rk: None if rk == 6 else gpu_of(rk),
    )
    use = util.utilisation(snap(recs), T0)
    assert [r["rank"] for r in use["per_rank"]] == [0, 1, 6]  # in rank order on the page
    assert use["ranks"] == 8


def _port(node: str, port: str, link: str, ts: Any, **fields: Any) -> dict[str, Any]:
    return {"kind": "net_sample", "ts": ts, "node": node, "port": port, "link": link, **fields}


def test_it_gives_each_rank_its_nodes_fabric_throughput() -> None:
    node = node_of(0)
    recs = [
        *_group(ranks=2),
        _port(node, "mlx5_0/1", "ib", T0, interval_s=2.0,
              counters={"tx_bytes": 30_000, "rx_bytes": 10_000}),
        _port(node, "eth0", "eth", T0, interval_s=4.0, counters={"tx_bytes": 4000}),
        _port(node, "tcp", "tcp", T0, interval_s=1.0, counters={"tx_bytes": 10**9}),
        _port(node, "mlx5_1/1", "ib", T0 - timedelta(seconds=util.NET_FRESH_S + 1),
              interval_s=1.0, counters={"tx_bytes": 10**9}),  # stale: says nothing of now
        _port(node, "mlx5_2/1", "ib", T0, counters={"tx_bytes": 10**9}),  # no span
    ]  # fmt: skip
    use = util.utilisation(snap(recs), T0)
    assert _rank(use, 0)["node_net_bytes_per_s"] == 20_000 + 1000
    assert _rank(use, 1)["node_net_bytes_per_s"] == 20_000 + 1000  # the node's, shared


def test_a_rank_without_port_counters_has_no_throughput() -> None:
    use = util.utilisation(snap(_group(ranks=1)), T0)
    assert _rank(use, 0)["node_net_bytes_per_s"] is None


@settings(max_examples=25, deadline=None)
@given(st.randoms(use_true_random=False))
def test_the_figures_do_not_depend_on_the_order_records_arrive_in(rnd: random.Random) -> None:
    recs = _group(ranks=4, flops_of=lambda rk: 1e14 * (rk + 1), gpu=lambda rk: gpu_of(rk))
    want = util.utilisation(snap(recs), T0)
    shuffled = list(recs)
    rnd.shuffle(shuffled)
    shuffled.sort(key=lambda r: r["ts"])  # arrival order within a timestamp is free
    assert util.utilisation(snap(shuffled), T0) == want


def test_diagnose_puts_it_on_a_training_group_and_not_on_a_serving_one() -> None:
    result = diagnose(snap(_group()), T0 + timedelta(seconds=1))
    assert result.utilisation is not None and result.utilisation["mfu"] is not None
    assert result.to_dict()["utilisation"] == result.utilisation
    serving = {"kind": "serving", "ts": T0, "group": "llama-70b", "worker": "w-1",
               "window": {"seconds": 5.0, "requests": 3, "slo_met": 3}, "ready": True}  # fmt: skip
    assert diagnose(snap([serving]), T0).utilisation is None
