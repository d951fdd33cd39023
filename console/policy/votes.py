"""Approval votes: who may vote, and which votes count.

Owns the vote rules: nobody approves an action they proposed, one vote per approver,
a vote counts only for the action and generation it was cast on, no votes after the
proposal expired or once it left `proposed`. `check_vote` refuses a vote being cast;
`tally` re-checks every stored vote so a bad row can never count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from console.policy.inputs import ActionRequest, Vote
from console.policy.lifecycle import ActionState
from console.policy.roles import Permission, can


class VoteRefused(PermissionError):
    """A vote that may not be cast; the message says why, for display."""


@dataclass(frozen=True)
class Tally:
    approvers: tuple[str, ...]
    rejecters: tuple[str, ...]
    ignored: tuple[str, ...]


def _who(name: str | None) -> str:
    # Identity compares case-insensitively so "Alice" cannot approve what "alice" proposed.
    return (name or "").strip().casefold()


def _problem(request: ActionRequest, vote: Vote, seen: set[str]) -> str | None:
    if vote.action_id != request.id:
        return (
            f"vote by {vote.voter} is for action {vote.action_id}, not {request.id}; "
            "a vote counts only for the action it was cast on"
        )
    if vote.generation != request.generation:
        return (
            f"vote by {vote.voter} was cast on generation {vote.generation}, "
            f"the action is for generation {request.generation}"
        )
    needed = Permission.APPROVE if vote.approve else Permission.REJECT
    if not can(vote.role, needed):
        verb = "approving" if vote.approve else "rejecting"
        return f"{vote.voter} is a {vote.role}; {verb} needs the approver role"
    if not _who(vote.voter):
        return "a vote needs a voter"
    # A proposer may reject (withdraw) but never approve their own action.
    if vote.approve and _who(vote.voter) == _who(request.proposed_by):
        return f"{vote.voter} proposed action {request.id} and may not approve it"
    if _who(vote.voter) in seen:
        return f"{vote.voter} already voted on action {request.id}; one vote per approver"
    if vote.cast_at >= request.expires_at:
        return (
            f"vote by {vote.voter} came after action {request.id} expired at "
            f"{request.expires_at:%Y-%m-%d %H:%M UTC}"
        )
    return None


def check_vote(
    request: ActionRequest, vote: Vote, existing: Iterable[Vote], *, now: datetime
) -> None:
    """Raise `VoteRefused` unless `vote` may be cast on `request` now."""
    if request.state != ActionState.PROPOSED:
        raise VoteRefused(f"action {request.id} is {request.state}, not proposed; voting is closed")
    if now >= request.expires_at:
        raise VoteRefused(
            f"action {request.id} expired at {request.expires_at:%Y-%m-%d %H:%M UTC}; "
            "propose it again"
        )
    if vote.cast_at > now:
        raise VoteRefused(f"vote by {vote.voter} is dated in the future")
    seen = {_who(v.voter) for v in existing if v.action_id == request.id}
    problem = _problem(request, vote, seen)
    if problem:
        raise VoteRefused(problem)


def tally(request: ActionRequest, votes: Iterable[Vote]) -> Tally:
    """Count the valid votes on `request`, oldest first; invalid ones are listed, not counted."""
    approvers: list[str] = []
    rejecters: list[str] = []
    ignored: list[str] = []
    seen: set[str] = set()
    for vote in sorted(votes, key=lambda v: v.cast_at):
        problem = _problem(request, vote, seen)
        if problem:
            ignored.append(f"ignored vote: {problem}")
            continue
        seen.add(_who(vote.voter))
        (approvers if vote.approve else rejecters).append(vote.voter)
    return Tally(tuple(approvers), tuple(rejecters), tuple(ignored))
