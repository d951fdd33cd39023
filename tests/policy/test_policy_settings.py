from __future__ import annotations

import pytest

from console.policy.inputs import Limit, Policy, PolicyError
from console.policy.lifecycle import ActionKind


def test_it_has_auto_approval_off_by_default() -> None:
    policy = Policy.from_dict({})
    assert not any(policy.auto_approves(k, "xid:79") for k in ActionKind)


def test_it_reads_limits_counts_and_auto_approval_from_a_dict() -> None:
    policy = Policy.from_dict(
        {
            "max_nodes_out_per_pool": "10%",
            "max_nodes_out_fleet": 3,
            "max_per_target": 4,
            "auto_approve": {"cordon_node": ["xid:79"]},
        }
    )
    assert policy.max_nodes_out_per_pool == Limit(percent=10)
    assert policy.max_nodes_out_fleet == Limit(count=3)
    assert policy.max_per_target == 4
    assert policy.auto_approves(ActionKind.CORDON_NODE, "xid:79")
    assert not policy.auto_approves(ActionKind.CORDON_NODE, "xid:48")


def test_it_matches_a_trigger_family() -> None:
    policy = Policy.from_dict({"auto_approve": {"cordon_node": ["xid"]}})
    assert policy.auto_approves(ActionKind.CORDON_NODE, "xid:13")
    assert not policy.auto_approves(ActionKind.CORDON_NODE, "ecc_dbe")
    assert not policy.auto_approves(ActionKind.CORDON_NODE, None)


def test_it_refuses_unknown_settings() -> None:
    with pytest.raises(PolicyError, match="unknown policy setting"):
        Policy.from_dict({"max_nodes_out": "25%"})


@pytest.mark.parametrize("bad", ["lots", "150%", -1, True, 2.5])
def test_it_refuses_a_limit_that_is_not_a_count_or_percent(bad: object) -> None:
    with pytest.raises(PolicyError, match="max_nodes_out_per_pool"):
        Policy.from_dict({"max_nodes_out_per_pool": bad})


def test_it_refuses_an_unknown_kind_in_auto_approval() -> None:
    with pytest.raises(PolicyError, match='unknown action kind "reboot_node"'):
        Policy.from_dict({"auto_approve": {"reboot_node": ["xid"]}})


def test_it_refuses_fewer_approvers_above_the_limit_than_below() -> None:
    with pytest.raises(PolicyError, match="approvals_above_limit"):
        Policy.from_dict({"approvals_required": 2, "approvals_above_limit": 1})


def test_it_floors_percent_limits() -> None:
    assert Limit(percent=25).allowed(16) == 4
    assert Limit(percent=25).allowed(6) == 1
    assert Limit(percent=25).allowed(3) == 0
