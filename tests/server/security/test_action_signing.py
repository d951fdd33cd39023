"""Actions are signed per agent on the service and verified by the node."""

from __future__ import annotations

import sys

import pytest

from agents import signing
from agents.executor import Executor
from ingest.auth import authenticate, sign_action

pytestmark = pytest.mark.django_db


def _payload(action_id: int = 7) -> dict:
    """The shape console.remediation.agent_payload hands an agent."""
    return {
        "id": action_id,
        "kind": "cordon_node",
        "target": "node:n-02",
        "group": None,
        "generation": None,
        "params": {"reason": "xid 79", "dry_run": False},
    }


def test_it_signs_an_action_that_only_the_tokens_agent_accepts(agent_token, tmp_path):
    token = agent_token("n-02")
    credential = authenticate(f"Bearer {token}")
    signed = sign_action(_payload(), credential=credential)
    assert signed["node"] == "n-02"
    assert signing.verify(signed, signing.key_from_token(token))
    assert not signing.verify(signed, signing.key_from_token(agent_token("n-03")))
    hook = f'{sys.executable} -c "print(1)"'
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    mine = Executor(tmp_path / "a", node="n-02", hooks={"cordon_node": hook}, token=token)
    assert mine.handle(signed)["status"] == "succeeded"
    # The same signed action replayed to another node's agent is dropped there.
    other = Executor(
        tmp_path / "b", node="n-03", hooks={"cordon_node": hook}, token=agent_token("n-03")
    )
    assert other.handle({**signed, "target": "node:n-03", "node": "n-03"})["output"] == (
        "dropped: bad signature"
    )
