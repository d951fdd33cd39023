from __future__ import annotations

from datetime import timedelta

import pytest

from console.policy.dryrun import dry_run
from console.policy.inputs import BreakerState, Policy, RecentActions
from tests.policy.factories import NOW, automatic, fleet, history, node, records

AUTO = Policy.from_dict({"auto_approve": {"cordon_node": ["xid"]}})


def run(req, state=None, past=None, breaker=None, stage="proposal"):
    return dry_run(
        req,
        stage=stage,
        policy=AUTO,
        fleet=state or fleet(),
        history=past or RecentActions(),
        breaker=breaker or BreakerState(),
        now=NOW,
    )


def test_it_describes_an_auto_approval_and_the_capacity_left() -> None:
    state = fleet({"a100": 16, "h100": 48}, cordoned=[node("a100", 5)])
    result = run(automatic(), state)
    assert "would auto-approve cordon_node on node:a100-00" in result.effects
    assert "pool a100 would have 2 of 16 nodes out (limit 4)" in result.effects


def test_it_describes_a_hold_and_an_escalation() -> None:
    state = fleet({"a100": 16, "h100": 48}, cordoned=[node("a100", i) for i in range(1, 5)])
    result = run(automatic(), state)
    assert "would hold cordon_node on node:a100-00 for 2 human approval(s)" in result.effects
    assert "would escalate to a human" in result.effects


def test_it_reports_the_breaker_it_would_open_without_opening_it() -> None:
    breaker = BreakerState()
    result = run(automatic(), past=history(records(10, ago=timedelta(minutes=1))), breaker=breaker)
    assert any(e.startswith("would open the circuit breaker") for e in result.effects)
    assert not breaker.open


def test_it_refuses_an_unknown_stage() -> None:
    with pytest.raises(ValueError, match="stage must be one of"):
        run(automatic(), stage="execute")
