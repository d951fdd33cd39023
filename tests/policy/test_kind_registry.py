"""A kind added to agents/actions_contract.SPECS alone is one the service's pure side knows:
the lifecycle names it, the gates treat it as the kinds of its shape (target and effect),
the dry run describes it, and the remediation policy may propose and route it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agents import actions_contract as contract
from console.policy import remediation as rp
from console.policy.dryrun import dry_run
from console.policy.gates import check_dispatch, evaluate_proposal
from console.policy.inputs import BreakerState, Policy, RecentActions
from console.policy.lifecycle import ActionKind, ActionState
from tests.policy.factories import NOW, automatic, fleet, history, node, records

NEW = "fence_node"


def _spec(target: contract.Target, effect: contract.Effect, **kw: Any) -> contract.KindSpec:
    return contract.KindSpec(
        NEW,
        "fence",
        target,
        effect,
        (contract.Param("node", False, "node"),),
        "a site's own kind",
        "the fence holds {target}",
        marks="cordoned" if (target, effect) == ("node", "take_out") else "",
        **kw,
    )


@pytest.fixture
def add(monkeypatch: pytest.MonkeyPatch):
    def adding(spec: contract.KindSpec) -> contract.KindSpec:
        monkeypatch.setitem(contract.SPECS, spec.name, spec)
        return spec

    return adding


def test_the_lifecycle_names_a_new_kind(add) -> None:
    add(_spec("node", "take_out"))
    assert ActionKind(NEW) == NEW and ActionKind.FENCE_NODE == NEW
    assert NEW in [k.value for k in ActionKind]
    assert Policy.from_dict({"auto_approve": {NEW: ["xid"]}}).auto_approves(ActionKind(NEW), "xid")


def test_an_unknown_kind_is_still_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r'unknown action kind "fence_node"; known: .*cordon_node'):
        ActionKind(NEW)
    with pytest.raises(AttributeError):
        _ = ActionKind.FENCE_NODE


# Each shape the gates tell apart, and a kind that has it today.
SHAPES = [
    ("node", "take_out", contract.CORDON_NODE),
    ("gpu", "take_out", contract.ISOLATE_GPU),
    ("node", "put_back", contract.UNCORDON_NODE),
    ("gpu", "put_back", contract.RELEASE_GPU),
    ("group", "restart", contract.RESTART_GROUP),
    ("group", "none", contract.ROLLBACK_MODEL),
]
TARGETS = {"node": "node:a100-00", "gpu": "gpu:a100-00/gpu0", "group": "group:llama"}


def _request(kind: str, target: str, **kw: Any) -> Any:
    prefix, _, name = target.partition(":")
    where: dict[str, Any] = {"node": "a100-00"}
    if prefix == "gpu":
        where["gpu"] = name
    if prefix == "group":
        where = {"group": name, "generation": 7}
    return automatic(kind=ActionKind(kind), target=target, **where, **kw)


def _said(decision: Any, kind: str) -> tuple[Any, ...]:
    return (
        decision.allowed,
        decision.needs_human,
        decision.approvals_required,
        decision.refused,
        decision.escalate,
        tuple(r.replace(kind, "<kind>") for r in decision.reasons),
    )


@pytest.mark.parametrize(("target", "effect", "twin"), SHAPES)
@pytest.mark.parametrize(
    "situation",
    [
        {},  # room to spare
        {"cordoned": [node("a100", i) for i in range(1, 5)]},  # the pool at its node limit
        {"isolated_gpus": [f"a100-0{i}/gpu0" for i in range(1, 10)]},  # at the GPU limit
        {"taken_out_by": "scheduler"},  # someone else's
        {"auto_restart_safe": False},  # diagnosis says no restart
    ],
)
def test_the_gates_treat_a_new_kind_as_the_kinds_of_its_shape(
    add, target: contract.Target, effect: contract.Effect, twin: str, situation: dict[str, Any]
) -> None:
    add(_spec(target, effect))
    state = fleet(
        {"a100": 16, "h100": 48},
        cordoned=situation.get("cordoned", ()),
        isolated_gpus=situation.get("isolated_gpus", ()),
    )
    extra = {k: v for k, v in situation.items() if k in ("taken_out_by", "auto_restart_safe")}
    seen = []
    for kind in (twin, NEW):
        policy = Policy.from_dict({"auto_approve": {kind: ["xid"]}})
        request = _request(kind, TARGETS[target], **extra)
        past = history(records(2))
        proposal = evaluate_proposal(
            request, policy=policy, fleet=state, history=past, breaker=BreakerState(), now=NOW
        )
        dispatch = check_dispatch(
            replace(request, state=ActionState.APPROVED, generation=6),
            (),
            policy=policy,
            fleet=state,
            history=past,
            breaker=BreakerState(),
            now=NOW,
        )
        seen.append((_said(proposal, kind), _said(dispatch, kind)))
    assert seen[0] == seen[1]


def test_the_dry_run_describes_a_new_kind_in_its_own_words(add) -> None:
    add(_spec("node", "take_out"))
    result = dry_run(
        _request(NEW, "node:a100-00"),
        stage="proposal",
        policy=Policy.from_dict({"auto_approve": {NEW: ["xid"]}}),
        fleet=fleet({"a100": 16}),
        history=RecentActions(),
        breaker=BreakerState(),
        now=NOW,
    )
    assert result.effects[1:] == (
        "would auto-approve fence_node on node:a100-00",
        "fence_node: the fence holds node:a100-00",
        "pool a100 would have 1 of 16 nodes out (limit 4)",
    )


def _xid(**kw: Any) -> rp.Cause:
    """An Xid on node n7 that takes the whole node out (no GPU named)."""
    return rp.Cause(
        kind="xid",
        subject="node:n7",
        finding="hardware:n7@1",
        summary="xid 79",
        evidence={"code": 79},
        node="n7",
        **kw,
    )


@pytest.mark.parametrize("scheduler", contract.BACKENDS)
def test_the_policy_takes_a_node_out_by_a_new_kind_where_the_backend_runs_it(
    add, scheduler: str
) -> None:
    add(_spec("node", "take_out", backends=frozenset({"slurm"}), controller=True))
    assert NEW in rp.node_take_out_kinds()
    policy = rp.RemediationPolicy.from_dict(
        {"default": {"scheduler": scheduler, "take_out": NEW, "controller": "ctl"}}
    )
    plan = rp.plan(_xid(), policy)
    # Kubernetes does not run it: the fallback is cordon_node, as for any kind it cannot run.
    want = NEW if scheduler == "slurm" else contract.CORDON_NODE
    assert [(p.kind, p.target) for p in plan.proposals] == [(want, "node:n7")]
    silent = rp.plan(_xid(reporting=False, controller_reporting=True), policy)
    assert [p.executor for p in silent.proposals] == ["ctl"]


def test_the_policy_refuses_a_take_out_that_is_no_node_take_out(add) -> None:
    add(_spec("node", "put_back"))
    with pytest.raises(rp.PolicyError, match=r"take_out must be one of cordon_node, drain_node"):
        rp.RemediationPolicy.from_dict({"default": {"take_out": NEW}})


@pytest.mark.parametrize("controller", [True, False])
def test_the_policy_routes_a_new_kind_to_the_controller_only_as_its_spec_says(
    add, controller: bool
) -> None:
    add(_spec("node", "take_out", controller=controller))
    pool = rp.PoolPolicy(controller="ctl")
    executor, wait = rp.route(NEW, "n7", pool, reporting=False, controller_reporting=True)
    assert (executor, wait == "") == (("ctl", True) if controller else (None, False))
