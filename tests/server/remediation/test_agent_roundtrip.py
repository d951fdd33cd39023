"""The real node executor (agents/executor.py) against a live service: poll, run, report."""

from __future__ import annotations

import sys

import pytest

from agents.executor import Executor
from console.models import Action, Node

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_runs_an_approved_cordon_through_the_real_executor(
    live_server, pool, propose, vote, agent_token, tmp_path
):
    action = propose("node:n-02").action
    vote(action.pk, "approver")
    hook = f"{sys.executable} -c \"print('cordoned')\""
    executor = Executor(
        tmp_path,
        node="n-02",
        hooks={"cordon_node": hook},
        server=live_server.url,
        token=agent_token("n-02"),
    )
    executor.start(poll_s=0)
    try:
        assert executor.poll_once() == 1
    finally:
        executor.stop()
    done = Action.objects.get(pk=action.pk)
    assert (done.state, done.result["exit_code"], done.result["output"]) == (
        "succeeded",
        0,
        "cordoned\n",
    )
    assert Node.objects.get(name="n-02").cordoned is True
    assert executor.done[str(action.pk)]["reported"] is True
