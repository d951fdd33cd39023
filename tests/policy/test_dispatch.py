from __future__ import annotations

from console.policy.gates import check_dispatch, evaluate_proposal
from console.policy.inputs import BreakerState, FleetState, Policy, RecentActions
from console.policy.lifecycle import ActionKind, ActionState
from tests.policy.factories import NOW, automatic, fleet, node, request, vote

RESTART = dict(
    id="act-1",
    kind=ActionKind.RESTART_GROUP,
    target="group:llama",
    node=None,
    group="llama",
    generation=7,
)


def dispatch(req, votes, state: FleetState, policy: Policy | None = None):
    return check_dispatch(
        req,
        votes,
        policy=policy or Policy(),
        fleet=state,
        history=RecentActions(),
        breaker=BreakerState(),
        now=NOW,
    )


def test_it_dispatches_an_approved_action_on_the_same_generation() -> None:
    req = request(state=ActionState.APPROVED, **RESTART)
    decision = dispatch(req, [vote("pat", generation=7)], fleet(generations={"llama": 7}))
    assert decision.allowed


def test_it_refuses_dispatch_after_the_generation_changed() -> None:
    req = request(state=ActionState.APPROVED, **RESTART)
    decision = dispatch(req, [vote("pat", generation=7)], fleet(generations={"llama": 8}))
    assert decision.refused and not decision.allowed
    assert decision.reasons[0].startswith("stale: group llama is at generation 8")


def test_it_refuses_a_group_action_that_recorded_no_generation() -> None:
    req = request(state=ActionState.APPROVED, **{**RESTART, "generation": None})
    decision = dispatch(req, [vote("pat")], fleet(generations={"llama": 7}))
    assert decision.refused


def test_it_refuses_dispatching_an_action_that_is_not_approved() -> None:
    decision = dispatch(request(), [vote("pat")], fleet())
    assert decision.refused
    assert decision.reasons == ("action act-1 is proposed, not approved",)


def test_it_refuses_when_the_blast_radius_filled_up_after_approval() -> None:
    # Approved by one person while the pool was healthy; four nodes went out since.
    req = request(state=ActionState.APPROVED)
    full = fleet({"a100": 16, "h100": 48}, cordoned=[node("a100", i) for i in range(1, 5)])
    decision = dispatch(req, [vote("pat")], full)
    assert decision.refused
    assert decision.approvals_required == 2
    assert any(r.startswith("blocked by blast radius: 4 of 16") for r in decision.reasons)


def test_it_does_not_let_an_approval_bypass_a_gate_at_dispatch() -> None:
    policy = Policy.from_dict({"auto_approve": {"cordon_node": ["xid"]}})
    proposal = evaluate_proposal(
        automatic(),
        policy=policy,
        fleet=fleet(),
        history=RecentActions(),
        breaker=BreakerState(),
        now=NOW,
    )
    assert proposal.allowed
    full = fleet({"a100": 16, "h100": 48}, cordoned=[node("a100", i) for i in range(1, 5)])
    later = dispatch(automatic(state=ActionState.APPROVED), [], full, policy)
    assert not later.allowed


def test_it_ignores_votes_replayed_from_another_action_at_dispatch() -> None:
    req = request(state=ActionState.APPROVED)
    decision = dispatch(req, [vote("pat", action_id="act-9")], fleet())
    assert not decision.allowed
