"""Action kinds and the action state machine.

Owns what an action can be and the only legal moves between its states. It must not
evaluate gates (see `gates.py`) or touch storage: the write path calls
`check_transition` before saving a new state and lets `TransitionError` reach the user.
"""

from __future__ import annotations

from enum import StrEnum

from agents import actions_contract as contract


class ActionKind(StrEnum):
    """What the service may propose. Kinds an agent executes take their wire names from
    agents/actions_contract.py (the agent's hook table is keyed by them); the others are
    the service's own until the contract carries them."""

    QUARANTINE_NODE = contract.QUARANTINE_NODE
    CORDON_NODE = contract.CORDON_NODE
    DRAIN_NODE = contract.DRAIN_NODE
    ISOLATE_GPU = contract.ISOLATE_GPU
    ISOLATE_RANK = "isolate_rank"
    RESTART_GROUP = contract.RESTART_GROUP
    UNCORDON_NODE = contract.UNCORDON_NODE
    RELEASE_GPU = contract.RELEASE_GPU
    ROLLBACK_MODEL = "rollback_model"
    PAGE_HUMAN = "page_human"


# Kinds a node agent runs through the contract (the rest answer "no hook configured"
# unless a site configures one by that name).
CONTRACT_KINDS = frozenset(k for k in ActionKind if k.value in contract.KINDS)


class ActionState(StrEnum):
    PROPOSED = "proposed"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    DISPATCHED = "dispatched"
    ACKNOWLEDGED = "acknowledged"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


# Kinds that take a whole node out of service; they count against the node blast radius.
NODE_KINDS = frozenset({ActionKind.QUARANTINE_NODE, ActionKind.CORDON_NODE, ActionKind.DRAIN_NODE})
# Kinds that take one GPU out of service; they count against the GPU blast radius.
GPU_KINDS = frozenset({ActionKind.ISOLATE_GPU})
# Kinds that put capacity back: blast radius does not apply; ownership and the
# repeat-offender rule do (console.policy.gates).
RETURN_KINDS = frozenset({ActionKind.UNCORDON_NODE, ActionKind.RELEASE_GPU})
# Kinds that restart work; diagnosis may declare them unsafe (auto_restart_safe=false).
RESTART_KINDS = frozenset({ActionKind.RESTART_GROUP})

TRANSITIONS: dict[ActionState, frozenset[ActionState]] = {
    ActionState.PROPOSED: frozenset(
        {
            ActionState.APPROVED,
            ActionState.REJECTED,
            ActionState.EXPIRED,
            ActionState.CANCELLED,
        }
    ),
    # An approved action that the dispatch re-check refuses is cancelled, never re-voted.
    # A dry run is never dispatched: at dispatch it succeeds with its preview as the result.
    ActionState.APPROVED: frozenset(
        {ActionState.DISPATCHED, ActionState.CANCELLED, ActionState.EXPIRED, ActionState.SUCCEEDED}
    ),
    # An agent may report the outcome without a separate acknowledgement.
    ActionState.DISPATCHED: frozenset(
        {ActionState.ACKNOWLEDGED, ActionState.SUCCEEDED, ActionState.FAILED}
    ),
    ActionState.ACKNOWLEDGED: frozenset({ActionState.SUCCEEDED, ActionState.FAILED}),
    ActionState.REJECTED: frozenset(),
    ActionState.EXPIRED: frozenset(),
    ActionState.CANCELLED: frozenset(),
    ActionState.SUCCEEDED: frozenset(),
    ActionState.FAILED: frozenset(),
}

# In flight: approved, handed to the agent, or acknowledged by it (ingest asks whether a
# node has any on every batch).
LIVE_STATES = (ActionState.APPROVED, ActionState.DISPATCHED, ActionState.ACKNOWLEDGED)
# Handed to an agent and not yet reported on: what rides back to the agent until it answers.
IN_FLIGHT_STATES = (ActionState.DISPATCHED, ActionState.ACKNOWLEDGED)
# Dispatched at some point: what the rate limit, repeat and breaker windows count.
HISTORY_STATES = (
    ActionState.DISPATCHED,
    ActionState.ACKNOWLEDGED,
    ActionState.SUCCEEDED,
    ActionState.FAILED,
)
# A decision on a proposal (sets decided_at) and an end of the road (sets finished_at).
DECIDED_STATES = frozenset(
    {ActionState.APPROVED, ActionState.REJECTED, ActionState.CANCELLED, ActionState.EXPIRED}
)

TERMINAL = frozenset(state for state, targets in TRANSITIONS.items() if not targets)


class TransitionError(ValueError):
    """A state change the action state machine does not allow."""


def _state(value: str | ActionState, what: str) -> ActionState:
    try:
        return ActionState(value)
    except ValueError:
        known = ", ".join(s.value for s in ActionState)
        raise TransitionError(f'unknown {what} action state "{value}"; known: {known}') from None


def check_transition(current: str | ActionState, target: str | ActionState) -> ActionState:
    """Return `target` as an `ActionState` if `current -> target` is allowed, else raise."""
    cur = _state(current, "current")
    tgt = _state(target, "target")
    allowed = TRANSITIONS[cur]
    if tgt in allowed:
        return tgt
    if not allowed:
        raise TransitionError(
            f'cannot move action from "{cur}" to "{tgt}": "{cur}" is final; propose a new action'
        )
    options = ", ".join(sorted(s.value for s in allowed))
    raise TransitionError(
        f'cannot move action from "{cur}" to "{tgt}"; from "{cur}" it may go to: {options}'
    )


def is_terminal(state: str | ActionState) -> bool:
    """Whether no further transition is possible from `state`."""
    return ActionState(state) in TERMINAL
