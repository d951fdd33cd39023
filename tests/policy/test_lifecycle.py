from __future__ import annotations

import pytest

from console.policy.lifecycle import (
    TERMINAL,
    TRANSITIONS,
    ActionState,
    TransitionError,
    check_transition,
    is_terminal,
)

# Sorted: TRANSITIONS holds sets, and every xdist worker must collect the same order.
ALLOWED = sorted((cur, tgt) for cur, targets in TRANSITIONS.items() for tgt in targets)


@pytest.mark.parametrize(("current", "target"), ALLOWED)
def test_it_allows_each_listed_transition(current: ActionState, target: ActionState) -> None:
    assert check_transition(current.value, target.value) is target


@pytest.mark.parametrize("state", sorted(TERMINAL))
def test_it_refuses_leaving_a_final_state(state: ActionState) -> None:
    with pytest.raises(TransitionError, match="is final"):
        check_transition(state, ActionState.APPROVED)


def test_it_refuses_dispatching_an_unapproved_action() -> None:
    with pytest.raises(TransitionError) as err:
        check_transition("proposed", "dispatched")
    assert "approved, cancelled, expired, rejected" in str(err.value)


def test_it_refuses_staying_in_the_same_state() -> None:
    with pytest.raises(TransitionError):
        check_transition("approved", "approved")


def test_it_names_an_unknown_state() -> None:
    with pytest.raises(TransitionError, match='unknown target action state "done"'):
        check_transition("dispatched", "done")


def test_it_marks_only_states_without_exits_as_terminal() -> None:
    assert is_terminal("succeeded")
    assert not is_terminal("dispatched")


def test_it_takes_the_wire_names_of_agent_executed_kinds_from_the_action_contract():
    from agents import actions_contract as contract
    from console.policy.lifecycle import CONTRACT_KINDS, ActionKind

    assert {k.value for k in CONTRACT_KINDS} == {
        "quarantine_node", "cordon_node", "drain_node", "isolate_gpu", "restart_group",
        "uncordon_node", "release_gpu",
    }  # fmt: skip
    assert all(contract.KINDS[k.value].name == k.value for k in CONTRACT_KINDS)
    assert [k.value for k in ActionKind][:4] == [
        "quarantine_node", "cordon_node", "drain_node", "isolate_gpu",
    ]  # fmt: skip
