"""faultline.sso without a provider: the role map, who may be matched, demotion, audit.

tests/system/test_browser_sso.py runs the whole sign-in against a real OpenID provider.
"""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
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
    return {"iss": "https://idp.example.test", "sub": f"sub-{user}",
            "preferred_username": user, "groups": groups}  # fmt: skip


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
    from console.actions import create_user
    from console.roles import role_of

    local = create_user(actor="test", username="sso:alice", role="admin", password="pw-local-123")
    assert backend.filter_users_by_claims(claims(["sre"])) == []
    # The identity gets an account of its own, told apart from the local one's name.
    made = backend.create_user(claims(["sre"]))
    assert made.pk != local.pk and made.username.startswith("sso:alice~")
    assert backend.filter_users_by_claims(claims(["sre"])) == [made]
    local.refresh_from_db()
    assert (role_of(local), local.has_usable_password()) == ("admin", True)
    sso_made = backend.create_user(claims(["sre"], user="bob"))
    assert backend.filter_users_by_claims(claims(["sre"], user="bob")) == [sso_made]


# -- identity: (issuer, sub), never a name or an email -------------------------------------

ISSUER = "https://idp.example.test"


def sign_in(backend: Any, monkeypatch: pytest.MonkeyPatch, payload: dict[str, Any],
            userinfo: dict[str, Any] | None = None) -> Any:  # fmt: skip
    """The library's get_or_create_user after a verified ID token, userinfo stubbed."""
    from mozilla_django_oidc.auth import OIDCAuthenticationBackend

    monkeypatch.setattr(OIDCAuthenticationBackend, "get_userinfo",
                        lambda self, *a: dict(userinfo or {}))  # fmt: skip
    return backend.get_or_create_user("access", "id-token", {"iss": ISSUER, **payload})


def test_one_subject_is_one_account_whatever_username_it_claims(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = sign_in(backend, monkeypatch, {"sub": "s-1", "preferred_username": "alice",
                                           "groups": ["sre-leads"]})  # fmt: skip
    again = sign_in(backend, monkeypatch, {"sub": "s-1", "preferred_username": "alice.smith",
                                           "groups": ["sre-leads"]})  # fmt: skip
    assert again.pk == first.pk and again.username == "sso:alice"
    from django.contrib.auth import get_user_model

    assert get_user_model().objects.filter(username__startswith="sso:").count() == 1


def test_one_person_casts_one_vote_whatever_names_they_sign_in_under(
    backend: Any, monkeypatch: pytest.MonkeyPatch, cast: Any
) -> None:
    from django.utils import timezone

    from console import actions
    from console.models import Action, Node
    from console.policy.votes import VoteRefused

    now = timezone.now()
    for i in range(10):
        Node.objects.create(name=f"n-{i:02d}", pool="a100")
    claims = {"sub": "s-lead", "groups": ["sre-leads"]}
    as_alice = sign_in(backend, monkeypatch, {**claims, "preferred_username": "alice"})
    as_al = sign_in(backend, monkeypatch, {**claims, "preferred_username": "al"})
    action = actions.propose_action(kind="drain_node", target="node:n-03", reason="xid 79",
                                    actor=cast["operator"], now=now).action  # fmt: skip
    Action.objects.filter(pk=action.pk).update(approvals_required=2)  # a two-approver action
    actions.vote_on_action(action_id=action.pk, actor=as_alice, approve=True, now=now)
    with pytest.raises(VoteRefused, match="already voted"):
        actions.vote_on_action(action_id=action.pk, actor=as_al, approve=True, now=now)


def test_two_subjects_claiming_one_username_get_two_accounts_and_neither_is_the_other(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = sign_in(backend, monkeypatch, {"sub": "s-alice", "preferred_username": "alice",
                                           "groups": ["root"]})  # fmt: skip
    mallory = sign_in(backend, monkeypatch, {"sub": "s-mallory", "preferred_username": "alice",
                                             "groups": ["sre"]})  # fmt: skip
    assert mallory.pk != alice.pk
    assert mallory.username.startswith("sso:alice~") and len(mallory.username) == 18
    from console.roles import role_of

    alice.refresh_from_db()
    assert (role_of(alice), role_of(mallory)) == ("admin", "operator")


@pytest.mark.parametrize("verified", [False, True, "true"])
def test_an_email_never_links_an_identity_to_an_existing_account(
    backend: Any, monkeypatch: pytest.MonkeyPatch, verified: Any
) -> None:
    from django.contrib.auth import get_user_model

    from console.actions import create_user
    from console.roles import role_of

    local = create_user(actor="test", username="admin2", role="admin", password="pw-admin2-123")
    local.email = "admin@example.test"
    local.save()
    old = {"sub": "s-old", "preferred_username": "ops", "email": "ops@example.test"}
    sso_made = sign_in(backend, monkeypatch, {**old, "groups": ["root"]})
    for email in ("admin@example.test", "ops@example.test", "ADMIN@example.test"):
        new = {"sub": f"s-new-{email}", "email": email, "email_verified": verified}
        user = sign_in(backend, monkeypatch, {**new, "groups": ["sre"]})
        assert user.pk not in (local.pk, sso_made.pk)
        assert role_of(user) == "operator"
    local.refresh_from_db()
    sso_made.refresh_from_db()
    assert (role_of(local), local.has_usable_password(), role_of(sso_made)) == (
        "admin", True, "admin")  # fmt: skip
    # The address is kept only when the IdP says it verified it (the JSON true).
    kept = get_user_model().objects.filter(email="ops@example.test")
    assert kept.count() == (1 if verified is True else 0)


@pytest.mark.parametrize(
    "name",
    ["\uff41\uff4c\uff49\uff43\uff45", "ALICE", "Alice", "alice\u0301", "\uff53\uff53\uff4f:alice"],
)
def test_a_look_alike_username_gets_its_own_account_not_a_500(
    backend: Any, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    alice = sign_in(backend, monkeypatch, {"sub": "s-alice", "preferred_username": "alice",
                                           "groups": ["sre"]})  # fmt: skip
    other = sign_in(backend, monkeypatch, {"sub": f"s-{name}", "preferred_username": name,
                                           "groups": ["sre"]})  # fmt: skip
    assert other is not None and other.pk != alice.pk
    assert other.username.casefold() != alice.username.casefold()


def test_a_fullwidth_name_alone_is_stored_as_django_stores_names(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = sign_in(backend, monkeypatch, {"sub": "s-w", "preferred_username": "\uff42\uff4f\uff42",
                                          "groups": ["sre"]})  # fmt: skip
    assert user.username == "sso:bob"


def test_userinfo_naming_another_subject_is_refused(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SuspiciousOperation, match="another subject"):
        sign_in(backend, monkeypatch, {"sub": "s-1", "groups": ["sre"]},
                userinfo={"sub": "s-admin", "preferred_username": "admin"})  # fmt: skip
    # Userinfo cannot move the issuer either: the ID token's stays.
    user = sign_in(backend, monkeypatch, {"sub": "s-1", "groups": ["sre"]},
                   userinfo={"sub": "s-1", "iss": "https://evil.example"})  # fmt: skip
    assert user.sso_identity.issuer == ISSUER


# -- the ID token: ours, or refused --------------------------------------------------------

KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
PUBLIC = (
    KEY.public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    .decode()
)


@pytest.fixture
def verifier(settings: Any, backend: Any) -> Any:
    settings.OIDC_RP_SIGN_ALGO = "RS256"
    settings.OIDC_RP_IDP_SIGN_KEY = PUBLIC
    from faultline.sso import FaultlineOIDCBackend

    return FaultlineOIDCBackend()


def id_token(**changes: Any) -> str:
    claims = {"iss": ISSUER, "aud": "c", "sub": "s-1", "nonce": "n", "iat": int(time.time()),
              "exp": int(time.time()) + 300}  # fmt: skip
    claims.update(changes)
    return jwt.encode({k: v for k, v in claims.items() if v is not None}, KEY, algorithm="RS256")


def test_it_accepts_an_id_token_issued_to_this_client(verifier: Any) -> None:
    assert verifier.verify_token(id_token(), nonce="n")["sub"] == "s-1"
    assert verifier.verify_token(id_token(aud=["c"]), nonce="n")["sub"] == "s-1"
    assert verifier.verify_token(id_token(aud=["c", "other"], azp="c"), nonce="n")


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"aud": "another-client"}, "not this client"),
        ({"aud": ["another-client"]}, "not this client"),
        ({"aud": None}, "not this client"),
        ({"aud": ["c", "other"]}, "several audiences"),
        ({"aud": ["c", "other"], "azp": "other"}, "several audiences"),
        ({"iss": "https://evil.example"}, "issued by"),
        ({"iss": ISSUER + "/"}, "issued by"),
        ({"iss": None}, "issued by"),
        ({"aud": "another-client", "iss": "https://evil.example"}, "issued by"),
        ({"exp": None}, "no expiry"),
        ({"sub": None}, "no subject"),
        ({"sub": ""}, "no subject"),
    ],
)
def test_it_refuses_an_id_token_not_issued_to_this_client(
    verifier: Any, changes: dict[str, Any], why: str
) -> None:
    with pytest.raises(SuspiciousOperation, match=why):
        verifier.verify_token(id_token(**changes), nonce="n")


def test_a_refused_id_token_is_a_refused_sign_in_not_a_500(
    verifier: Any, monkeypatch: pytest.MonkeyPatch, rf: Any
) -> None:
    monkeypatch.setattr(verifier, "get_token", lambda payload: {
        "id_token": id_token(aud="another-client"), "access_token": "a"})  # fmt: skip
    monkeypatch.setattr("faultline.sso.reverse", lambda name: "/oidc/callback/", raising=False)
    monkeypatch.setattr("mozilla_django_oidc.auth.reverse", lambda name: "/oidc/callback/")
    request = rf.get("/oidc/callback/", {"code": "x", "state": "y"})
    request.session = {}
    assert verifier.authenticate(request, nonce="n") is None


# -- accounts made before identities were kept ----------------------------------------------


def test_the_migration_links_each_old_account_to_the_identity_that_created_it() -> None:
    import importlib
    from datetime import timedelta

    from django.apps import apps
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from console.models import AuditLog, SsoIdentity

    migration = importlib.import_module("console.migrations.0015_sso_identity")
    users = get_user_model().objects
    start = timezone.now() - timedelta(days=3)

    def account(name: str) -> Any:
        return users.create_user(username=name)  # no password: as SSO made them

    alice, al, bob, ghost = (account(n) for n in ("sso:alice", "sso:al", "sso:bob", "sso:ghost"))
    local = users.create_user(username="sso:local", password="pw-local-123")

    def signed_in(user: Any, sub: str, minutes: int, *, created: bool) -> None:
        data = {"issuer": ISSUER, "sub": sub, "created": created}
        AuditLog.objects.create(ts=start + timedelta(minutes=minutes), actor=user.username,
                                verb="sso_login", object_type="user", object_id=str(user.pk),
                                data=data)  # fmt: skip

    signed_in(alice, "s-alice", 1, created=True)
    signed_in(alice, "s-mallory", 5, created=False)  # the old takeover: not its creator
    signed_in(al, "s-alice", 9, created=True)  # the old second account of one person
    signed_in(bob, "s-bob", 3, created=True)
    migration.link_existing(apps, None)
    linked = {i.user.username: (i.issuer, i.subject) for i in SsoIdentity.objects.all()}
    assert linked == {"sso:alice": (ISSUER, "s-alice"), "sso:bob": (ISSUER, "s-bob")}
    assert not {"sso:al", "sso:ghost", "sso:local"} & set(linked)
    assert ghost.pk and local.pk
