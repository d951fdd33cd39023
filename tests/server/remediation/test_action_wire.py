"""What the service sends a node is what the node will run: a deadline inside the signature,
and no reason or parameter the node's executor would refuse after the approvals."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents import actions_contract as contract
from agents.executor import Executor, Refused
from console import actions
from console.actions.errors import RemediationError
from console.actions.remediation import _check_reason
from console.models import Action
from ingest.agent_actions import actions_for_node
from ingest.auth import authenticate

pytestmark = pytest.mark.django_db

HOOK = f'{sys.executable} -c "print(1)"'


def _approved(propose: Any, vote: Any, target: str = "node:n-02") -> Action:
    action = propose(target).action
    return vote(action.pk, "approver").action


def test_it_signs_the_deadline_and_the_node_refuses_the_action_after_it(
    pool: Any, propose: Any, vote: Any, now: Any, agent_token: Any, tmp_path: Path,
    settings: Any,
) -> None:  # fmt: skip
    settings.FAULTLINE_ACTION_DEADLINE_S = 600
    action = _approved(propose, vote)
    token = agent_token("n-02")
    (signed,) = actions_for_node(authenticate(f"Bearer {token}"))
    dispatched_at = Action.objects.get(pk=action.pk).dispatched_at
    assert signed["deadline"] == contract.deadline_text(dispatched_at + timedelta(seconds=600))
    # Redelivered unchanged until the agent reports (one signature per action).
    assert actions_for_node(authenticate(f"Bearer {token}")) == [signed]

    def node(name: str, at: timedelta) -> Executor:
        (tmp_path / name).mkdir()
        return Executor(tmp_path / name, node="n-02", hooks={"cordon_node": HOOK}, token=token,
                        clock=lambda: dispatched_at + at)  # fmt: skip

    assert node("early", timedelta(seconds=599))._run(signed)["status"] == "succeeded"
    late = node("late", timedelta(seconds=600)).handle(signed)
    assert late is not None and late["status"] == "failed" and "has passed" in late["output"]
    # The refusal reaches the service as the action's result.
    done = actions.record_action_result(action_id=action.pk, node=pool[2], status="failed",
                                        exit_code=None, output=late["output"], now=now)  # fmt: skip
    assert done.state == "failed" and "deadline" in done.result["output"]
    assert pool[2].cordoned is False


@pytest.mark.parametrize(
    "reason",
    ["drain it\nnow", "a\r\nb", "tab\there", "line\u2028separator", "next\x85line",
     "-- drain it", "bell\x07"],
)  # fmt: skip
def test_it_refuses_at_proposal_a_reason_the_node_would_refuse(
    client: Any, cast: Any, pool: Any, reason: str
) -> None:
    client.force_login(cast["operator"])
    response = client.post("/api/v1/actions/", {"kind": "cordon_node", "target": "node:n-03",
                           "reason": reason}, content_type="application/json")  # fmt: skip
    assert response.status_code == 400, response.content
    assert response.json()["error"].startswith("reason ")
    assert not Action.objects.exists()


def test_it_accepts_a_reason_in_any_script_on_one_line(client: Any, cast: Any, pool: Any) -> None:
    client.force_login(cast["operator"])
    reason = "Xid 79 on GPU 3 — GPU が落ちた; ticket #42 (ok)"
    response = client.post("/api/v1/actions/", {"kind": "cordon_node", "target": "node:n-03",
                           "reason": reason}, content_type="application/json")  # fmt: skip
    assert response.status_code == 201
    assert Action.objects.get().reason == reason


def test_a_rules_reason_is_sent_on_one_line_not_refused(pool: Any, now: Any) -> None:
    outcome = actions.propose_action(
        kind="cordon_node", target="node:n-03", reason="- Xid 79\nsummary line two\tend",
        actor=None, rule="xid-cordon", now=now,
    )  # fmt: skip
    assert outcome.action.reason == "Xid 79 summary line two end"


@pytest.mark.parametrize("timeout", ["5m", 1.5, 0, 86_401, True, "\uff13\uff10\uff10"])
def test_it_refuses_at_proposal_a_drain_timeout_the_node_would_refuse(
    propose: Any, pool: Any, timeout: Any
) -> None:
    with pytest.raises(RemediationError, match="drain_timeout_s must be whole seconds"):
        propose("node:n-03", kind="drain_node", params={"drain_timeout_s": timeout})
    assert not Action.objects.exists()


def test_it_accepts_a_whole_second_drain_timeout(propose: Any, pool: Any) -> None:
    action = propose("node:n-03", kind="drain_node", params={"drain_timeout_s": 600}).action
    assert action.params["drain_timeout_s"] == 600


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reason=st.text(min_size=3, max_size=300))
def test_the_service_refuses_exactly_the_reasons_the_node_would(
    tmp_path: Path, reason: str
) -> None:
    """Whatever a person types: accepted at proposal <=> the executor takes it as sent."""
    text = reason.strip()
    try:
        _check_reason(text)
        service_ok = True
    except RemediationError:
        service_ok = False
    executor = Executor(tmp_path, node="n-02", hooks={"cordon_node": HOOK}, allow_unsigned=True)
    sent = {"id": 1, "kind": "cordon_node", "target": "node:n-02", "group": None,
            "generation": None, "params": {"reason": text[: contract.REASON_CHARS],
                                           "dry_run": False}}  # fmt: skip
    try:
        executor.check(sent)
        node_ok = True
    except Refused:
        node_ok = False
    assert service_ok == node_ok, (text, service_ok, node_ok)
