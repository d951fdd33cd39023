from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from console.policy.gates import decide_approval
from console.policy.inputs import BreakerState, Policy, RecentActions
from console.policy.lifecycle import ActionState
from console.policy.votes import VoteRefused, check_vote, tally
from tests.policy.factories import NOW, fleet, node, request, vote


def decide(req, votes, **kw):
    return decide_approval(
        req,
        votes,
        policy=kw.get("policy", Policy()),
        fleet=kw.get("fleet", fleet()),
        history=RecentActions(),
        breaker=BreakerState(),
        now=kw.get("now", NOW),
    )


def test_it_refuses_self_approval() -> None:
    with pytest.raises(VoteRefused, match="olga proposed action act-1 and may not approve it"):
        check_vote(request(proposed_by="olga"), vote("olga"), [], now=NOW)


def test_it_refuses_self_approval_spelled_differently() -> None:
    with pytest.raises(VoteRefused, match="may not approve"):
        check_vote(request(proposed_by="olga"), vote(" OLGA "), [], now=NOW)


def test_it_does_not_count_a_stored_self_approval() -> None:
    decision = decide(request(proposed_by="olga"), [vote("olga")])
    assert not decision.allowed
    assert decision.approvals == ()
    assert any("may not approve" in r for r in decision.reasons)


def test_it_lets_the_proposer_reject_their_own_action() -> None:
    check_vote(request(proposed_by="olga"), vote("olga", approve=False), [], now=NOW)


def test_it_refuses_a_second_vote_by_the_same_approver() -> None:
    with pytest.raises(VoteRefused, match="already voted"):
        check_vote(request(), vote("pat"), [vote("pat")], now=NOW)


def test_it_counts_a_double_vote_once() -> None:
    counted = tally(request(), [vote("pat"), vote("pat", cast_at=NOW + timedelta(seconds=1))])
    assert counted.approvers == ("pat",)
    assert len(counted.ignored) == 1


def test_it_refuses_an_approval_replayed_from_another_action() -> None:
    with pytest.raises(VoteRefused, match="is for action act-0, not act-1"):
        check_vote(request(), vote("pat", action_id="act-0"), [], now=NOW)


def test_it_ignores_an_approval_replayed_from_an_older_generation() -> None:
    req = request(group="llama", generation=8)
    counted = tally(req, [vote("pat", generation=7)])
    assert counted.approvers == ()
    assert "generation 7" in counted.ignored[0]


def test_it_refuses_approval_after_expiry() -> None:
    req = request(expires_at=NOW - timedelta(seconds=1))
    with pytest.raises(VoteRefused, match="expired"):
        check_vote(req, vote("pat"), [], now=NOW)


def test_it_refuses_approval_of_an_expired_action_at_decision_time() -> None:
    req = request(expires_at=NOW - timedelta(seconds=1))
    decision = decide(req, [vote("pat", cast_at=NOW - timedelta(minutes=5))])
    assert decision.refused and not decision.allowed


def test_it_ignores_a_vote_dated_after_expiry() -> None:
    req = request(expires_at=NOW)
    assert tally(req, [vote("pat", cast_at=NOW + timedelta(seconds=1))]).approvers == ()


@pytest.mark.parametrize("state", [s for s in ActionState if s != ActionState.PROPOSED])
def test_it_refuses_votes_on_an_action_that_is_not_proposed(state: ActionState) -> None:
    with pytest.raises(VoteRefused, match="voting is closed"):
        check_vote(request(state=state), vote("pat"), [], now=NOW)


def test_it_refuses_an_operator_approving() -> None:
    with pytest.raises(VoteRefused, match="needs the approver role"):
        check_vote(request(), vote("oscar", role="operator"), [], now=NOW)


def test_it_approves_with_one_valid_approval() -> None:
    decision = decide(request(), [vote("pat")])
    assert decision.allowed
    assert decision.approvals == ("pat",)


def test_it_lets_any_reject_win() -> None:
    decision = decide(request(), [vote("pat"), vote("quinn"), vote("ravi", approve=False)])
    assert not decision.allowed
    assert decision.refused
    assert "rejected by ravi" in decision.reasons


def test_it_needs_two_distinct_approvers_above_the_blast_radius_limit() -> None:
    full = fleet(quarantined=[node("a100", i) for i in range(1, 5)])
    req = replace(request(), node="a100-00")
    one = decide(req, [vote("pat")], fleet=full)
    twice = decide(req, [vote("pat"), vote("pat")], fleet=full)
    two = decide(req, [vote("pat"), vote("quinn")], fleet=full)
    assert one.approvals_required == 2 and not one.allowed
    assert not twice.allowed
    assert two.allowed
