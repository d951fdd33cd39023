"""Accounts and tokens made outside the admin site are audited too: `faultline user create`,
`faultline token create|revoke` (agent tokens, and the node a first token registers), the
demo's password refresh, and deleting a role in the admin. The audit row names who acted and
never holds a password or a token."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from console import actions
from console.models import AuditLog, Membership, Node
from console.roles import role_of
from ingest.auth import issue_token, revoke_tokens

pytestmark = pytest.mark.django_db


def _rows(verb: str) -> list[AuditLog]:
    return list(AuditLog.objects.filter(verb=verb).order_by("id"))


def _no_secret(row: AuditLog, *secrets: str) -> None:
    text = f"{row.reason} {row.data}"
    for secret in secrets:
        assert secret not in text


@pytest.mark.parametrize("role", ["viewer", "operator", "approver", "admin"])
def test_a_user_created_from_the_cli_is_audited_with_role_and_flags(role: str) -> None:
    user = actions.create_user(
        actor="cli", username=f"u-{role}", role=role, password="pw-x-1234567"
    )
    assert role_of(user) == role
    assert user.is_superuser == user.is_staff == (role == "admin")
    (row,) = _rows("user.created")
    assert (row.actor, row.object_type, row.object_id, row.data["role"]) == (
        "cli", "user", str(user.pk), role)  # fmt: skip
    _no_secret(row, "pw-x-1234567")


def test_an_unknown_role_creates_nobody_and_writes_no_row() -> None:
    with pytest.raises(ValueError, match="role must be one of"):
        actions.create_user(actor="cli", username="x", role="root", password="pw-x-1234567")
    assert not get_user_model().objects.filter(username="x").exists()
    assert _rows("user.created") == []


def test_an_agent_token_registers_its_node_once_and_each_token_is_audited() -> None:
    first = issue_token(node_name="gpu-07", actor="cli")
    second = issue_token(node_name="gpu-07", launcher_group="job-1", actor="cli")
    node = Node.objects.get(name="gpu-07")
    assert [(r.actor, r.object_id) for r in _rows("node.registered")] == [("cli", str(node.pk))]
    issued = _rows("agent_token.issued")
    assert [(r.data["prefix"], r.data["launcher_group"]) for r in issued] == [
        (first[:12], ""), (second[:12], "job-1")]  # fmt: skip
    for row in issued:
        _no_secret(row, first, second)

    assert revoke_tokens(node_name="gpu-07", actor="cli") == 2
    (row,) = _rows("agent_token.revoked")
    assert (row.actor, row.object_id, row.data["prefixes"]) == (
        "cli", "gpu-07", sorted([first[:12], second[:12]]))  # fmt: skip
    # Nothing live left: a second revoke changes nothing and writes nothing.
    assert revoke_tokens(node_name="gpu-07", actor="cli") == 0
    assert len(_rows("agent_token.revoked")) == 1


def test_a_refreshed_password_is_audited_without_it(cast: Any) -> None:
    user = cast["operator"]
    actions.set_password(actor="demo", user=user, password="pw-new-98765", now=timezone.now())
    user.refresh_from_db()
    assert user.check_password("pw-new-98765")
    (row,) = _rows("user.password_changed")
    assert row.actor == "demo"
    _no_secret(row, "pw-new-98765")


def test_deleting_a_role_in_the_admin_makes_a_viewer_audited(client: Any, cast: Any) -> None:
    client.force_login(cast["admin"])
    member = Membership.objects.get(user=cast["operator"])
    response = client.post(
        f"/admin/console/membership/{member.pk}/delete/", {"post": "yes"}, follow=True
    )
    assert response.status_code == 200
    assert not Membership.objects.filter(user=cast["operator"]).exists()
    assert role_of(get_user_model().objects.get(pk=cast["operator"].pk)) == "viewer"
    (row,) = _rows("user.role")
    assert (row.actor, row.data) == ("admin", {"before": "operator", "after": "viewer"})
