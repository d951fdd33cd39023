"""The action contract through the executor: every shipped config runs every kind.

Scheduler commands are the stateful fakes of tests/agents/fake_schedulers.py (the real
Slurm runs in tests/system/test_slurm.py; there is no Kubernetes API server here).
"""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents import actions_contract as contract
from agents import signing
from agents.cli import ConfigError, _parser, build_config
from agents.executor import Executor
from agents.schedulers import kubernetes, slurm
from tests.agents.fake_schedulers import FakeSchedulers

ROOT = Path(__file__).resolve().parents[2]
NODE = "gpu-node-017"
GPU = "GPU-8a7c3f2e-1b4d-4e6f-9a0b-c1d2e3f4a5b6"
JOB = "4242"

# Take out, then put back, so each step starts from the state it acts on.
SEQUENCE = [
    contract.CORDON_NODE,
    contract.UNCORDON_NODE,
    contract.DRAIN_NODE,
    contract.UNCORDON_NODE,
    contract.QUARANTINE_NODE,
    contract.UNCORDON_NODE,
    contract.ISOLATE_GPU,
    contract.RELEASE_GPU,
    contract.RESTART_GROUP,
]


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSchedulers:
    fake = FakeSchedulers(tmp_path / "sched")
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    fake.set_state(
        {"nodes": {}, "jobs": {JOB: {"state": "RUNNING", "restarts": 0, "nodes": [NODE]}}}
    )
    return fake


TOKEN = "t"


def action(n: int, kind: str, **params: Any) -> dict[str, Any]:
    """An action as the service dispatches it: signed with the agent token's hash."""
    base = {"node": NODE, "gpu": GPU, "job": JOB, "reason": "xid 79 on GPU 3"}
    body = {
        "id": n,
        "kind": kind,
        "target": f"node:{NODE}",
        "group": "llama-70b",
        "generation": 3,
        "params": {**base, **params},
    }
    return signing.sign(body, signing.key_from_token(TOKEN))


def _executor(state: Path, **kw: Any) -> Executor:
    """The executor as the agent builds it: its token, and this node's GPU."""
    kw.setdefault("token", TOKEN)
    kw.setdefault("gpus", [GPU])
    return Executor(state, **kw)


def shipped_configs(tmp_path: Path) -> dict[str, Path]:
    daemonset = yaml.safe_load_all((ROOT / "deploy/agent-daemonset.yaml").read_text())
    configmap = next(doc for doc in daemonset if doc and doc.get("kind") == "ConfigMap")
    embedded = tmp_path / "daemonset-agent.toml"
    embedded.write_text(configmap["data"]["agent.toml"])
    return {"deploy/agent.toml": ROOT / "deploy/agent.toml", "daemonset": embedded}


def executor_for(config: Path, state: Path, node: str = NODE) -> Executor:
    args = [
        "run",
        "--config",
        str(config),
        "--server",
        "http://127.0.0.1:9",
        "--token",
        "t",
        "--node",
        node,
    ]
    cfg = build_config(_parser().parse_args(args))
    state.mkdir()
    return _executor(
        state,
        node=cfg.node,
        hooks=cfg.hooks,
        scheduler=cfg.scheduler,
        timeout_s=20,
        allowed_kinds=cfg.allowed_kinds,
        allow_unsigned=cfg.allow_unsigned,
        controller_nodes=cfg.controller_nodes if cfg.controller else (),
    )


@pytest.mark.parametrize("name", ["deploy/agent.toml", "daemonset"])
def test_it_runs_every_action_kind_of_every_shipped_config(
    name: str, tmp_path: Path, fakes: FakeSchedulers
) -> None:
    config = shipped_configs(tmp_path)[name]
    executor = executor_for(config, tmp_path / "state")
    assert set(SEQUENCE) == set(contract.KINDS), "the sequence must cover the contract"
    for n, kind in enumerate(SEQUENCE, start=1):
        before = len(fakes.calls())
        result = executor.handle(action(n, kind))
        assert result is not None
        assert "no hook configured" not in result["output"], (name, kind, result["output"])
        ran = fakes.calls()[before:]
        if kind in executor.hooks:
            assert result["status"] == "succeeded", (kind, result)
            assert ran, f"{kind}: the hook ran nothing"
        elif executor.scheduler is not None and kind in executor.scheduler.kinds:
            assert result["outcome"]["state"] == "applied", (name, kind, result["output"])
            assert result["status"] == "succeeded"
        else:
            # Said plainly, with the fix: this backend cannot do it and no hook does.
            assert result["outcome"]["state"] == "unsupported", (name, kind, result)
            assert f"[hooks] {kind}" in result["output"]
            assert ran == []


def test_it_drains_on_slurm_with_faultlines_reason_then_resumes(
    tmp_path: Path, fakes: FakeSchedulers
) -> None:
    executor = _executor(tmp_path, node=NODE, hooks={}, scheduler="slurm")
    drained = executor.handle(action(1, contract.DRAIN_NODE))
    assert drained is not None
    assert [
        "scontrol",
        "update",
        f"nodename={NODE}",
        "state=drain",
        "reason=faultline: 1 xid 79 on GPU 3",
    ] in fakes.calls()
    assert drained["outcome"]["after"]["state"] == "drained"
    assert drained["outcome"]["taken_out_by"] == "faultline"
    resumed = executor.handle(action(2, contract.UNCORDON_NODE))
    assert resumed is not None and resumed["outcome"]["state"] == "applied"
    assert fakes.state()["nodes"][NODE]["state"] == "IDLE"


def test_it_leaves_a_node_someone_else_drained_and_refuses_to_resume_it(
    tmp_path: Path, fakes: FakeSchedulers
) -> None:
    theirs = {"state": "IDLE+DRAIN", "reason": "bad DIMM, ticket 1234"}
    fakes.set_state({"nodes": {NODE: theirs}, "jobs": {}})
    executor = _executor(tmp_path, node=NODE, hooks={}, scheduler="slurm")
    drained = executor.handle(action(1, contract.DRAIN_NODE))
    assert drained is not None
    assert drained["outcome"]["state"] == "held_by_other"
    assert drained["outcome"]["before"]["reason"] == "bad DIMM, ticket 1234"
    assert drained["outcome"]["taken_out_by"] == "other"
    resumed = executor.handle(action(2, contract.UNCORDON_NODE))
    assert resumed is not None
    assert (resumed["status"], resumed["outcome"]["state"]) == ("failed", "refused")
    assert not [c for c in fakes.calls() if c[:2] == ["scontrol", "update"]]
    assert fakes.state()["nodes"][NODE]["reason"] == "bad DIMM, ticket 1234"
    forced = executor.handle(action(3, contract.UNCORDON_NODE, force=True))
    assert forced is not None and forced["outcome"]["state"] == "applied"


def test_it_requeues_a_slurm_job_and_reads_the_restart_back(
    tmp_path: Path, fakes: FakeSchedulers
) -> None:
    executor = _executor(tmp_path, node=NODE, hooks={}, scheduler="slurm")
    result = executor.handle(action(1, contract.RESTART_GROUP))
    assert result is not None and result["outcome"]["state"] == "applied"
    assert ["scontrol", "requeue", JOB] in fakes.calls()
    assert result["outcome"]["before"]["restarts"] == "0"
    assert result["outcome"]["after"]["restarts"] == "1"
    missing = executor.handle(action(2, contract.RESTART_GROUP, job=""))
    assert missing is not None and missing["status"] == "failed"
    assert "params.job" in missing["output"]


def test_it_reports_not_applied_when_the_read_back_disagrees_with_exit_0(
    tmp_path: Path, fakes: FakeSchedulers
) -> None:
    # scontrol that answers 0 but changes nothing: the outcome must say so.
    (fakes.bin / "scontrol").write_text(
        (fakes.bin / "scontrol").read_text().replace('if kv("state=") == "drain"', "if False")
    )
    executor = _executor(tmp_path, node=NODE, hooks={}, scheduler="slurm")
    result = executor.handle(action(1, contract.DRAIN_NODE))
    assert result is not None
    assert (result["status"], result["exit_code"]) == ("failed", 0)
    assert result["outcome"]["state"] == "not_applied"


def test_it_reads_old_hook_names_as_contract_kinds_with_a_warning(
    tmp_path: Path, fakes: FakeSchedulers, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="faultline.agent.actions"):
        executor = _executor(
            tmp_path,
            node=NODE,
            hooks={"cordon": "kubectl cordon {node}", "reset_gpu": "kubectl get node {gpu}"},
        )
    assert set(executor.hooks) == {contract.CORDON_NODE, contract.ISOLATE_GPU}
    assert '"cordon" is an old name, read as "cordon_node"' in caplog.text
    result = executor.handle(action(1, contract.CORDON_NODE))
    assert result is not None and result["status"] == "succeeded"
    assert ["kubectl", "cordon", NODE] in fakes.calls()


def test_it_prefers_a_configured_hook_over_the_backend(
    tmp_path: Path, fakes: FakeSchedulers
) -> None:
    executor = _executor(
        tmp_path, node=NODE, hooks={"drain_node": "kubectl drain {node}"}, scheduler="slurm"
    )
    executor.handle(action(1, contract.DRAIN_NODE))
    assert [c[0] for c in fakes.calls()] == ["kubectl"]


def test_it_runs_nothing_for_a_dry_run_action(tmp_path: Path, fakes: FakeSchedulers) -> None:
    executor = _executor(tmp_path, node=NODE, hooks={}, scheduler="slurm")
    result = executor.handle(action(1, contract.DRAIN_NODE, dry_run=True))
    assert result is not None
    assert "dry-run: would run" in result["output"]
    assert "state=drain" in result["output"]
    assert fakes.calls() == []


def test_it_refuses_an_unknown_scheduler_in_the_config(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('scheduler = "pbs"\n')
    with pytest.raises(ConfigError, match='scheduler = "pbs" is not a built-in backend'):
        build_config(_parser().parse_args(["run", "--config", str(config), "--dry-run"]))


def test_it_keeps_the_shipped_toml_on_contract_kind_names() -> None:
    for path in ("deploy/agent.toml",):
        hooks = tomllib.loads((ROOT / path).read_text()).get("hooks", {})
        assert set(hooks) <= set(contract.KINDS), hooks
    docs = (ROOT / "docs/agent.md").read_text()
    for kind in contract.KINDS:
        assert f"`{kind}`" in docs, f"docs/agent.md does not document {kind}"


# -- parsing recorded outputs --------------------------------------------------------------

SLURM_DRAINED = (
    "NodeName=vm Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.40 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=vm NodeHostName=vm "
    "Version=22.05.8 OS=Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1 "
    "AllocMem=0 FreeMem=22376 Sockets=2 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 "
    "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  "
    "BootTime=2026-12-01T10:00:52 SlurmdStartTime=2026-12-01T10:07:58 "
    "CfgTRES=cpu=2,mem=1M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 "
    "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=faultline: 1 xid=79 on GPU 3 [root@2026-12-01T10:07:58]"
)


def test_it_parses_a_slurm_node_line_recorded_from_slurm_22_05() -> None:
    info = slurm.parse_node(SLURM_DRAINED)
    assert info == {
        "flags": "IDLE+DRAIN",
        "reason": "faultline: 1 xid=79 on GPU 3",
        "by": "root",
        "at": "2026-12-01T10:07:58",
    }
    idle = slurm.parse_node(SLURM_DRAINED.split(" Reason=")[0].replace("+DRAIN", ""))
    assert (idle["flags"], idle["reason"]) == ("IDLE", "")
    assert slurm.out_of_service("MIXED+DRAIN") and slurm.out_of_service("DOWN*")
    assert not slurm.out_of_service("IDLE+NOT_RESPONDING")


KUBECTL_NODE = """{
  "apiVersion": "v1", "kind": "Node",
  "metadata": {"name": "gpu-node-017", "labels": {"nvidia.com/gpu.present": "true"},
    "annotations": {"faultline.io/taken-out": "faultline: 12 xid 79",
                    "node.alpha.kubernetes.io/ttl": "0"}},
  "spec": {"podCIDR": "10.244.3.0/24", "unschedulable": true,
    "taints": [{"effect": "NoSchedule", "key": "node.kubernetes.io/unschedulable",
                "timeAdded": "2026-12-01T10:07:58Z"},
               {"effect": "NoSchedule", "key": "faultline.io/quarantine", "value": "action-12"}]},
  "status": {"conditions": [{"type": "MemoryPressure", "status": "False"},
                            {"type": "Ready", "status": "True"}]}
}"""

KUBECTL_DRAIN = """node/gpu-node-017 cordoned
Warning: ignoring DaemonSet-managed Pods: faultline/faultline-agent-7xk2p, kube-system/nvidia-dp-q8
evicting pod default/train-llama-70b-worker-3
evicting pod default/train-llama-70b-worker-7
pod/train-llama-70b-worker-3 evicted
pod/train-llama-70b-worker-7 evicted
node/gpu-node-017 drained
"""


def test_it_parses_kubectl_node_json_and_drain_output() -> None:
    info = kubernetes.parse_node(KUBECTL_NODE)
    assert info is not None
    assert info["unschedulable"] is True and info["ready"] == "True"
    assert kubernetes.has_taint(info, kubernetes.QUARANTINE_TAINT)
    assert contract.is_faultline_reason(info["taken_out"])
    assert kubernetes.parse_node('{"kind": "Status", "status": "Failure"}') is None
    drain = kubernetes.parse_drain(KUBECTL_DRAIN, NODE)
    assert drain["drained"] is True
    assert drain["evicted"] == ["train-llama-70b-worker-3", "train-llama-70b-worker-7"]
    unfinished = kubernetes.parse_drain(KUBECTL_DRAIN.replace("drained", "cordoned"), NODE)
    assert unfinished["drained"] is False


def test_it_builds_the_kubectl_command_lines(tmp_path: Path, fakes: FakeSchedulers) -> None:
    executor = _executor(tmp_path, node=NODE, hooks={}, scheduler="kubernetes")
    executor.handle(action(5, contract.QUARANTINE_NODE))
    executor.handle(action(6, contract.ISOLATE_GPU))
    calls = [c for c in fakes.calls() if c[1] != "get"]
    key = "faultline.io/gpu-8a7c3f2e-1b4d-4e6f-9a0b-c1d2e3f4a5b6"
    mark = f"{kubernetes.ANNOTATION}=faultline: 5 xid 79 on GPU 3"
    taint = ["kubectl", "taint", "node", NODE, "--overwrite"]
    assert calls == [
        ["kubectl", "cordon", NODE],
        ["kubectl", "annotate", "node", NODE, "--overwrite", mark],
        [
            "kubectl",
            "drain",
            NODE,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=300s",
        ],
        [*taint, "faultline.io/quarantine=action-5:NoSchedule"],
        [*taint, f"{key}=action-6:NoSchedule"],
    ]


def test_it_leaves_a_node_cordoned_by_someone_else_on_kubernetes(
    tmp_path: Path, fakes: FakeSchedulers
) -> None:
    theirs = {"unschedulable": True, "taints": [], "annotations": {}, "state": "", "reason": ""}
    fakes.set_state({"nodes": {NODE: theirs}, "jobs": {}})
    executor = _executor(tmp_path, node=NODE, hooks={}, scheduler="kubernetes")
    drained = executor.handle(action(1, contract.DRAIN_NODE))
    back = executor.handle(action(2, contract.UNCORDON_NODE))
    assert drained is not None and drained["outcome"]["state"] == "held_by_other"
    assert back is not None and back["outcome"]["state"] == "refused"
    assert [c[1] for c in fakes.calls()] == ["get", "get"]


def test_it_drains_a_node_faultline_only_cordoned_on_kubernetes(
    tmp_path: Path, fakes: FakeSchedulers
) -> None:
    executor = _executor(tmp_path, node=NODE, hooks={}, scheduler="kubernetes")
    cordoned = executor.handle(action(1, contract.CORDON_NODE))
    drained = executor.handle(action(2, contract.DRAIN_NODE))
    assert cordoned is not None and cordoned["outcome"]["state"] == "applied"
    assert drained is not None and drained["outcome"]["state"] == "applied"
    assert drained["outcome"]["drain"]["evicted"] == ["train-0"]
    assert any(c[1] == "drain" for c in fakes.calls())


def test_it_names_what_an_action_lacks_before_dispatch() -> None:
    assert contract.problems("drain_node", {"reason": "xid 79", "dry_run": False}) == []
    assert contract.problems("isolate_gpu", {}, target=f"gpu:{GPU}") == []
    assert contract.problems("restart_group", {}) == [
        "restart_group needs params.job: scheduler job id: Slurm job id, or the workload "
        "name the hook knows"
    ]
    assert contract.problems("cordon_node", {"colour": "red"}) == [
        "cordon_node does not take params.colour"
    ]
    assert contract.problems("reboot", {})[0].startswith('unknown action kind "reboot"')
    assert contract.problems("drain", {}) == []  # an old alias still names a kind


# -- the controller agent: node actions for a silent node, and nothing else -----------------

CONTROLLER = "slurmctl-01"


def controller_action(n: int, kind: str, node: str = NODE, **over: Any) -> dict[str, Any]:
    """An action for `node` as the service routes it to the controller: signed with the
    controller's own token (the same test token here), its `node` field the controller."""
    body: dict[str, Any] = {
        "id": n,
        "kind": kind,
        "target": f"node:{node}",
        "group": None,
        "generation": None,
        "params": {"node": node, "reason": "silent 30 s", "dry_run": False},
        "node": CONTROLLER,
        **over,
    }
    return signing.sign(body, signing.key_from_token(TOKEN))


def test_the_shipped_controller_config_takes_a_silent_node_out_and_puts_it_back(
    tmp_path: Path, fakes: FakeSchedulers
) -> None:
    executor = executor_for(ROOT / "deploy/agent-controller.toml", tmp_path / "s", CONTROLLER)
    for n, kind in enumerate(
        [contract.CORDON_NODE, contract.UNCORDON_NODE, contract.DRAIN_NODE], start=1
    ):
        result = executor.handle(controller_action(n, kind))
        assert result is not None and result["outcome"]["state"] == "applied", result
    state = fakes.state()["nodes"]
    assert NODE in state and CONTROLLER not in state  # it acted on the silent node
    assert "DRAIN" in state[NODE]["state"]
    assert state[NODE]["reason"] == "faultline: 3 silent 30 s"


@pytest.mark.parametrize(
    ("kind", "over", "why"),
    [
        (contract.ISOLATE_GPU, {"target": f"gpu:{GPU}"}, "a controller runs only"),
        (contract.RESTART_GROUP, {}, "a controller runs only"),
        (contract.DRAIN_NODE, {"params": {"node": "gpu-[01-99]"}}, "not one safe node name"),
        (contract.DRAIN_NODE, {"params": {"node": "gpu-node-018"}}, "is not the target"),
    ],
)
def test_the_controller_refuses_what_a_controller_may_not_run_for_another_node(
    tmp_path: Path, fakes: FakeSchedulers, kind: str, over: dict[str, Any], why: str
) -> None:
    executor = executor_for(ROOT / "deploy/agent-controller.toml", tmp_path / "s", CONTROLLER)
    result = executor.handle(controller_action(7, kind, **over))
    assert result is not None and result["status"] == "failed"
    assert why in result["output"], result["output"]
    assert fakes.calls() == []


def test_a_controller_acts_only_on_the_nodes_its_globs_allow(
    tmp_path: Path, fakes: FakeSchedulers
) -> None:
    config = tmp_path / "controller.toml"
    text = (ROOT / "deploy/agent-controller.toml").read_text()
    config.write_text(text.replace('controller_nodes = ["*"]', 'controller_nodes = ["a100-*"]'))
    executor = executor_for(config, tmp_path / "s", CONTROLLER)
    refused = executor.handle(controller_action(1, contract.CORDON_NODE))
    assert (
        refused is not None and "not a node this controller acts on (a100-*)" in (refused["output"])
    )
    allowed = executor.handle(controller_action(2, contract.CORDON_NODE, node="a100-07"))
    assert allowed is not None and allowed["outcome"]["state"] == "applied", allowed


@pytest.mark.parametrize("name", ["deploy/agent.toml", "daemonset"])
def test_a_node_agent_never_acts_on_another_node(
    name: str, tmp_path: Path, fakes: FakeSchedulers
) -> None:
    """Only an agent configured as a controller does: a node's own agent refuses an action
    for another node even when it is signed for it."""
    executor = executor_for(shipped_configs(tmp_path)[name], tmp_path / "s", CONTROLLER)
    result = executor.handle(controller_action(1, contract.DRAIN_NODE))
    assert result is not None and "this agent is no controller" in result["output"], result
    assert fakes.calls() == []


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("controller = 1\n", "controller must be true or false"),
        ('controller = true\ncontroller_nodes = "gpu-*"\n', "controller_nodes must be a list"),
        ("controller = true\n", 'controller = true needs scheduler = "slurm"'),
    ],
)
def test_it_refuses_a_bad_controller_setting(tmp_path: Path, text: str, why: str) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=why):
        build_config(_parser().parse_args(["run", "--config", str(config), "--dry-run"]))
