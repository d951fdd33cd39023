"""The remediation policy: root cause -> proposals or a page, per pool (pure)."""

from __future__ import annotations

import pytest

from agents import actions_contract as contract
from console.policy.inputs import PolicyError
from console.policy.remediation import (
    Cause,
    OpenProposal,
    RemediationPolicy,
    plan,
    withdrawals,
)

SAFE = {
    "auto_restart_safe": True,
    "reason": "restart from checkpoint c7 without n1",
    "checkpoint": "c7",
}


def xid(**over: object) -> Cause:
    base = dict(
        kind="xid",
        subject="gpu:GPU-1",
        finding="fp-xid",
        summary="Xid 79 on GPU-1",
        evidence={"code": 79, "takes_gpu_out": True, "node": "n1", "gpu": "GPU-1"},
        recovery=SAFE,
        pool="a100",
        node="n1",
        gpu="GPU-1",
        group="train",
        job="4242",
        incident=9,
    )
    base.update(over)
    return Cause(**base)  # type: ignore[arg-type]  # the overrides are Cause fields


def test_it_drains_the_node_on_slurm_and_restarts_the_job_without_it() -> None:
    out = plan(xid(), RemediationPolicy())
    kinds = [(p.kind, p.target, dict(p.params)) for p in out.proposals]
    assert kinds == [
        (contract.DRAIN_NODE, "node:n1", {"node": "n1"}),
        (contract.RESTART_GROUP, "group:train", {"job": "4242"}),
    ]
    assert out.proposals[0].trigger == "xid:79"
    assert out.proposals[0].evidence["code"] == 79
    assert "without n1" in out.proposals[1].reason
    assert out.pages == ()
    for p in out.proposals:
        assert contract.problems(p.kind, dict(p.params), p.target) == []


def test_it_isolates_only_the_gpu_where_the_scheduler_can() -> None:
    pol = RemediationPolicy.from_dict({"pools": {"a100": {"scheduler": "kubernetes"}}})
    out = plan(xid(), pol)
    assert out.proposals[0].kind == contract.ISOLATE_GPU
    assert out.proposals[0].target == "gpu:GPU-1"
    assert out.proposals[0].params == {"gpu": "GPU-1", "node": "n1"}


def test_it_takes_the_whole_node_for_a_lost_gpu() -> None:
    pol = RemediationPolicy.from_dict({"default": {"scheduler": "kubernetes"}})
    out = plan(xid(kind="gpu_lost", evidence={"node": "n1"}), pol)
    assert out.proposals[0].kind == contract.DRAIN_NODE


def test_it_takes_nothing_out_for_an_application_xid() -> None:
    out = plan(xid(evidence={"code": 13, "takes_gpu_out": False}), RemediationPolicy())
    assert out.proposals == ()


@pytest.mark.parametrize(
    "kind",
    ["collective_mismatch", "nan_loss", "checkpoint_partial", "split_brain", "retry_storm"],
)
def test_it_pages_a_human_and_never_restarts_when_recovery_hurts(kind: str) -> None:
    advice = {"auto_restart_safe": False, "reason": f"{kind}: a human must look"}
    out = plan(xid(kind=kind, recovery=advice, gpu=None, evidence={}), RemediationPolicy())
    assert out.proposals == ()
    assert len(out.pages) == 1
    assert kind in out.pages[0].reason and "a human must look" in out.pages[0].reason


def test_it_pages_for_a_deterministic_oom_but_not_for_a_safe_one() -> None:
    unsafe = {"auto_restart_safe": False, "reason": "deterministic OOM: step 40"}
    assert plan(xid(kind="oom", recovery=unsafe, evidence={}), RemediationPolicy()).pages
    assert plan(xid(kind="oom", recovery=SAFE, evidence={}), RemediationPolicy()).pages == ()


def test_it_does_not_restart_without_a_checkpoint_or_a_job_id() -> None:
    no_ckpt = {"auto_restart_safe": False, "reason": "no committed, checksummed checkpoint"}
    out = plan(xid(recovery=no_ckpt), RemediationPolicy())
    assert [p.kind for p in out.proposals] == [contract.DRAIN_NODE]
    assert "no committed" in out.pages[0].reason
    out = plan(xid(job=None), RemediationPolicy())
    assert [p.kind for p in out.proposals] == [contract.DRAIN_NODE]
    assert any("job id" in n for n in out.notes)


def test_it_drains_a_stale_serving_worker() -> None:
    cause = xid(kind="stale_version", subject="worker:s/w1", recovery={"auto_restart_safe": False})
    out = plan(cause, RemediationPolicy())
    assert [(p.kind, p.target) for p in out.proposals] == [(contract.DRAIN_NODE, "node:n1")]
    assert out.pages == ()


def test_it_proposes_once_per_kind_and_target() -> None:
    out = plan(xid(), RemediationPolicy(), open_keys=[(contract.DRAIN_NODE, "node:n1")])
    assert [p.kind for p in out.proposals] == [contract.RESTART_GROUP]
    assert any("already proposed" in n for n in out.notes)


def test_it_uses_the_pools_take_out_kind() -> None:
    pol = RemediationPolicy.from_dict({"pools": {"a100": {"take_out": "cordon_node"}}})
    assert plan(xid(), pol).proposals[0].kind == contract.CORDON_NODE
    assert plan(xid(pool="h100"), pol).proposals[0].kind == contract.DRAIN_NODE


def test_it_withdraws_only_the_policys_proposals_whose_finding_resolved() -> None:
    open_ = [
        OpenProposal(1, "drain_node", "node:n1", "fp-gone"),
        OpenProposal(2, "drain_node", "node:n2", "fp-live"),
        OpenProposal(3, "drain_node", "node:n3", "fp-gone", rule=""),
    ]
    assert withdrawals(open_, {"fp-live"}) == [1]


@pytest.mark.parametrize(
    "data",
    [
        {"pool": {}},
        {"default": {"scheduler": "pbs"}},
        {"default": {"take_out": "isolate_gpu"}},
        {"pools": {"x": {"isolate_gpu": "yes"}}},
        {"pools": {"x": {"bogus": 1}}},
    ],
)
def test_it_refuses_bad_settings(data: dict[str, object]) -> None:
    with pytest.raises(PolicyError):
        RemediationPolicy.from_dict(data)


def test_it_does_not_repeat_what_already_happened_for_a_lingering_fault() -> None:
    out = plan(xid(node_out=True, restarted=True), RemediationPolicy())
    assert out.proposals == ()
    assert any("already out of service" in n for n in out.notes)
    assert any("already restarted" in n for n in out.notes)


def test_a_silent_nodes_action_runs_on_the_pools_controller_and_says_why_it_waits() -> None:
    from console.policy.remediation import PoolPolicy, route

    none = PoolPolicy()
    ctl = PoolPolicy(controller="slurmctl-01")
    kw = {"pool_name": "a100"}
    assert route(
        contract.DRAIN_NODE, "n1", none, reporting=True, controller_reporting=False, **kw
    ) == (
        None,
        "",
    )
    executor, why = route(
        contract.DRAIN_NODE, "n1", none, reporting=False, controller_reporting=False, **kw
    )
    assert executor is None and "pool a100 names no controller agent" in why
    assert route(
        contract.CORDON_NODE, "n1", ctl, reporting=False, controller_reporting=True, **kw
    ) == ("slurmctl-01", "")
    executor, why = route(
        contract.CORDON_NODE, "n1", ctl, reporting=False, controller_reporting=False, **kw
    )
    assert executor == "slurmctl-01" and "controller agent slurmctl-01 is silent" in why
    executor, why = route(
        contract.ISOLATE_GPU, "n1", ctl, reporting=False, controller_reporting=True, **kw
    )
    assert executor is None and "only the node's own agent runs it" in why
    executor, why = route(
        contract.CORDON_NODE, "slurmctl-01", ctl, reporting=False, controller_reporting=False
    )
    assert executor is None and "is the silent node itself" in why


def test_a_silent_node_with_a_gpu_fault_is_drained_not_isolated_where_isolation_needs_it() -> None:
    """Only a node's own agent names its GPUs: a silent node's GPU fault takes the node."""
    pol = RemediationPolicy.from_dict(
        {"pools": {"a100": {"scheduler": "kubernetes", "controller": "ctl"}}}
    )
    out = plan(xid(reporting=False, controller_reporting=True, group=None), pol)
    (p,) = out.proposals
    assert (p.kind, p.target, p.executor) == (contract.DRAIN_NODE, "node:n1", "ctl")


def test_a_hardware_fault_of_a_serving_group_drains_and_never_restarts() -> None:
    pol = RemediationPolicy.from_dict({"pools": {"a100": {"scheduler": "kubernetes"}}})
    out = plan(xid(placement="serving", group="serve"), pol)
    assert [p.kind for p in out.proposals] == [contract.DRAIN_NODE]
    assert any("drained, not restarted" in n for n in out.notes)


@pytest.mark.parametrize("value", [7, "-gpu", "a b", "x" * 200])
def test_it_refuses_a_controller_that_is_not_one_node_name(value: object) -> None:
    with pytest.raises(PolicyError, match="controller must be the node name"):
        RemediationPolicy.from_dict({"default": {"controller": value}})
