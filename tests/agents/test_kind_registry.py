"""An action kind is its spec (agents/actions_contract.SPECS) and nothing else.

Each spec has what every reader needs, the backends run what their specs say, and a kind
added to SPECS alone is one the agent's executor accepts, routes and runs (through a hook,
for another node as a controller) with no other edit. The service's side:
tests/policy/test_kind_registry.py and tests/server/remediation/test_kind_registry.py.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agents import actions_contract as contract
from agents.executor import Executor
from agents.schedulers import backend_named

SAFETY = Path(__file__).resolve().parents[2] / "docs" / "safety.md"
NODE = "gpu-node-017"
GPU = "GPU-8a7c3f2e-1b4d-4e6f-9a0b-c1d2e3f4a5b6"
SAMPLE_TARGET = {
    "node": f"node:{NODE}",
    "gpu": f"gpu:{GPU}",
    "rank": "rank:llama/3",
    "group": "group:llama",
    "any": f"node:{NODE}",
}

# A kind as a site would add it: one spec, nothing else edited.
FENCE = contract.KindSpec(
    "fence_node",
    "fence node",
    "node",
    "take_out",
    (contract.Param("node", False, "scheduler node name"),),
    "keep the node out through the site's own fencing",
    "node {node} is fenced",
    inverse=contract.UNCORDON_NODE,
    marks="cordoned",
    controller=True,
)


@pytest.mark.parametrize("name", list(contract.SPECS))
def test_every_kind_has_what_each_reader_needs(name: str) -> None:
    spec = contract.SPECS[name]
    assert spec.name == name and spec.label and spec.help
    assert spec.target in (*contract.TARGETS, "any")
    target = SAMPLE_TARGET[spec.target]
    sentence = spec.preview_text(target)  # every placeholder is one it knows
    assert target.partition(":")[2] in sentence, "the preview names what it acts on"
    assert spec.backends <= set(contract.BACKENDS)
    if spec.takes_out and spec.agent:
        back = contract.SPECS[spec.inverse]  # what undoes it, on the same kind of target
        assert back.effect == "put_back" and back.target == spec.target, name
        assert back.controller == spec.controller, "a controller that takes out puts back"
    if spec.effect == "put_back":
        assert any(s.inverse == name for s in contract.SPECS.values()), f"{name} undoes nothing"
    assert bool(spec.marks) == spec.node_out, "a node take-out says what it marks"
    if spec.controller:
        assert spec.target == "node" and spec.agent, "a controller acts on a node by its name"
    if not spec.agent:
        assert not spec.backends and not spec.controller and name not in contract.KINDS
    names = {p.name for p in spec.params}
    if spec.agent and spec.target in ("node", "gpu"):
        assert spec.target in names, "the backends act on params.node / params.gpu"
    if spec.agent and spec.target == "gpu":
        assert "node" in names


@pytest.mark.parametrize("scheduler", contract.BACKENDS)
def test_each_backend_runs_what_the_specs_say_and_nothing_else(scheduler: str) -> None:
    backend = backend_named(scheduler)
    assert backend is not None and backend.kinds == contract.backend_kinds(scheduler)
    for kind in contract.KINDS:
        action = {
            "id": 1,
            "kind": kind,
            "target": f"node:{NODE}",
            "params": {"node": NODE, "gpu": GPU, "job": "4242", "reason": "r"},
        }
        planned = backend.plan(action, node=NODE)
        assert bool(planned) == (kind in backend.kinds), (scheduler, kind, planned)


def test_the_derived_sets_are_the_specs() -> None:
    specs = contract.SPECS.values()
    assert set(contract.KINDS) == {s.name for s in specs if s.agent}
    assert {s.name for s in specs if s.controller} == contract.CONTROLLER_KINDS
    assert set(contract.ALIASES.values()) <= set(contract.KINDS)


def test_the_documented_table_is_the_specs() -> None:
    """docs/safety.md "Action kinds" lists each spec's target, effect, inverse, mark,
    controller and backends, in the specs' order."""
    section = SAFETY.read_text().split("## Action kinds", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| `")]
    documented = [tuple(cell.strip() for cell in row) for row in rows]
    expected = [
        (
            f"`{s.name}`" + ("" if s.agent else " (service's own)"),
            s.target,
            s.effect,
            f"`{s.inverse}`" if s.inverse else "—",
            s.marks or "—",
            "yes" if s.controller else "no",
            ", ".join(b for b in contract.BACKENDS if b in s.backends) or "— (a hook)",
        )
        for s in contract.SPECS.values()
    ]
    assert documented == expected
    assert not re.search(r"CONTROLLER_KINDS|BACKEND_KINDS", SAFETY.read_text())


@pytest.fixture
def fence(monkeypatch: pytest.MonkeyPatch) -> contract.KindSpec:
    monkeypatch.setitem(contract.SPECS, FENCE.name, FENCE)
    return FENCE


def _action(n: int, kind: str, node: str = NODE, **params: Any) -> dict[str, Any]:
    return {
        "id": n,
        "kind": kind,
        "target": f"node:{node}",
        "group": None,
        "generation": None,
        "params": {"node": node, "reason": "xid 79", "dry_run": False, **params},
    }


def test_a_kind_added_to_the_specs_is_in_the_contract(
    fence: contract.KindSpec, caplog: pytest.LogCaptureFixture
) -> None:
    assert contract.KINDS[fence.name] is fence and fence.name in contract.controller_kinds()
    assert contract.problems(fence.name, {"node": NODE}, f"node:{NODE}") == []
    assert contract.problems(fence.name, {"force": True}) == [
        "fence_node does not take params.force"
    ]
    with caplog.at_level(logging.WARNING):
        assert contract.normalize_hooks({fence.name: "true"}) == {fence.name: "true"}
    assert "not an action kind" not in caplog.text


def test_the_executor_runs_a_new_kind_through_its_hook(
    fence: contract.KindSpec, tmp_path: Path
) -> None:
    executor = Executor(
        tmp_path, node=NODE, hooks={fence.name: "echo fenced {node}"}, allow_unsigned=True
    )
    assert fence.name in executor.allowed_kinds
    result = executor.handle(_action(1, fence.name))
    assert result is not None and result["status"] == "succeeded", result
    assert result["output"].strip() == f"fenced {NODE}"


def test_a_backend_answers_a_new_kind_unsupported_and_names_the_hook(
    fence: contract.KindSpec, tmp_path: Path
) -> None:
    executor = Executor(tmp_path, node=NODE, hooks={}, scheduler="slurm", allow_unsigned=True)
    result = executor.handle(_action(1, fence.name))
    assert result is not None and result["outcome"]["state"] == "unsupported", result
    assert f"[hooks] {fence.name}" in result["output"]


@pytest.mark.parametrize("controller", [True, False])
def test_a_controller_runs_a_new_kind_for_another_node_as_its_spec_says(
    controller: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(contract.SPECS, FENCE.name, replace(FENCE, controller=controller))
    executor = Executor(
        tmp_path,
        node="slurm-ctl",
        hooks={FENCE.name: "echo fenced {node}"},
        controller_nodes=["gpu-node-*"],
        allow_unsigned=True,
    )
    result = executor.handle(_action(1, FENCE.name, node=NODE))
    assert result is not None
    if controller:
        assert result["status"] == "succeeded" and NODE in result["output"], result
    else:
        assert result["status"] == "failed", result
        assert "a controller runs only" in result["output"]
        assert FENCE.name not in result["output"].partition("runs only")[2]
