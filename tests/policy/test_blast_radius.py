from __future__ import annotations

from dataclasses import replace

from console.policy.gates import evaluate_proposal
from console.policy.inputs import BreakerState, FleetState, Limit, Policy, RecentActions
from console.policy.lifecycle import ActionKind
from tests.policy.factories import NOW, automatic, fleet, node, request

AUTO_CORDON = Policy.from_dict({"auto_approve": {"cordon_node": ["xid:79"]}})


def propose(req, state: FleetState, policy: Policy = AUTO_CORDON):
    return evaluate_proposal(
        req, policy=policy, fleet=state, history=RecentActions(), breaker=BreakerState(), now=NOW
    )


def test_it_names_the_pool_count_and_limit_when_blocking() -> None:
    state = fleet({"a100": 16, "h100": 48}, quarantined=[node("a100", i) for i in range(1, 5)])
    decision = propose(automatic(), state)
    assert (
        "blocked by blast radius: 4 of 16 nodes in pool a100 already quarantined or cordoned "
        "(limit 25 %, 4 nodes)"
    ) in decision.reasons


def test_it_holds_a_proposal_above_the_limit_for_two_humans_and_escalates() -> None:
    state = fleet({"a100": 16, "h100": 48}, cordoned=[node("a100", i) for i in range(1, 5)])
    decision = propose(automatic(), state)
    assert not decision.allowed
    assert decision.needs_human
    assert decision.approvals_required == 2
    assert decision.escalate


def test_it_auto_approves_below_the_limit_when_policy_allows() -> None:
    state = fleet({"a100": 16, "h100": 48}, quarantined=[node("a100", i) for i in range(1, 4)])
    decision = propose(automatic(), state)
    assert decision.allowed
    assert decision.approvals_required == 0


def test_it_stops_a_draino_style_storm_well_below_75_percent() -> None:
    # An Xid storm proposes a cordon for every node; apply what the gates allow.
    state = fleet({"a100": 16})
    for i in range(16):
        decision = propose(automatic(id=f"act-{i}", node=node("a100", i)), state)
        if decision.allowed:
            state = replace(state, cordoned=state.cordoned | {node("a100", i)})
    assert len(state.cordoned) == Limit(percent=20).allowed(16)
    assert len(state.cordoned) / 16 < 0.75


def test_it_applies_the_fleet_limit_across_pools() -> None:
    pools = {"a100": 10, "h100": 10}
    out = [node("a100", 1), node("a100", 2), node("h100", 1), node("h100", 2)]
    decision = propose(automatic(node="h100-05"), fleet(pools, cordoned=out))
    assert any("4 of 20 nodes in the fleet" in r for r in decision.reasons)
    assert not decision.allowed


def test_it_does_not_count_a_node_that_is_already_out_twice() -> None:
    out = [node("a100", i) for i in range(4)]
    state = fleet({"a100": 16, "h100": 48}, quarantined=out)
    decision = propose(automatic(kind=ActionKind.DRAIN_NODE, node="a100-00"), state)
    assert not any("blast radius" in r for r in decision.reasons)


def test_it_holds_a_node_missing_from_the_inventory() -> None:
    decision = propose(automatic(node="ghost-01", target="node:ghost-01"), fleet())
    assert decision.needs_human
    assert "node ghost-01 is not in the fleet inventory" in decision.reasons[0]


def test_it_accepts_a_count_limit() -> None:
    policy = Policy.from_dict(
        {"max_nodes_out_per_pool": 1, "auto_approve": {"cordon_node": ["xid"]}}
    )
    decision = propose(automatic(), fleet(cordoned=["a100-03"]), policy)
    assert any("(limit 1 nodes)" in r for r in decision.reasons)


def test_it_limits_isolated_gpus_per_pool() -> None:
    policy = Policy.from_dict(
        {"max_gpus_out_per_pool": 2, "auto_approve": {"isolate_gpu": ["xid"]}}
    )
    state = fleet(isolated_gpus=["a100-03/gpu0", "a100-04/gpu1"])
    req = automatic(kind=ActionKind.ISOLATE_GPU, node=None, gpu="a100-01/gpu2", target="gpu:x")
    decision = propose(req, state, policy)
    assert any("2 of 128 GPUs in pool a100 already isolated" in r for r in decision.reasons)
    assert decision.approvals_required == 2


def test_it_does_not_apply_blast_radius_to_paging() -> None:
    state = fleet(quarantined=[node("a100", i) for i in range(16)])
    decision = propose(request(kind=ActionKind.PAGE_HUMAN, node="a100-00"), state)
    assert not any("blast radius" in r for r in decision.reasons)
    assert decision.approvals_required == 1
