"""faultline.sso without a provider: the role map, who may be matched, demotion, audit.

tests/system/test_browser_sso.py runs the whole sign-in against a real OpenID provider.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import SuspiciousOperation

from faultline.sso_config import parse_role_map

pytestmark = pytest.mark.django_db


@pytest.fixture
def backend(settings: Any) -> Any:
    settings.OIDC_ROLE_MAP = {"sre": "operator", "sre-leads": "approver", "root": "admin"}
    settings.OIDC_DEFAULT_ROLE = ""
    settings.OIDC_GROUPS_CLAIM = "groups"
    settings.OIDC_USERNAME_CLAIM = "preferred_username"
    settings.OIDC_ISSUER = "https://idp.example.test"
    for name in ("OIDC_OP_TOKEN_ENDPOINT", "OIDC_OP_USER_ENDPOINT", "OIDC_OP_JWKS_ENDPOINT"):
        setattr(settings, name, "https://idp.example.test/x")
    settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET = "c", "s"
    from faultline.sso import FaultlineOIDCBackend

    return FaultlineOIDCBackend()


def claims(groups: list[str], user: str = "alice") -> dict[str, Any]:
    return {"sub": f"sub-{user}", "preferred_username": user, "groups": groups}


def test_it_parses_the_role_map_and_names_a_bad_item() -> None:
    assert parse_role_map(["a=viewer", " ops team = operator "]) == {
        "a": "viewer",
        "ops team": "operator",
    }
    with pytest.raises(ValueError, match="'sre=boss' must be GROUP=ROLE"):
        parse_role_map(["sre=boss"])


def test_it_gives_the_highest_role_any_group_maps_to(backend: Any) -> None:
    from faultline.sso import role_for

    assert role_for(claims(["sre", "sre-leads", "unrelated"])) == "approver"
    assert role_for(claims(["unrelated"])) is None
    assert backend.verify_claims(claims(["unrelated"])) is False


def test_it_creates_the_user_with_its_role_and_audits_the_identity(backend: Any) -> None:
    from console.models import AuditLog
    from console.roles import role_of

    user = backend.create_user(claims(["sre"]))
    assert user.username == "sso:alice"
    assert not user.has_usable_password()
    assert role_of(user) == "operator"
    row = AuditLog.objects.get(verb="sso_login")
    assert row.actor == "sso:alice"
    assert row.data["issuer"] == "https://idp.example.test"
    assert row.data["sub"] == "sub-alice"


def test_it_demotes_at_the_next_login_when_the_idp_groups_change(backend: Any) -> None:
    from console.roles import role_of

    user = backend.create_user(claims(["root"]))
    assert (role_of(user), user.is_superuser) == ("admin", True)
    user = backend.update_user(user, claims(["sre"]))
    user.refresh_from_db()
    assert (role_of(user), user.is_superuser, user.is_staff) == ("operator", False, False)


def test_it_never_matches_a_local_account_of_the_same_name(backend: Any) -> None:
    from console.accounts import create_user

    create_user(username="sso:alice", role="admin", password="pw-local-123")
    assert backend.filter_users_by_claims(claims(["sre"])) == []
    with pytest.raises(SuspiciousOperation):  # refused at sign-in, not a second "sso:alice"
        backend.create_user(claims(["sre"]))
    sso_made = backend.create_user(claims(["sre"], user="bob"))
    assert backend.filter_users_by_claims(claims(["sre"], user="bob")) == [sso_made]
