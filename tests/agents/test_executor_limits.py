"""The node's own limits on actions: signatures, kinds, targets, arguments."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agents import signing
from agents.executor import Executor

from .conftest import StubIngest
from .test_executor import KEY, TOKEN, _action

PY = sys.executable
GPU = "GPU-5e1c0000-aaaa-bbbb-cccc-000000000001"


def _executor(tmp_path: Path, **kw) -> Executor:
    marker = tmp_path / "ran.txt"
    hook = f"{PY} -c \"import sys; open(sys.argv[1], 'a').write(' '.join(sys.argv[2:]) + chr(10))\""
    hooks = {
        kind: f"{hook} {marker} {{target}} {{group}} {{generation}} {{reason}}"
        for kind in ("cordon_node", "isolate_gpu", "restart_group")
    }
    kw.setdefault("token", TOKEN)
    kw.setdefault("gpus", [GPU])
    return Executor(tmp_path, node="node-1", hooks=hooks, **kw)


def _ran(tmp_path: Path) -> str:
    marker = tmp_path / "ran.txt"
    return marker.read_text() if marker.exists() else ""


# -- signatures -------------------------------------------------------------------------------


def test_it_drops_an_unsigned_action_without_running_recording_or_reporting_it(
    tmp_path: Path, stub: StubIngest
) -> None:
    executor = _executor(tmp_path, server=stub.url)
    unsigned = {k: v for k, v in _action().items() if k != "signature"}
    result = executor.handle(unsigned)
    assert result["output"] == "dropped: unsigned action (allow_unsigned is off)"
    assert _ran(tmp_path) == "" and "a1" not in executor.done and stub.results == {}
    # The real, signed action of that id still runs afterwards.
    assert executor.handle(_action())["status"] == "succeeded"


def test_it_runs_an_unsigned_action_only_when_allow_unsigned_is_configured(tmp_path: Path) -> None:
    unsigned = {k: v for k, v in _action().items() if k != "signature"}
    assert _executor(tmp_path, allow_unsigned=True).handle(unsigned)["status"] == "succeeded"


def test_it_drops_an_action_altered_after_signing(tmp_path: Path) -> None:
    action = _action()
    action["params"] = {"reason": "changed on the way"}
    assert _executor(tmp_path).handle(action)["output"] == "dropped: bad signature"
    assert _ran(tmp_path) == ""


def test_it_drops_an_action_signed_for_another_nodes_token(tmp_path: Path) -> None:
    other = signing.sign(
        {k: v for k, v in _action().items() if k != "signature"},
        signing.key_from_token("flt_node-2-token"),
    )
    assert _executor(tmp_path).handle(other)["output"] == "dropped: bad signature"


def test_it_signs_canonically_whatever_the_key_order() -> None:
    a = {"id": 1, "kind": "cordon_node", "params": {"b": 1, "a": "x"}}
    b = {"params": {"a": "x", "b": 1}, "kind": "cordon_node", "id": 1}
    assert signing.signature(a, KEY) == signing.signature(b, KEY)
    assert signing.verify(signing.sign(a, KEY), KEY)
    assert not signing.verify({**signing.sign(a, KEY), "id": 2}, KEY)


# -- kinds and targets ------------------------------------------------------------------------


def test_it_refuses_a_kind_outside_the_nodes_allowed_kinds_even_with_a_hook(tmp_path: Path) -> None:
    executor = _executor(tmp_path, allowed_kinds=["cordon_node"])
    result = executor.handle(_action(kind="isolate_gpu", target=f"gpu:{GPU}"))
    assert result["status"] == "failed"
    assert result["output"] == (
        "refused: action kind 'isolate_gpu' is not accepted on this node (allowed: cordon_node)"
    )
    assert _ran(tmp_path) == ""


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"target": "node:node-2"}, "is not this node"),
        ({"target": "node-1"}, "must be node:, gpu:, rank: or group:"),
        ({"target": "pod:node-1"}, "must be node:, gpu:, rank: or group:"),
        ({"target": "gpu:GPU-of-another-node", "kind": "isolate_gpu"}, "is not a GPU of this node"),
        ({"target": "group:other", "group": "other", "kind": "restart_group"}, "hosts no ranks"),
        ({"node": "node-2"}, "action is for node 'node-2'"),
        ({"params": {"reason": "x", "node": "node-2"}}, "params.node 'node-2' is not this node"),
        ({"params": {"reason": "x", "gpu": "GPU-other"}}, "params.gpu 'GPU-other' is not a GPU"),
    ],
)
def test_it_refuses_targets_that_are_not_its_own(tmp_path: Path, changes: dict, why: str) -> None:
    executor = _executor(tmp_path)
    executor.observe("g", 4)
    result = executor.handle(_action(**changes))
    assert result["status"] == "failed" and why in result["output"], result
    assert _ran(tmp_path) == ""


def test_it_accepts_its_own_gpu_and_a_group_it_hosts(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    executor.observe("g", 4)
    gpu = executor.handle(_action("a1", kind="isolate_gpu", target=f"gpu:{GPU}"))
    group = executor.handle(_action("a2", kind="restart_group", target="group:g"))
    rank = executor.handle(_action("a3", kind="restart_group", target="rank:g/3"))
    assert [r["status"] for r in (gpu, group, rank)] == ["succeeded"] * 3
    assert _ran(tmp_path).splitlines()[0] == f"gpu:{GPU} g 4 xid 79"


# -- arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"group": "--all"}, "is not a safe name"),
        ({"group": "g; rm -rf /"}, "is not a safe name"),
        ({"generation": "7"}, "must be a non-negative integer"),
        ({"generation": None}, "must be a non-negative integer"),
        ({"generation": True}, "must be a non-negative integer"),
        ({"generation": -1}, "must be a non-negative integer"),
        ({"params": {"reason": "--force"}}, "may not begin with '-'"),
        ({"params": {"reason": "a\nb"}}, "control characters"),
        ({"params": {"Bad-Key": "x"}}, "is not a safe name"),
        ({"params": {"reason": ["x"]}}, "must be a string or number"),
        ({"params": "reason"}, "params must be an object"),
    ],
)
def test_it_refuses_unsafe_hook_arguments(tmp_path: Path, changes: dict, why: str) -> None:
    result = _executor(tmp_path).handle(_action(**changes))
    assert result["status"] == "failed" and why in result["output"], result
    assert _ran(tmp_path) == ""


def test_it_fences_a_group_action_of_generation_zero(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    executor.observe("g", 1)
    result = executor.handle(_action(generation=0))
    assert "older than generation 1" in result["output"]


def test_it_never_runs_the_hook_of_an_action_marked_dry_run(tmp_path: Path) -> None:
    result = _executor(tmp_path).handle(_action(params={"reason": "x", "dry_run": True}))
    assert result["output"].startswith("dry-run: would run")
    assert _ran(tmp_path) == ""


# -- configuration ----------------------------------------------------------------------------


def test_it_reads_the_nodes_action_limits_from_its_config(tmp_path: Path, monkeypatch) -> None:
    import io
    from dataclasses import replace

    from agents.agent import Agent
    from agents.cli import ConfigError, _parser, build_config

    monkeypatch.delenv("FAULTLINE_AGENT_ALLOW_UNSIGNED", raising=False)
    (tmp_path / "agent.toml").write_text(
        'allowed_kinds = ["cordon_node"]\ngpus = ["GPU-1"]\n'
        '[hooks]\ncordon_node = "true"\ndrain_node = "true"\n'
    )
    args = ["run", "--dry-run", "--config", str(tmp_path / "agent.toml")]
    cfg = build_config(_parser().parse_args(args))
    assert (cfg.allowed_kinds, cfg.gpus, cfg.allow_unsigned) == (["cordon_node"], ["GPU-1"], False)
    agent = Agent(replace(cfg, state_dir=tmp_path / "s"), out=io.StringIO())
    assert agent.executor.allowed_kinds == {"cordon_node"}
    assert agent.own_gpus() == {"GPU-1"}
    monkeypatch.setenv("FAULTLINE_AGENT_ALLOW_UNSIGNED", "1")
    assert build_config(_parser().parse_args(args)).allow_unsigned is True
    (tmp_path / "agent.toml").write_text('allowed_kinds = "cordon_node"\n')
    with pytest.raises(ConfigError, match="allowed_kinds must be a list"):
        build_config(_parser().parse_args(args))
