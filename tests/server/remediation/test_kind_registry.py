"""A kind added to agents/actions_contract.SPECS alone goes the whole way through the
service: proposed on the target its spec names, gated and previewed, dispatched in the
agent's shape, and its success marks the node as its spec says. The choices the console
stores are the specs'."""

from __future__ import annotations

from typing import Any

import pytest

from agents import actions_contract as contract
from console import actions
from console.actions.errors import RemediationError
from console.choices import ACTION_KINDS
from console.models import Action, Node

pytestmark = pytest.mark.django_db

FENCE = contract.KindSpec(
    "fence_node",
    "fence node",
    "node",
    "take_out",
    (contract.Param("node", False, "node"), contract.Param("reason", False, "why")),
    "keep the node out through the site's own fencing",
    "node {node} is fenced",
    inverse=contract.UNCORDON_NODE,
    marks="quarantined",
    controller=True,
)


def test_the_stored_choices_are_the_specs() -> None:
    assert [(s.name, s.label) for s in contract.SPECS.values()] == ACTION_KINDS
    assert {k for k, _ in Action._meta.get_field("kind").choices} == set(contract.SPECS)


@pytest.fixture
def fence(monkeypatch: pytest.MonkeyPatch) -> contract.KindSpec:
    monkeypatch.setitem(contract.SPECS, FENCE.name, FENCE)
    return FENCE


def test_a_new_kind_goes_from_proposal_to_its_effect(
    fence: contract.KindSpec, pool: list[Node], propose: Any, vote: Any, now: Any
) -> None:
    action = propose("node:n-04", kind=fence.name).action
    assert action.params == {"node": "n-04"}  # filled from its spec's params
    assert "fence_node: node n-04 is fenced" in action.preview
    approved = vote(action.pk, "approver").action
    assert approved.state == "approved"
    (payload,) = actions.dispatch_for_node(node=pool[4], now=now)
    assert (payload["kind"], payload["target"]) == (fence.name, "node:n-04")
    actions.record_action_result(
        action_id=action.pk,
        node=pool[4],
        status="succeeded",
        exit_code=0,
        output="fenced",
        now=now,
        outcome={"state": "applied"},
    )
    node = Node.objects.get(pk=pool[4].pk)
    assert node.quarantined and not node.cordoned  # the mark its spec names
    assert node.taken_out_by == "operator"


@pytest.mark.parametrize("target", ["gpu:GPU-0004", "group:llama", "n-04"])
def test_a_new_kind_is_refused_on_a_target_its_spec_does_not_name(
    fence: contract.KindSpec, pool: list[Node], propose: Any, target: str
) -> None:
    with pytest.raises(RemediationError, match='fence_node needs a target like "node:node-17"'):
        propose(target, kind=fence.name)


def test_a_new_kind_counts_against_the_node_blast_radius(
    fence: contract.KindSpec, pool: list[Node], propose: Any
) -> None:
    # Pending node take-outs count: the default limit lets 2 of the pool's 10 go.
    for i in range(2):
        assert propose(f"node:n-0{i}", kind=fence.name).action.approvals_required == 1
    held = propose("node:n-02", kind=contract.CORDON_NODE).action
    assert held.approvals_required == 2
    assert any("blast radius" in r for r in held.gate_reasons), held.gate_reasons
