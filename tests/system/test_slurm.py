"""The Slurm backend and the executor against a real slurmctld + slurmd (tests/system/slurm.py).

Skips, saying why, only where Debian's slurm-wlm and munge are not installed (.ci/run
installs them). Every wait is bounded; the cluster is torn down after the module.
"""

from __future__ import annotations

import getpass
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agents import actions_contract as contract
from agents import signing
from agents.executor import Executor
from agents.schedulers import Runner, execute
from agents.schedulers.slurm import Slurm as SlurmBackend
from tests.system.slurm import Slurm, slurm_available, slurm_cluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(bool(slurm_available()), reason=slurm_available() or "slurm present"),
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Slurm]:
    yield from slurm_cluster()


@pytest.fixture
def slurm(cluster: Slurm) -> Iterator[Slurm]:
    yield cluster
    # Leave the node idle and the queue empty for the next test: every job, the pending ones
    # too (a requeued job waits out its BeginTime, then runs again and holds the node).
    cluster.run("scancel", "--quiet", "--full", f"--user={getpass.getuser()}")
    cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume")
    # Read from slurmctld's node table: sinfo kept showing a node `mixed` that scontrol
    # showed IDLE with nothing allocated, for a minute, after a requeued job was cancelled.
    until(lambda: _node_idle(cluster), 60, "node idle again", every=0.5)


def _node_idle(cluster: Slurm) -> bool:
    shown = cluster.run("scontrol", "show", "node", cluster.node, "-o").stdout
    return " State=IDLE " in f" {shown} " and " CPUAlloc=0 " in f" {shown} "


def until(check: Callable[[], bool], timeout: float, what: str, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def run_action(slurm: Slurm, action: dict[str, Any]) -> contract.Result:
    return execute(SlurmBackend(), action, node=slurm.node, timeout_s=20, env=slurm.env)


def reason_of(slurm: Slurm) -> str:
    return slurm.run("sinfo", "-h", "-n", slurm.node, "-o", "%E").stdout.strip()


def test_it_drains_the_node_with_faultlines_reason_and_resumes_it(slurm: Slurm) -> None:
    drain = {"id": 41, "kind": "drain_node", "params": {"reason": "xid 79 on GPU 3"}}
    result = run_action(slurm, drain)
    assert result["outcome"]["state"] == "applied", result["output"]
    assert result["status"] == "succeeded"
    assert slurm.node_state() in ("drained", "drain")
    assert reason_of(slurm) == "faultline: 41 xid 79 on GPU 3"
    assert result["outcome"]["before"]["state"] == "idle"
    assert result["outcome"]["after"]["state"] in ("drained", "drain")

    again = run_action(slurm, {**drain, "id": 42})
    assert again["outcome"]["state"] == "already"
    assert reason_of(slurm) == "faultline: 41 xid 79 on GPU 3"  # the first reason stays

    resumed = run_action(slurm, {"id": 43, "kind": "uncordon_node", "params": {}})
    assert resumed["outcome"]["state"] == "applied", resumed["output"]
    until(lambda: slurm.node_state() == "idle", 20, "sinfo idle after resume")


def test_it_leaves_a_node_drained_by_someone_else_and_will_not_resume_it(slurm: Slurm) -> None:
    theirs = "maintenance: bad DIMM, ticket 1234"
    slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=drain", f"reason={theirs}")
    result = run_action(slurm, {"id": 51, "kind": "quarantine_node", "params": {"reason": "x"}})
    assert result["outcome"]["state"] == "held_by_other", result["output"]
    assert result["outcome"]["taken_out_by"] == "other"
    assert result["outcome"]["before"]["reason"] == theirs
    assert reason_of(slurm) == theirs

    back = run_action(slurm, {"id": 52, "kind": "uncordon_node", "params": {}})
    assert (back["status"], back["outcome"]["state"]) == ("failed", "refused")
    assert slurm.node_state() in ("drained", "drain")
    assert reason_of(slurm) == theirs


def test_it_requeues_a_real_job_and_reads_its_state_back(slurm: Slurm, tmp_path: Path) -> None:
    submitted = slurm.run(
        "sbatch", "--parsable", f"--chdir={tmp_path}", "--output=/dev/null", "--wrap", "sleep 60"
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]

    def job_state() -> str:
        return slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()

    until(lambda: job_state() == "RUNNING", 30, f"job {job} running")
    result = run_action(slurm, {"id": 61, "kind": "restart_group", "params": {"job": job}})
    assert result["outcome"]["state"] == "applied", result["output"]
    assert result["outcome"]["before"]["state"] == "RUNNING"
    assert int(result["outcome"]["after"]["restarts"]) == 1
    shown = slurm.run("scontrol", "show", "job", job, "-o").stdout
    assert "Restarts=1" in shown
    assert job_state() in ("PENDING", "REQUEUED", "CONFIGURING", "RUNNING")


def test_it_requeues_only_a_job_of_its_own_node_and_attests_the_jobs_it_runs(
    slurm: Slurm, tmp_path: Path
) -> None:
    """A group's job id comes from the service: the backend checks the job runs on its node
    before it acts (a node hosting no rank once set another user's job id), and reads the
    node's jobs for the agent to attest (docs/security.md, "Who owns a group")."""
    submitted = slurm.run(
        "sbatch", "--parsable", f"--chdir={tmp_path}", "--output=/dev/null", "--wrap", "sleep 60"
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    until(
        lambda: slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING",
        30,
        f"job {job} running",
    )
    backend = SlurmBackend()
    assert job in (backend.jobs_on(Runner(env=slurm.env), slurm.node) or [])
    action = {"id": 71, "kind": "restart_group", "params": {"job": job}}
    elsewhere = execute(backend, action, node="gpu-node-elsewhere", timeout_s=20, env=slurm.env)
    assert (elsewhere["status"], elsewhere["outcome"]["state"]) == ("failed", "refused")
    assert "Restarts=0" in slurm.run("scontrol", "show", "job", job, "-o").stdout
    assert ["scontrol", "requeue", job] not in elsewhere["outcome"]["commands"]
    here = run_action(slurm, {**action, "id": 72})
    assert here["outcome"]["state"] == "applied", here["output"]


class _Results(BaseHTTPRequestHandler):
    bodies: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append((self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_it_runs_an_action_end_to_end_from_the_executor_into_slurm(
    slurm: Slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    monkeypatch.setenv("PATH", slurm.env["PATH"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Results)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        executor = Executor(
            tmp_path,
            node=slurm.node,
            hooks={},
            scheduler="slurm",
            server=f"http://127.0.0.1:{server.server_port}",
            token="t",
            timeout_s=20,
        )
        # The payload shape console.remediation.agent_payload dispatches.
        action = {
            "id": 71,
            "kind": "drain_node",
            "target": f"node:{slurm.node}",
            "group": "llama-70b",
            "generation": 2,
            "params": {"reason": "Xid 79: GPU fell off the bus", "dry_run": False},
        }
        key = signing.key_from_token("t")  # the service signs with the token's hash
        action = signing.sign(action, key)
        result = executor.handle(action)
        assert result is not None and result["status"] == "succeeded", result
        assert reason_of(slurm) == "faultline: 71 Xid 79: GPU fell off the bus"
        assert executor.handle(action) is None  # at most once
        path, body = _Results.bodies[-1]
        assert path == "/api/v1/actions/71/result"
        assert body["status"] == "succeeded"
        assert body["outcome"]["state"] == "applied"
        assert body["outcome"]["after"]["state"] in ("drained", "drain")
        stale = executor.handle(signing.sign({**action, "id": 72, "generation": 1}, key))
        assert stale is not None and "refused: generation 1" in stale["output"]
    finally:
        server.shutdown()
        server.server_close()
