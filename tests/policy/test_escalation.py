from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from console.policy.escalation import (
    EscalationError,
    EscalationPolicy,
    EscalationStep,
    due_steps,
    select_policy,
    snapshot_policy,
)
from tests.policy.factories import NOW

CHAIN = EscalationPolicy(
    name="training-critical",
    severities=frozenset({"critical"}),
    labels={"group": "llama-*"},
    steps=(
        EscalationStep(delay_s=0, channels=("slack",), repeat=2, repeat_interval_s=300),
        EscalationStep(delay_s=900, channels=("pagerduty",)),
    ),
)
SNAP = snapshot_policy(CHAIN)


def keys(due):
    return [d.key for d in due]


def test_it_selects_the_first_policy_matching_severity_and_group() -> None:
    fallback = EscalationPolicy(name="any", steps=CHAIN.steps)
    policies = [CHAIN, fallback]
    assert select_policy(policies, "critical", {"group": "llama-70b"}) is CHAIN
    assert select_policy(policies, "warning", {"group": "llama-70b"}) is fallback
    assert select_policy([CHAIN], "critical", {"group": "mistral"}) is None


def test_it_snapshots_to_plain_json() -> None:
    assert json.loads(json.dumps(SNAP)) == SNAP
    assert SNAP["steps"][1] == {
        "delay_s": 900,
        "channels": ["pagerduty"],
        "repeat": 0,
        "repeat_interval_s": 0,
    }


def test_it_keeps_using_the_snapshot_after_the_policy_is_edited() -> None:
    snap = snapshot_policy(CHAIN)
    edited = replace(CHAIN, steps=(EscalationStep(delay_s=5, channels=("email",)),))
    assert edited.steps != CHAIN.steps
    assert due_steps(snap, NOW, None, NOW, [])[0].channels == ("slack",)


def test_it_sends_the_first_step_when_the_incident_opens() -> None:
    due = due_steps(SNAP, NOW, None, NOW, [])
    assert keys(due) == ["step:0:0"]
    assert due[0].kind == "trigger"


def test_it_renotifies_while_nobody_acknowledges() -> None:
    due = due_steps(SNAP, NOW, None, NOW + timedelta(minutes=5), ["step:0:0"])
    assert keys(due) == ["step:0:1"]


def test_it_escalates_to_the_next_step_if_not_acknowledged() -> None:
    sent = ["step:0:0", "step:0:1", "step:0:2"]
    due = due_steps(SNAP, NOW, None, NOW + timedelta(minutes=15), sent)
    assert keys(due) == ["step:1:0"]
    assert due[0].channels == ("pagerduty",)


def test_it_sends_only_the_newest_overdue_repeat_after_a_late_run() -> None:
    due = due_steps(SNAP, NOW, None, NOW + timedelta(minutes=11), ["step:0:0"])
    assert keys(due) == ["step:0:2"]
    assert due[0].covers == ("step:0:1", "step:0:2")


def test_it_sends_no_page_after_acknowledge() -> None:
    acked = NOW + timedelta(minutes=2)
    due = due_steps(SNAP, NOW, acked, NOW + timedelta(hours=2), ["step:0:0", "acknowledge"])
    assert due == []


def test_it_tells_paged_channels_about_the_acknowledge_once() -> None:
    acked = NOW + timedelta(minutes=2)
    due = due_steps(SNAP, NOW, acked, NOW + timedelta(minutes=3), ["step:0:0"])
    assert keys(due) == ["acknowledge"]
    assert due[0].channels == ("slack",)


def test_it_always_sends_the_resolve_of_an_incident_that_paged() -> None:
    sent = ["step:0:0", "step:1:0", "acknowledge"]
    resolved = NOW + timedelta(hours=1)
    due = due_steps(SNAP, NOW, NOW + timedelta(minutes=20), resolved, sent, resolved_at=resolved)
    assert keys(due) == ["resolve"]
    assert due[0].channels == ("slack", "pagerduty")


def test_it_sends_no_resolve_for_an_incident_that_never_paged() -> None:
    later = NOW + timedelta(minutes=1)
    assert due_steps(SNAP, NOW, None, later, [], resolved_at=later) == []


def test_it_sends_the_resolve_only_once() -> None:
    later = NOW + timedelta(minutes=1)
    assert due_steps(SNAP, NOW, None, later, ["step:0:0", "resolve"], resolved_at=later) == []


def test_it_refuses_a_snapshot_of_another_version() -> None:
    with pytest.raises(EscalationError, match="version 99"):
        due_steps({**SNAP, "version": 99}, NOW, None, NOW, [])


def test_it_refuses_a_repeat_faster_than_a_minute() -> None:
    storm = replace(CHAIN, steps=(EscalationStep(0, ("slack",), repeat=5, repeat_interval_s=10),))
    with pytest.raises(EscalationError, match="repeat_interval_s must be at least 60"):
        snapshot_policy(storm)
