from __future__ import annotations

from console.policy.gates import evaluate_proposal
from console.policy.inputs import BreakerState, Policy, RecentActions
from console.policy.lifecycle import ActionKind
from tests.policy.factories import NOW, automatic, fleet

AUTO_RESTART = Policy.from_dict({"auto_approve": {"restart_group": ["*"]}})


def propose(**changes):
    req = automatic(
        kind=ActionKind.RESTART_GROUP,
        target="group:llama",
        node=None,
        group="llama",
        generation=7,
        **changes,
    )
    return evaluate_proposal(
        req,
        policy=AUTO_RESTART,
        fleet=fleet(),
        history=RecentActions(),
        breaker=BreakerState(),
        now=NOW,
    )


def test_it_requires_a_human_when_diagnosis_says_restart_is_unsafe() -> None:
    decision = propose(
        auto_restart_safe=False, restart_advice="collective mismatch unresolved on rank 3"
    )
    assert not decision.allowed
    assert decision.needs_human
    assert (
        "restart needs a human: diagnosis says auto-restart is unsafe: "
        "collective mismatch unresolved on rank 3"
    ) in decision.reasons


def test_it_requires_a_human_when_diagnosis_gave_no_advice() -> None:
    decision = propose(auto_restart_safe=None)
    assert decision.needs_human
    assert "restart needs a human: diagnosis gave no restart advice" in decision.reasons


def test_it_auto_approves_a_safe_restart_when_policy_allows() -> None:
    decision = propose(auto_restart_safe=True)
    assert decision.allowed and decision.approvals_required == 0


def test_it_keeps_auto_approval_off_without_a_policy() -> None:
    req = automatic(kind=ActionKind.RESTART_GROUP, node=None, auto_restart_safe=True)
    decision = evaluate_proposal(
        req,
        policy=Policy(),
        fleet=fleet(),
        history=RecentActions(),
        breaker=BreakerState(),
        now=NOW,
    )
    assert decision.needs_human
    assert "auto-approval is off for restart_group; an approver decides" in decision.reasons
