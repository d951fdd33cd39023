"""Blast radius: a storm of cordons for most of a 10-node pool is held beyond the limit."""

from __future__ import annotations

import pytest

from console.models import AuditLog

pytestmark = pytest.mark.django_db


def test_it_holds_the_cordons_beyond_the_pool_limit(pool, propose):
    outcomes = [propose(f"node:n-{i:02d}") for i in range(8)]
    required = [o.action.approvals_required for o in outcomes]
    # 25 % of 10 nodes allows 2 out at once (20 % fleet-wide also 2): the rest need two.
    assert required == [1, 1, 2, 2, 2, 2, 2, 2]
    held = [o for o in outcomes if any(r.startswith("blocked by blast radius") for r in o.reasons)]
    assert [o.action.target for o in held] == [f"node:n-{i:02d}" for i in range(2, 8)]
    assert all(o.action.escalated for o in held)


def test_it_audits_each_blast_radius_hold(pool, propose):
    ids = [propose(f"node:n-{i:02d}").action.pk for i in range(4)]
    rows = AuditLog.objects.filter(verb="gate.held", reason__startswith="blocked by blast radius")
    assert sorted({int(r.object_id) for r in rows}) == ids[2:]
    pool_rows = rows.filter(reason__contains="in pool a100").order_by("id")
    assert pool_rows.first().reason == (
        "blocked by blast radius: 2 of 10 nodes in pool a100 already quarantined or cordoned "
        "(limit 25 %, 2 nodes)"
    )


def test_it_needs_two_distinct_approvers_above_the_limit(pool, propose, vote):
    first = [propose(f"node:n-{i:02d}").action for i in range(2)]
    for action in first:
        assert vote(action.pk, "approver").action.state == "approved"
    third = propose("node:n-02").action
    after_one = vote(third.pk, "approver")
    assert after_one.action.state == "proposed"
    assert "1 of 2 approvals" in after_one.reasons
    assert vote(third.pk, "approver2").action.state == "approved"


def test_it_counts_a_node_already_cordoned_once(pool, propose):
    pool[5].cordoned = True
    pool[5].save()
    again = propose("node:n-05")
    assert again.action.approvals_required == 1
