"""Action kinds and the action state machine.

Owns what an action can be (a kind of agents/actions_contract.SPECS, which is all that
describes one) and the only legal moves between its states. It must not
evaluate gates (see `gates.py`) or touch storage: the write path calls
`check_transition` before saving a new state and lets `TransitionError` reach the user.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum

from agents import actions_contract as contract


class _KindNames(type):
    """`ActionKind.CORDON_NODE` and `for kind in ActionKind`, read from the specs on each
    use: a kind added to agents/actions_contract.SPECS is a member without an edit here."""

    def __getattr__(cls, attr: str) -> ActionKind:
        name = attr.lower()
        if attr.isupper() and name in contract.SPECS:
            return ActionKind(name)
        raise AttributeError(f"ActionKind has no kind {attr} (agents/actions_contract.SPECS)")

    def __iter__(cls) -> Iterator[ActionKind]:
        return iter([ActionKind(name) for name in contract.SPECS])


class ActionKind(str, metaclass=_KindNames):
    """What the service may propose: a kind of agents/actions_contract.SPECS, which
    describes it (target, effect on capacity, inverse, params, preview). Kinds an agent
    executes (`spec.agent`) are the contract's; the others are the service's own until the
    contract carries them. Constructing one from an unknown name raises ValueError."""

    __slots__ = ()

    def __new__(cls, value: str) -> ActionKind:
        if str(value) not in contract.SPECS:
            known = ", ".join(contract.SPECS)
            raise ValueError(f'unknown action kind "{value}"; known: {known}')
        return super().__new__(cls, value)

    @property
    def value(self) -> str:
        return str(self)

    @property
    def spec(self) -> contract.KindSpec:
        return kind_spec(self)


def kind_spec(kind: str) -> contract.KindSpec:
    """The spec of `kind`; ValueError names the known kinds."""
    spec = contract.spec_of(str(kind))
    if spec is None:
        raise ValueError(f'unknown action kind "{kind}"; known: {", ".join(contract.SPECS)}')
    return spec


# Kinds a node agent runs through the contract, as it stood at import (the rest answer "no
# hook configured" unless a site configures one by that name).
CONTRACT_KINDS = frozenset(k for k in ActionKind if k.spec.agent)


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
