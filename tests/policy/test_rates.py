from __future__ import annotations

from datetime import timedelta

from console.policy.gates import evaluate_proposal
from console.policy.inputs import BreakerState, Policy, RecentActions
from console.policy.lifecycle import ActionKind
from tests.policy.factories import NOW, automatic, fleet, history, records

AUTO = Policy.from_dict(
    {"auto_approve": {"cordon_node": ["xid"], "quarantine_node": ["xid"], "drain_node": ["xid"]}}
)


def propose(req, past: RecentActions, policy: Policy = AUTO):
    return evaluate_proposal(
        req, policy=policy, fleet=fleet(), history=past, breaker=BreakerState(), now=NOW
    )


def test_it_holds_automation_past_the_per_kind_rate_limit() -> None:
    decision = propose(automatic(), history(records(5)))
    assert decision.needs_human
    assert (
        "held by rate limit: 5 cordon_node actions in the last 10 min (limit 5)" in decision.reasons
    )


def test_it_allows_automation_under_the_per_kind_rate_limit() -> None:
    assert propose(automatic(), history(records(4))).allowed


def test_it_reads_a_per_kind_override() -> None:
    policy = Policy.from_dict(
        {"max_per_kind_overrides": {"cordon_node": 1}, "auto_approve": {"cordon_node": ["xid"]}}
    )
    assert not propose(automatic(), history(records(1)), policy).allowed


def test_it_forgets_actions_older_than_the_window() -> None:
    old = records(5, ago=timedelta(minutes=11))
    assert propose(automatic(), history(old)).allowed


def test_it_holds_automation_past_the_per_target_rate_limit() -> None:
    past = history(records(2, kind=ActionKind.QUARANTINE_NODE, node_name="a100-00"))
    decision = propose(automatic(), past)
    assert any("2 actions on node:a100-00 in the last 10 min" in r for r in decision.reasons)
    assert not decision.allowed


def test_it_requires_a_human_after_repeated_remediation_of_one_node() -> None:
    # Spread over hours, so no rate limit applies: only the repeat rule can hold it.
    past = history(
        records(1, node_name="a100-00", ago=timedelta(hours=3)),
        records(1, kind=ActionKind.DRAIN_NODE, node_name="a100-00", ago=timedelta(hours=9)),
    )
    decision = propose(automatic(), past)
    assert not decision.allowed
    assert decision.needs_human and decision.escalate
    assert any(
        "node a100-00 was remediated 2 times in the last 24 h (limit 2)" in r
        for r in decision.reasons
    )


def test_it_counts_gpu_isolations_as_remediating_their_node() -> None:
    policy = Policy.from_dict({"auto_approve": {"isolate_gpu": ["xid"]}})
    past = history(records(2, node_name="a100-01", ago=timedelta(hours=2)))
    req = automatic(kind=ActionKind.ISOLATE_GPU, node=None, gpu="a100-01/gpu3", target="gpu:g3")
    assert not propose(req, past, policy).allowed
