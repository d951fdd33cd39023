"""The remediation loop against real parts: service, agent, Slurm.

A real `faultline up`, a real agent process configured with the shipped deploy/agent.toml
(only server, token, node and paths overridden: `scheduler = "slurm"` as shipped) and a
real one-node slurmctld + slurmd (tests/system/slurm.py). A hardware Xid goes in through
ingest; the remediation policy proposes draining the node; two approvers approve over
REST (the one-node pool is above the blast-radius limit, so the gates want two); the
agent's Slurm backend drains the node; `sinfo` shows it drained with Faultline's reason;
the job is requeued. Then the return half: the agent restarts with a new boot id (the
repair: a reboot as the service sees it), the service's validation window (3 s here)
passes with no fault, the sweep proposes `uncordon_node` (rule `fleet_health`), one
approver approves over REST (no auto-approval is configured: the return waits for a
person), the agent's Slurm backend resumes the node, `sinfo` shows it `idle` and the
node's lifecycle reads healthy on GET /api/v1/nodes/<name>/.

The same loop for the common case, a GPU that fails on a node with no job (the agent's own
fake GPU reports the Xid 79): the node sweep plans the node's incident, the node is drained
with Faultline's reason and returned after repair. And a node whose agent goes silent: the
controller agent (deploy/agent-controller.toml, a second agent process here, named in the
service's remediation policy) drains it after 30 s of silence, and the node's own agent
puts it back once it reports again and validates.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import tomllib
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agents.fake_nvml import fake_uuid
from agents.reporter import Reporter
from faultline.testing.service import BIN, Service, start_service, stop_service, wait_for
from tests.conftest import iso, make_batch
from tests.system.slurm import Slurm, slurm_available, slurm_cluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(bool(slurm_available()), reason=slurm_available() or "slurm present"),
]

ROOT = Path(__file__).resolve().parents[2]
GROUP = "loop-train"
APPROVERS = [("ann", "ann-approver-pw-1"), ("bob", "bob-approver-pw-2")]
CONTROLLER = "slurmctl-loop"  # the controller agent's node name (not a Slurm node)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Slurm]:
    yield from slurm_cluster()


@pytest.fixture(scope="module")
def loop_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    data = tmp_path_factory.mktemp("faultline-loop")
    policy = data / "remediation.toml"
    policy.write_text(f'[remediation.default]\ncontroller = "{CONTROLLER}"\n')
    svc = start_service(
        data,
        env={"FAULTLINE_VALIDATION_WINDOW_S": "3", "FAULTLINE_REMEDIATION_POLICY": str(policy)},
    )
    try:
        for name, password in APPROVERS:
            svc.cli("user", "create", name, "--role", "approver", "--password", password)
        yield svc
    finally:
        stop_service(svc)


def _post(svc: Service, path: str, body: dict[str, Any], auth: tuple[str, str]) -> Any:
    basic = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    request = urllib.request.Request(
        svc.url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Basic {basic}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"null")


def _ingest(svc: Service, token: str, node: str, records: list[dict[str, Any]]) -> None:
    body = json.dumps(make_batch(records, node=node, agent_id=f"loop-test-{node}")).encode()
    request = urllib.request.Request(
        svc.url + "/api/v1/ingest",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 202


def _shipped_config(tmp: Path, state: Path) -> Path:
    """deploy/agent.toml as shipped, with only its paths pointed at this test's dirs."""
    text = (ROOT / "deploy" / "agent.toml").read_text()
    shipped = tomllib.loads(text)
    assert shipped["scheduler"] == "slurm"
    text = text.replace(shipped["state_dir"], str(state))
    text = text.replace(shipped["token_file"], str(tmp / "agent.token"))
    text = text.replace("/mnt/ckpt/llama-70b", str(tmp / "ckpt"))
    (tmp / "ckpt").mkdir(exist_ok=True)
    path = tmp / "agent.toml"
    path.write_text(text)
    return path


def _start_agent(
    svc: Service, slurm: Slurm, tmp: Path, *, boot_id: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    state = tmp / "agent-state"
    state.mkdir(exist_ok=True)
    token = svc.token(slurm.node)
    (tmp / "agent.token").write_text(token + "\n")
    config = _shipped_config(tmp, state)
    env = {**os.environ, **slurm.env, **(env or {})}
    proc = subprocess.Popen(
        [str(BIN / "faultline-agent"), "run", "--config", str(config), "--server", svc.url,
         "--node", slurm.node, "--fake-gpus", "2", "--state-dir", str(state),
         "--boot-id", boot_id],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(state / "agent.log", "ab"),  # noqa: SIM115 - lives with the process
    )  # fmt: skip
    svc.agents.append(proc)
    return proc


def _group_records(node: str, start: datetime, job: str) -> list[dict[str, Any]]:
    gpu = fake_uuid(node, 0)
    manifest = {"shards": [{"path": "rank0.pt", "bytes": 4096, "sha256": "ab" * 32}],
                "total_bytes": 4096}  # fmt: skip
    records: list[dict[str, Any]] = [
        {"kind": "transition", "group": GROUP, "generation": 1, "from_state": "initializing",
         "to_state": "running", "restart_count": 0, "world_size": 1, "job": job,
         "ts": iso(start)},
        {"kind": "process", "group": GROUP, "generation": 1, "rank": 0, "event": "started",
         "pid": 100, "gpu": gpu, "ts": iso(start)},
    ]  # fmt: skip
    records += [
        {"kind": "step", "group": GROUP, "generation": 1, "rank": 0, "step": s, "tokens": 2048,
         "duration_ms": 1000.0, "loss": 2.5, "ts": iso(start + timedelta(seconds=s))}
        for s in range(8)
    ]  # fmt: skip
    records.append(
        {"kind": "checkpoint", "group": GROUP, "generation": 1, "checkpoint_id": "step-4",
         "step": 4, "phase": "committed", "manifest": manifest,
         "ts": iso(start + timedelta(seconds=4.5))}
    )  # fmt: skip
    return records


def test_it_drains_the_node_on_slurm_after_a_hardware_xid_and_returns_it_after_repair(
    loop_service: Service, cluster: Slurm, tmp_path: Path
) -> None:
    svc, slurm = loop_service, cluster
    agent = _start_agent(svc, slurm, tmp_path, boot_id="loop-boot-1")
    wait_for(
        lambda: any(n["name"] == slurm.node for n in svc.api("/api/v1/nodes/")["results"]),
        60,
        "the agent's node in the inventory",
    )
    token = svc.token(slurm.node)
    submitted = slurm.run(
        "sbatch", "--parsable", f"--chdir={tmp_path}", "--output=/dev/null", "--wrap", "sleep 300"
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]

    def job_state() -> str:
        return slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()

    # A job submitted before slurmd registered the node IDLE waits for slurmctld's periodic
    # scheduling pass (60 s by default): 30 s timed out once in CI (1 of 3 runs, 2026-12-03).
    wait_for(lambda: job_state() == "RUNNING", 90, f"Slurm job {job} running")
    start = datetime.now(UTC) - timedelta(seconds=10)
    _ingest(svc, token, slurm.node, _group_records(slurm.node, start, job))
    # Rank 0 reports through the node's agent too, as a job's reporter does: the agent
    # runs a group's action (the requeue) only for a group it has seen records of. (The
    # drain is the node's, proposed for its node incident: it names no group.)
    reporter = Reporter(
        socket_path=str(tmp_path / "agent-state" / "reporter.sock"), group=GROUP,
        generation=1, rank=0,
    )  # fmt: skip

    def agent_saw_the_group() -> bool:
        reporter.process("started")  # a datagram: sent again until the agent has it
        return GROUP in (tmp_path / "agent-state" / "executor.json").read_text()

    wait_for(agent_saw_the_group, 30, "the agent to see the group's records")
    fault_at = datetime.now(UTC)
    _ingest(svc, token, slurm.node, [
        {"kind": "device_event", "gpu": fake_uuid(slurm.node, 0), "event": "xid", "code": 79,
         "detail": "GPU has fallen off the bus", "ts": iso(fault_at)},
    ])  # fmt: skip

    def proposal() -> dict[str, Any] | None:
        rows = svc.api("/api/v1/actions/?state=proposed")["results"]
        return next((a for a in rows if a["kind"] == "drain_node"), None)

    action = wait_for(proposal, 60, "the policy's drain_node proposal")
    assert action["target"] == f"node:{slurm.node}"
    assert action["proposed_by"] is None and action["proposed_by_rule"] == "policy"
    assert action["params"]["node"] == slurm.node
    assert action["trigger"] == "xid:79" and action["preview"]
    assert action["approvals_required"] == 2, action["gate_reasons"]
    for auth in APPROVERS:
        _post(svc, f"/api/v1/actions/{action['id']}/approve/", {"reason": "Xid 79"}, auth)

    def drained() -> str:
        reason = slurm.run("sinfo", "-h", "-n", slurm.node, "-o", "%E").stdout.strip()
        return reason if reason.startswith(f"faultline: {action['id']} ") else ""

    reason = wait_for(drained, 60, "sinfo to show Faultline's drain reason")
    out_at = datetime.now(UTC)
    Path("test-artifacts").mkdir(exist_ok=True)
    Path("test-artifacts/remediation-loop.json").write_text(
        json.dumps({"fault_to_out_of_service_s": (out_at - fault_at).total_seconds()})
    )
    assert "Xid" in reason or "xid" in reason
    assert slurm.node_state().rstrip("*") in ("drained", "draining", "drain")
    done = wait_for(
        lambda: (a := svc.api(f"/api/v1/actions/{action['id']}/"))["state"] == "succeeded" and a,
        60,
        "the agent's result",
    )
    assert done["result"]["status"] == "succeeded", done["result"]
    assert f"faultline: {action['id']}" in json.dumps(done["result"])
    print(f"fault -> node out of service on Slurm: {(out_at - fault_at).total_seconds():.1f} s")

    # The job stopped by the fault restarts from its checkpoint without the node: the
    # policy proposes restart_group with the group's Slurm job id; a human approves.
    def restart() -> dict[str, Any] | None:
        rows = svc.api("/api/v1/actions/?state=proposed")["results"]
        return next((a for a in rows if a["kind"] == "restart_group"), None)

    again = wait_for(restart, 60, "the policy's restart_group proposal")
    assert again["params"]["job"] == job and "step-4" in again["reason"]
    _post(svc, f"/api/v1/actions/{again['id']}/approve/", {"reason": "from step-4"}, APPROVERS[0])
    requeued = wait_for(
        lambda: (a := svc.api(f"/api/v1/actions/{again['id']}/"))["state"] == "succeeded" and a,
        60,
        "the agent's requeue result",
    )
    requeued_at = datetime.now(UTC)
    assert f"job {job}: RUNNING" in requeued["result"]["output"]
    shown = slurm.run("scontrol", "show", "job", job, "-o").stdout
    assert "Restarts=1" in shown
    # One node, and it is drained: the requeued job waits for a node in service.
    assert job_state() in ("PENDING", "REQUEUED", "COMPLETING"), job_state()
    assert agent.poll() is None
    slurm.run("scancel", "--quiet", job)  # the node's return is checked on an empty node
    wait_for(lambda: job_state() == "", 30, f"Slurm job {job} gone")

    # The return half. Still out of service: nothing puts it back before a repair.
    node_url = f"/api/v1/nodes/{slurm.node}/"
    assert svc.api(node_url)["lifecycle"] == "out_of_service"
    assert slurm.node_state().rstrip("*") in ("drained", "drain")
    # The repair: the node "reboots" (its agent comes back with a new boot id).
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0
    repaired_at = datetime.now(UTC)
    agent = _start_agent(svc, slurm, tmp_path, boot_id="loop-boot-2")
    wait_for(lambda: svc.api(node_url)["lifecycle"] in ("validating", "healthy"), 60, "validating")

    def uncordon() -> dict[str, Any] | None:
        rows = svc.api("/api/v1/actions/?state=proposed")["results"]
        return next((a for a in rows if a["kind"] == "uncordon_node"), None)

    back = wait_for(uncordon, 60, "the sweep's uncordon_node proposal")
    proposed_at = datetime.now(UTC)
    assert back["target"] == f"node:{slurm.node}" and back["proposed_by_rule"] == "fleet_health"
    assert back["trigger"] == "validated" and back["params"]["node"] == slurm.node
    assert (proposed_at - repaired_at).total_seconds() >= 3  # the validation window
    assert svc.api(node_url)["lifecycle"] == "validating"  # proposed, not yet returned
    assert slurm.node_state().rstrip("*") in ("drained", "drain")
    _post(svc, f"/api/v1/actions/{back['id']}/approve/", {"reason": "rebooted"}, APPROVERS[0])
    returned = wait_for(
        lambda: (a := svc.api(f"/api/v1/actions/{back['id']}/"))["state"] == "succeeded" and a,
        60,
        "the agent's resume result",
    )
    returned_at = datetime.now(UTC)
    assert returned["outcome"]["state"] == "applied", returned["outcome"]
    # A trailing "*" is Slurm's "not responding" mark: slurmd late under load, state read.
    said = re.search(rf"node {slurm.node}: (\S+) -> (\S+)", returned["result"]["output"])
    assert said, returned["result"]["output"]
    assert said[1].rstrip("*") in ("drained", "drain") and said[2].rstrip("*") == "idle", said[0]
    assert slurm.node_state().rstrip("*") == "idle"
    assert slurm.run("sinfo", "-h", "-n", slurm.node, "-o", "%E").stdout.strip() in ("", "none")
    node = svc.api(node_url)
    assert node["lifecycle"] == "healthy", node
    assert all(gpu["lifecycle"] == "healthy" for gpu in node["devices"]), node["devices"]
    own = [i for i in node["incidents"] if i["scope"] == "node"]
    assert own and all(i["state"] == "resolved" for i in own), own
    Path("test-artifacts/remediation-loop.json").write_text(
        json.dumps({
            "fault_to_out_of_service_s": (out_at - fault_at).total_seconds(),
            "fault_to_job_requeued_s": (requeued_at - fault_at).total_seconds(),
            "repair_to_return_proposed_s": (proposed_at - repaired_at).total_seconds(),
            "repair_to_idle_s": (returned_at - repaired_at).total_seconds(),
        })
    )  # fmt: skip
    print(f"repair -> node idle on Slurm: {(returned_at - repaired_at).total_seconds():.1f} s")
    assert agent.poll() is None
    agent.send_signal(signal.SIGTERM)  # one agent per node: the next test starts its own
    assert agent.wait(timeout=30) == 0


# -- a node with no job, and a node whose agent is silent --------------------------------------


def _new_action(svc: Service, kind: str, seen: set[int]) -> dict[str, Any] | None:
    rows = svc.api("/api/v1/actions/?state=proposed")["results"]
    return next((a for a in rows if a["kind"] == kind and a["id"] not in seen), None)


def _action_ids(svc: Service) -> set[int]:
    return {a["id"] for a in svc.api("/api/v1/actions/")["results"]}


def _approve(svc: Service, action: dict[str, Any], why: str) -> None:
    for auth in APPROVERS[: max(1, action["approvals_required"])]:
        _post(svc, f"/api/v1/actions/{action['id']}/approve/", {"reason": why}, auth)


def _reason(slurm: Slurm) -> str:
    return slurm.run("sinfo", "-h", "-n", slurm.node, "-o", "%E").stdout.strip()


def _done(svc: Service, action_id: int, what: str) -> dict[str, Any]:
    return wait_for(
        lambda: (a := svc.api(f"/api/v1/actions/{action_id}/"))["state"] == "succeeded" and a,
        60,
        what,
    )


def _reporting(svc: Service, name: str) -> bool:
    rows = svc.api("/api/v1/nodes/")["results"]
    node = next((n for n in rows if n["name"] == name), None)
    return node is not None and node["last_seen"] is not None and node["health"] != "down"


def _idle(slurm: Slurm) -> bool:
    return slurm.node_state().rstrip("*") == "idle"


def _return_after_repair(
    svc: Service, slurm: Slurm, seen: set[int], repaired_at: datetime
) -> dict[str, Any]:
    """The sweep proposes the node's return after the validation window; an approver
    approves; the node's own agent resumes it on Slurm."""
    node_url = f"/api/v1/nodes/{slurm.node}/"
    try:
        back = wait_for(lambda: _new_action(svc, "uncordon_node", seen), 60, "the return proposal")
    except AssertionError as exc:  # what the sweep saw: readable from CI's output
        node = svc.api(node_url)
        keys = ("health", "last_seen", "lifecycle", "lifecycle_since", "lifecycle_reason")
        state = {k: node.get(k) for k in keys}
        gpus = [(d["index"], d.get("lifecycle"), d.get("last_seen")) for d in node["devices"]]
        new = [(a["id"], a["kind"], a["state"]) for a in svc.api("/api/v1/actions/")["results"]
               if a["id"] not in seen]  # fmt: skip
        raise AssertionError(f"{exc}\nnode: {state}\ngpus: {gpus}\nnew actions: {new}\n"
                             f"history: {node['history'][:8]}") from None  # fmt: skip
    assert back["proposed_by_rule"] == "fleet_health" and back["executor"] is None
    assert (datetime.now(UTC) - repaired_at).total_seconds() >= 3  # the validation window
    _approve(svc, back, "repaired")
    returned = _done(svc, back["id"], "the agent's resume result")
    assert returned["outcome"]["state"] == "applied", returned["outcome"]
    wait_for(lambda: _idle(slurm), 30, "sinfo idle again")
    assert _reason(slurm) in ("", "none")
    node = svc.api(node_url)
    assert node["lifecycle"] == "healthy", node
    return node


def test_it_drains_an_idle_node_whose_gpu_fails_and_returns_it_after_repair(
    loop_service: Service, cluster: Slurm, tmp_path: Path
) -> None:
    """No job on the node: the agent's fake GPU 0 reports Xid 79 (as NVML would); the node
    sweep plans the node's incident (no group runs there) and proposes drain_node."""
    svc, slurm = loop_service, cluster
    wait_for(lambda: _idle(slurm), 60, "the Slurm node idle, no job on it")
    assert slurm.run("squeue", "-h", "-w", slurm.node).stdout.strip() == ""
    control = tmp_path / "nvml"
    control.mkdir()
    env = {"FAULTLINE_FAKE_NVML_CONTROL_DIR": str(control)}
    agent = _start_agent(svc, slurm, tmp_path, boot_id="idle-boot-1", env=env)
    node_url = f"/api/v1/nodes/{slurm.node}/"
    wait_for(lambda: _reporting(svc, slurm.node), 60, "the node reporting")
    seen = _action_ids(svc)
    fault_at = datetime.now(UTC)
    (control / slurm.node).write_text("0:xid79\n")  # the GPU falls off the bus
    action = wait_for(lambda: _new_action(svc, "drain_node", seen), 60, "the drain proposal")
    assert action["target"] == f"node:{slurm.node}" and action["trigger"] == "xid:79"
    assert action["proposed_by_rule"] == "policy" and action["executor"] is None
    incident = svc.api(f"/api/v1/incidents/{action['incident']}/")
    assert incident["group"] is None and incident["kind"] == "xid", incident
    assert not any(a["kind"] == "restart_group" for a in svc.api("/api/v1/actions/")["results"]
                   if a["id"] not in seen)  # fmt: skip
    _approve(svc, action, "Xid 79 on a spare")
    reason = wait_for(
        lambda: (r := _reason(slurm)).startswith(f"faultline: {action['id']} ") and r,
        60,
        "sinfo to show Faultline's drain reason",
    )
    out_at = datetime.now(UTC)
    assert "xid" in reason.lower()
    assert slurm.node_state().rstrip("*") in ("drained", "drain")
    done = _done(svc, action["id"], "the agent's drain result")
    assert done["outcome"]["state"] == "applied", done["outcome"]
    assert svc.api(node_url)["lifecycle"] == "out_of_service"
    print(f"idle node: fault -> drained on Slurm: {(out_at - fault_at).total_seconds():.1f} s")

    # The repair: the node reboots (a new boot id; its fake GPUs start clean).
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0
    (control / slurm.node).unlink()
    seen = _action_ids(svc)
    repaired_at = datetime.now(UTC)
    agent = _start_agent(svc, slurm, tmp_path, boot_id="idle-boot-2", env=env)
    assert slurm.node_state().rstrip("*") in ("drained", "drain")  # not back before validation
    _return_after_repair(svc, slurm, seen, repaired_at)
    back_at = datetime.now(UTC)
    print(f"idle node: repair -> idle on Slurm: {(back_at - repaired_at).total_seconds():.1f} s")
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0


def _start_controller(svc: Service, slurm: Slurm, tmp: Path) -> subprocess.Popen[bytes]:
    """deploy/agent-controller.toml as shipped, its paths pointed at this test's dirs."""
    state = tmp / "controller-state"
    state.mkdir()
    (tmp / "controller.token").write_text(svc.token(CONTROLLER) + "\n")
    text = (ROOT / "deploy" / "agent-controller.toml").read_text()
    shipped = tomllib.loads(text)
    assert shipped["controller"] is True and shipped["scheduler"] == "slurm"
    text = text.replace(shipped["state_dir"], str(state))
    text = text.replace(shipped["token_file"], str(tmp / "controller.token"))
    text = text.replace(f'node = "{shipped["node"]}"', f'node = "{CONTROLLER}"')
    config = tmp / "controller.toml"
    config.write_text(text)
    proc = subprocess.Popen(
        [str(BIN / "faultline-agent"), "run", "--config", str(config), "--server", svc.url,
         "--state-dir", str(state)],
        env={**os.environ, **slurm.env},
        stdout=subprocess.DEVNULL,
        stderr=open(state / "agent.log", "ab"),  # noqa: SIM115 - lives with the process
    )  # fmt: skip
    svc.agents.append(proc)
    return proc


def test_the_controller_agent_drains_a_silent_node_and_its_own_agent_returns_it(
    loop_service: Service, cluster: Slurm, tmp_path: Path
) -> None:
    svc, slurm = loop_service, cluster
    wait_for(lambda: _idle(slurm), 60, "the Slurm node idle")
    agent = _start_agent(svc, slurm, tmp_path, boot_id="silent-boot-1")
    controller = _start_controller(svc, slurm, tmp_path)
    node_url = f"/api/v1/nodes/{slurm.node}/"
    for name in (slurm.node, CONTROLLER):  # the controller has no GPU: its health is unknown
        wait_for(lambda n=name: _reporting(svc, n), 60, f"{name} reporting")
    seen = _action_ids(svc)
    agent.kill()  # the node's agent is gone; slurmd still answers Slurm
    agent.wait(timeout=30)
    silent_at = datetime.now(UTC)
    wait_for(lambda: svc.api(node_url)["health"] == "down", 60, "the node marked silent")
    action = wait_for(lambda: _new_action(svc, "cordon_node", seen), 120, "the cordon proposal")
    proposed_at = datetime.now(UTC)
    # The hold counts from the silent-node incident, not from the kill: on a loaded box the
    # agent can miss its beat before it is killed, and the sweep opens the incident then.
    detail = svc.api(node_url)
    silence = next(i for i in detail["incidents"] if i["kind"] == "node_silent")
    opened_at = datetime.fromisoformat(silence["opened_at"])
    assert (proposed_at - opened_at).total_seconds() >= 30  # silent 30 s first
    assert opened_at >= datetime.fromisoformat(detail["last_seen"])
    assert action["target"] == f"node:{slurm.node}" and action["executor"] == CONTROLLER
    _approve(svc, action, "silent node")
    reason = wait_for(
        lambda: (r := _reason(slurm)).startswith(f"faultline: {action['id']} ") and r,
        60,
        "sinfo to show the controller's drain",
    )
    assert "silent" in reason or "stopped reporting" in reason
    done = _done(svc, action["id"], "the controller's result")
    assert done["outcome"]["state"] == "applied", done["outcome"]
    assert svc.api(node_url)["lifecycle"] == "out_of_service"
    assert controller.poll() is None
    print(f"silent node: silent -> drained by the controller: "
          f"{(datetime.now(UTC) - silent_at).total_seconds():.1f} s")  # fmt: skip

    seen = _action_ids(svc)
    repaired_at = datetime.now(UTC)
    agent = _start_agent(svc, slurm, tmp_path, boot_id="silent-boot-2")
    _return_after_repair(svc, slurm, seen, repaired_at)
    for proc in (agent, controller):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
