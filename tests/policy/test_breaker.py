from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from console.policy.breaker import BreakerError, close_breaker, open_breaker, trip
from console.policy.gates import check_dispatch, evaluate_proposal
from console.policy.inputs import BreakerState, Policy, RecentActions
from console.policy.lifecycle import ActionState
from tests.policy.factories import NOW, automatic, fleet, history, records, vote

AUTO = Policy.from_dict({"auto_approve": {"cordon_node": ["xid"]}})
OPEN = BreakerState(open=True, reason="11 automatic actions", opened_at=NOW)


def test_it_opens_after_too_many_automatic_actions() -> None:
    state = trip(BreakerState(), history(records(10)), Policy(), NOW)
    assert state.open
    assert state.reason == "10 automatic actions in the last 10 min (limit 10)"
    assert state.opened_at == NOW


def test_it_stays_closed_when_the_actions_were_human() -> None:
    assert not trip(BreakerState(), history(records(10, automatic=False)), Policy(), NOW).open


def test_it_opens_after_too_many_failures() -> None:
    state = trip(BreakerState(), history(records(3, automatic=False, failed=True)), Policy(), NOW)
    assert state.open
    assert "3 actions failed" in state.reason


def test_it_never_closes_itself_as_time_passes() -> None:
    later = NOW + timedelta(days=3)
    assert trip(OPEN, RecentActions(), Policy(), later).open


def test_it_makes_every_action_need_a_human_while_open() -> None:
    decision = evaluate_proposal(
        automatic(), policy=AUTO, fleet=fleet(), history=RecentActions(), breaker=OPEN, now=NOW
    )
    assert not decision.allowed
    assert decision.needs_human
    assert any("circuit breaker open since" in r for r in decision.reasons)


def test_it_trips_during_a_proposal_and_returns_the_new_state() -> None:
    decision = evaluate_proposal(
        automatic(),
        policy=AUTO,
        fleet=fleet(),
        history=history(records(10, ago=timedelta(minutes=2))),
        breaker=BreakerState(),
        now=NOW,
    )
    assert decision.breaker.open
    assert not decision.allowed


@pytest.mark.parametrize("role", ["viewer", "operator", "approver"])
def test_it_refuses_closing_by_anyone_but_an_admin(role: str) -> None:
    with pytest.raises(BreakerError, match="only an admin"):
        close_breaker(OPEN, actor="mallory", role=role, reason="looks fine", now=NOW)


def test_it_refuses_closing_without_a_reason() -> None:
    with pytest.raises(BreakerError, match="needs a reason"):
        close_breaker(OPEN, actor="ada", role="admin", reason="  ", now=NOW)


def test_it_records_who_closed_it_and_why() -> None:
    closed = close_breaker(OPEN, actor="ada", role="admin", reason="bad NIC firmware", now=NOW)
    assert not closed.open
    assert (closed.closed_by, closed.close_reason, closed.closed_at) == (
        "ada",
        "bad NIC firmware",
        NOW,
    )


def test_it_does_not_reopen_on_the_history_an_admin_already_judged() -> None:
    closed = close_breaker(OPEN, actor="ada", role="admin", reason="fixed", now=NOW)
    storm = history(records(10, ago=timedelta(minutes=1)))
    assert not trip(closed, storm, Policy(), NOW + timedelta(minutes=1)).open


def test_it_lets_an_operator_open_it_but_not_a_viewer() -> None:
    opened = open_breaker(BreakerState(), actor="oscar", role="operator", reason="storm", now=NOW)
    assert opened.open and "oscar" in opened.reason
    with pytest.raises(BreakerError):
        open_breaker(BreakerState(), actor="vic", role="viewer", reason="storm", now=NOW)


def test_it_refuses_dispatching_an_auto_approved_action_after_the_breaker_opened() -> None:
    approved = replace(automatic(), state=ActionState.APPROVED)
    decision = check_dispatch(
        approved, [], policy=AUTO, fleet=fleet(), history=RecentActions(), breaker=OPEN, now=NOW
    )
    assert decision.refused and not decision.allowed
    assert "not dispatched: the gates changed since approval" in decision.reasons


def test_it_dispatches_a_human_approved_action_while_the_breaker_is_open() -> None:
    approved = replace(automatic(), state=ActionState.APPROVED)
    decision = check_dispatch(
        approved,
        [vote("pat")],
        policy=AUTO,
        fleet=fleet(),
        history=RecentActions(),
        breaker=OPEN,
        now=NOW,
    )
    assert decision.allowed
