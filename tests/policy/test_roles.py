from __future__ import annotations

import pytest

from console.policy.roles import Permission, Role, can


@pytest.mark.parametrize("permission", list(Permission))
def test_it_lets_admin_do_everything(permission: Permission) -> None:
    assert can(Role.ADMIN, permission)


def test_it_lets_viewer_only_view() -> None:
    allowed = [p for p in Permission if can("viewer", p)]
    assert allowed == [Permission.VIEW]


def test_it_lets_operator_acknowledge_and_propose_but_not_approve() -> None:
    assert can("operator", "acknowledge")
    assert can("operator", "propose")
    assert not can("operator", "approve")


def test_it_lets_approver_approve_and_reject_but_not_close_the_breaker() -> None:
    assert can("approver", "approve")
    assert can("approver", "reject")
    assert not can("approver", "close_breaker")
    assert not can("approver", "manage_policies")


def test_it_refuses_unknown_roles_and_permissions() -> None:
    assert not can("superuser", "view")
    assert not can(None, "view")
    assert not can("admin", "launch_missiles")


def test_it_reads_role_names_case_insensitively() -> None:
    assert can(" Approver ", "approve")


def test_the_docs_table_is_the_code_table() -> None:
    import re
    from pathlib import Path

    from console.policy.roles import MINIMUM_ROLE

    text = Path(__file__).resolve().parents[2].joinpath("docs/safety.md").read_text()
    section = text.split("## Roles\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (\w+) \|", section, flags=re.MULTILINE)
    assert dict(rows) == {p.value: r.value for p, r in MINIMUM_ROLE.items()}


def test_an_owner_needs_less_than_anyone_else_to_cancel() -> None:
    assert can("operator", "cancel_any", own=True)
    assert not can("operator", "cancel_any")
    assert not can("viewer", "cancel_any", own=True)
    assert can("admin", "cancel_any")
