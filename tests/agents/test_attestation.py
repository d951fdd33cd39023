"""The node's agent attests the scheduler jobs running on it (docs/security.md, "Who owns
a group"), and its Slurm backend acts only on a job of its own node.

Scheduler commands are the stateful fakes of tests/agents/fake_schedulers.py; the real
Slurm runs in tests/system/test_slurm.py.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agents import actions_contract as contract
from agents.agent import Agent, Config
from agents.reporter import Reporter
from agents.schedulers import Attestation, Runner, execute, kubernetes, slurm
from tests.agents.fake_schedulers import FakeSchedulers

from .conftest import StubIngest

NODE = "gpu-node-017"


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSchedulers:
    fake = FakeSchedulers(tmp_path / "sched")
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    return fake


def _jobs(**jobs: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodes": {},
        "jobs": {j: {"state": "RUNNING", "restarts": 0, **v} for j, v in jobs.items()},
    }


def test_slurm_lists_the_jobs_allocated_on_its_node_only(fakes: FakeSchedulers) -> None:
    fakes.set_state(_jobs(
        **{"77": {"nodes": [NODE, "gpu-node-018"]}, "78": {"nodes": ["gpu-node-018"]},
           "79": {"nodes": [NODE], "state": "PENDING"}, "80": {"nodes": [NODE]}}
    ))  # fmt: skip
    assert slurm.Slurm().jobs_on(Runner(), NODE) == ["77", "80"]
    assert slurm.Slurm().jobs_on(Runner(), "gpu-node-099") == []


def test_slurm_says_nothing_when_squeue_fails(fakes: FakeSchedulers) -> None:
    (fakes.bin / "squeue").write_text("#!/bin/sh\necho 'slurm_load_jobs error' >&2\nexit 1\n")
    assert slurm.Slurm().jobs_on(Runner(), NODE) is None


POD_LIST = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        {"metadata": {"name": "llama-worker-0", "labels": {
            "training.kubeflow.org/job-name": "llama", "training.kubeflow.org/replica": "0"}}},
        {"metadata": {"name": "eval-x7k2p", "labels": {
            "batch.kubernetes.io/job-name": "eval", "job-name": "eval"}}},
        {"metadata": {"name": "ds-agent-abcde", "labels": {"app": "faultline-agent"}}},
        {"metadata": {"name": "js-0-0", "labels": {"jobset.sigs.k8s.io/jobset-name": "js"}}},
    ],
}  # fmt: skip


def test_kubernetes_lists_the_jobs_of_the_pods_on_its_node() -> None:
    assert kubernetes.parse_pod_jobs(json.dumps(POD_LIST)) == ["eval", "js", "llama"]
    assert kubernetes.parse_pod_jobs(json.dumps({"kind": "Node"})) is None
    assert kubernetes.parse_pod_jobs("error: the server doesn't have a resource type") is None

    class Recorded:
        def __call__(self, *argv: str, timeout_s: float | None = None) -> Any:
            self.argv = list(argv)
            return type("Ran", (), {"ok": True, "out": json.dumps(POD_LIST)})()

    run = Recorded()
    assert kubernetes.Kubernetes().jobs_on(run, NODE) == ["eval", "js", "llama"]  # type: ignore[arg-type]  # a recorded kubectl stands in for Runner
    assert f"spec.nodeName={NODE},status.phase=Running" in run.argv


class _Scheduler:
    """A backend whose answers the test scripts: a list, or None (could not say)."""

    name = "fake"

    def __init__(self, *answers: list[str] | None) -> None:
        self.answers = list(answers)
        self.reads = 0

    def jobs_on(self, run: Runner, node: str) -> list[str] | None:
        self.reads += 1
        return self.answers.pop(0) if self.answers else None


def test_an_attestation_keeps_the_last_good_read_when_the_scheduler_does_not_answer() -> None:
    attest = Attestation(_Scheduler(["77"], None), NODE)  # type: ignore[arg-type]  # the scripted backend stands in for Backend
    assert attest.jobs is None  # not read yet: nothing attested
    assert attest.refresh() == ["77"]
    assert attest.refresh() == ["77"]  # squeue failed: the node is not cut off its job


def test_an_attestation_reads_again_for_a_job_it_does_not_show_bounded() -> None:
    now = [100.0]
    backend = _Scheduler(["77"], ["77"], ["77"], ["77", "88"])
    attest = Attestation(backend, NODE, every_s=30, min_gap_s=0.5, clock=lambda: now[0])  # type: ignore[arg-type]  # the scripted backend stands in for Backend
    attest.refresh()
    assert attest.wants("77") is False and backend.reads == 1  # known: no read
    assert attest.wants("88") is False and backend.reads == 2  # read: not running here yet
    now[0] += 1
    assert attest.wants("88") is False and backend.reads == 2  # asked about it just now
    assert attest.wants("bogus") is False and backend.reads == 3  # another job: read once
    now[0] += 0.1
    assert attest.wants("bogus-2") is False and backend.reads == 3  # within the gap
    now[0] += 30
    assert attest.wants("88") is True and attest.jobs == ["77", "88"]


def test_the_agent_attests_a_job_before_the_first_record_that_names_it(
    short_dir: Path, stub: StubIngest, fakes: FakeSchedulers
) -> None:
    """A job that started after the last read: the heartbeat that attests it must reach
    the service before the job's first record, which the service would otherwise refuse."""
    fakes.set_state(_jobs(**{"77": {"nodes": ["node-1"]}}))
    cfg = Config(server=stub.url, token="t", node="node-1", state_dir=short_dir / "s",
                 interval=0.2, action_poll_s=0, scheduler="slurm", host_evidence=False)  # fmt: skip
    agent = Agent(cfg)
    thread = threading.Thread(target=agent.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
            r["kind"] == "heartbeat" for r in stub.records()
        ):
            time.sleep(0.05)
        fakes.set_state(_jobs(**{"77": {"nodes": ["node-1"]}, "88": {"nodes": ["node-1"]}}))
        rep = Reporter(socket_path=str(short_dir / "s" / "reporter.sock"), group="88", rank=0)
        rep.transition("running", job="88", world_size=1)
        while time.monotonic() < deadline and not any(
            r["kind"] == "transition" for r in stub.records()
        ):
            time.sleep(0.05)
    finally:
        agent.stop_event.set()
        thread.join(timeout=15)
    records = stub.records()
    beats = [r for r in records if r["kind"] == "heartbeat"]
    assert beats and all("jobs" in b for b in beats)
    assert beats[0]["jobs"] == ["77"]  # read before the first heartbeat
    announced = next(i for i, r in enumerate(records) if r["kind"] == "transition")
    before = [r for r in records[:announced] if r["kind"] == "heartbeat"]
    assert "88" in before[-1]["jobs"]
    assert stub.invalid == []


def test_an_agent_without_a_scheduler_attests_nothing(short_dir: Path, stub: StubIngest) -> None:
    cfg = Config(server=stub.url, token="t", node="node-1", state_dir=short_dir / "s",
                 interval=0.2, action_poll_s=0, host_evidence=False)  # fmt: skip
    agent = Agent(cfg)
    assert agent.attestation is None
    assert "jobs" not in agent._heartbeat()


# -- Medium 5: the Slurm backend acts only on a job of its own node -----------------------
@pytest.mark.parametrize(
    ("nodes", "state", "applied"),
    [
        ([NODE], "RUNNING", True),
        (["gpu-node-018"], "RUNNING", False),  # another user's job elsewhere
        (["gpu-node-018", NODE], "RUNNING", True),  # its allocation spans this node
        ([], "SUSPENDED", False),  # allocated nowhere
    ],
)
def test_slurm_requeues_only_a_job_that_runs_on_its_node(
    fakes: FakeSchedulers, nodes: list[str], state: str, applied: bool
) -> None:
    fakes.set_state(_jobs(**{"4242": {"nodes": nodes, "state": state}}))
    action = {"id": 9, "kind": contract.RESTART_GROUP, "params": {"job": "4242"}}
    result = execute(slurm.Slurm(), action, node=NODE, timeout_s=10)
    requeued = ["scontrol", "requeue", "4242"] in fakes.calls()
    assert requeued is applied
    if applied:
        assert result["outcome"]["state"] == "applied"
    else:
        assert (result["status"], result["outcome"]["state"]) == ("failed", "refused")
        assert f"does not run on node {NODE}" in result["output"]
        assert fakes.state()["jobs"]["4242"]["restarts"] == 0


def test_slurm_leaves_a_pending_job_alone_wherever_it_would_run(fakes: FakeSchedulers) -> None:
    fakes.set_state(_jobs(**{"4242": {"nodes": [], "state": "PENDING"}}))
    action = {"id": 9, "kind": contract.RESTART_GROUP, "params": {"job": "4242"}}
    result = execute(slurm.Slurm(), action, node=NODE, timeout_s=10)
    assert result["outcome"]["state"] == "already"
    assert ["scontrol", "requeue", "4242"] not in fakes.calls()


def test_a_dry_run_of_a_restart_shows_the_node_check() -> None:
    action = {"id": 9, "kind": contract.RESTART_GROUP, "params": {"job": "4242"}}
    plan = slurm.Slurm().plan(action, node=NODE)
    assert plan == [["squeue", "-h", "-j", "4242", "-w", NODE, "-o", "%A"],
                    ["scontrol", "requeue", "4242"]]  # fmt: skip
