"""Single sign-on in Debian chromium against a real OpenID provider started by the test.

oidc-provider-mock serves discovery, authorization, token (RS256 ID tokens), userinfo and
JWKS on loopback; `faultline up` is pointed at it through FAULTLINE_OIDC_*. A user whose
IdP groups map to approver signs in through the provider's page and lands on the console
as an approver, named `sso:<username>` in the audit log; one whose groups map to nothing is
refused; the local admin account still signs in with its password (break-glass).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from faultline.embedded import free_port
from tests.system.conftest import ADMIN, Service, start_service, stop_service
from tests.system.test_browser_fleet import browser, login  # noqa: F401 - shared fixture

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def provider() -> Iterator[str]:
    mock = pytest.importorskip("oidc_provider_mock")
    users = [
        mock.User(
            sub="8c1e2f3a-alice",
            claims={"preferred_username": "alice", "email": "alice@example.test",
                    "groups": ["gpu-sre", "gpu-sre-leads"]},
        ),
        mock.User(sub="5d0b-mallory", claims={"preferred_username": "mallory",
                                              "groups": ["marketing"]}),
    ]  # fmt: skip
    with mock.run_server_in_thread(port=free_port(), user_claims=users) as server:
        yield f"http://localhost:{server.server_port}"


@pytest.fixture(scope="module")
def sso_service(provider: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    env = {
        "FAULTLINE_OIDC_CLIENT_ID": "faultline-test",
        "FAULTLINE_OIDC_CLIENT_SECRET": "faultline-test-secret",
        "FAULTLINE_OIDC_ISSUER": provider,
        "FAULTLINE_OIDC_AUTHORIZATION_ENDPOINT": provider + "/oauth2/authorize",
        "FAULTLINE_OIDC_TOKEN_ENDPOINT": provider + "/oauth2/token",
        "FAULTLINE_OIDC_USERINFO_ENDPOINT": provider + "/userinfo",
        "FAULTLINE_OIDC_JWKS_URI": provider + "/jwks",
        "FAULTLINE_OIDC_ROLE_MAP": "gpu-sre=operator,gpu-sre-leads=approver",
        "FAULTLINE_OIDC_PROVIDER_NAME": "Example IdP",
    }
    svc = start_service(tmp_path_factory.mktemp("faultline-sso"), env=env)
    try:
        yield svc
    finally:
        stop_service(svc)


def sso_login(page: Any, service: Service, who: str) -> None:
    page.goto(service.url + "/login/")
    page.click("#sso-login")  # -> the provider's authorization page
    page.wait_for_url("**/oauth2/authorize**")
    page.click(f"button[name=sub][value='{who}']")


def test_it_signs_in_through_the_idp_with_the_role_its_groups_map_to(
    browser: Any,  # noqa: F811
    sso_service: Service,
) -> None:
    page = browser.new_page()
    sso_login(page, sso_service, "8c1e2f3a-alice")
    page.wait_for_url(sso_service.url + "/")
    assert page.get_attribute("body", "data-role") == "approver"  # highest mapped role
    assert "sso:alice" in page.inner_text(".who")
    audit = sso_service.api("/api/v1/audit/?verb=sso_login")
    rows = audit["results"] if isinstance(audit, dict) else audit
    row = next(r for r in rows if r["actor"] == "sso:alice")
    assert row["data"]["role"] == "approver"
    assert row["data"]["sub"] == "8c1e2f3a-alice"
    assert set(row["data"]["groups"]) == {"gpu-sre", "gpu-sre-leads"}


def test_it_refuses_an_identity_whose_groups_map_to_no_role(
    browser: Any,  # noqa: F811
    sso_service: Service,
) -> None:
    page = browser.new_page()
    sso_login(page, sso_service, "5d0b-mallory")
    page.wait_for_url("**/login/?sso=refused**")
    assert "no group mapped" in page.inner_text("body")
    users = sso_service.api("/api/v1/audit/?verb=sso_login")
    rows = users["results"] if isinstance(users, dict) else users
    assert not any(r["actor"] == "sso:mallory" for r in rows)


def test_it_keeps_the_local_admin_for_break_glass(
    browser: Any,  # noqa: F811
    sso_service: Service,
) -> None:
    page = browser.new_page()
    login(page, sso_service, ADMIN)
    assert page.get_attribute("body", "data-role") == "admin"


def _set_claims(provider: str, sub: str, claims: dict[str, Any]) -> None:
    body = json.dumps(claims).encode()
    request = urllib.request.Request(f"{provider}/users/{sub}", data=body, method="PUT",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=10):
        pass


def test_an_identity_is_one_account_whatever_username_it_claims_later(
    browser: Any,  # noqa: F811
    sso_service: Service,
    provider: str,
) -> None:
    """Alice renamed at the IdP signs in to the same account; mallory, now claiming the
    username "alice", gets an account of her own with her own (lower) role."""
    _set_claims(provider, "8c1e2f3a-alice", {"preferred_username": "alice.renamed",
                                             "groups": ["gpu-sre", "gpu-sre-leads"]})  # fmt: skip
    page = browser.new_context().new_page()
    sso_login(page, sso_service, "8c1e2f3a-alice")
    page.wait_for_url(sso_service.url + "/")
    assert "sso:alice" in page.inner_text(".who") and "renamed" not in page.inner_text(".who")
    _set_claims(provider, "5d0b-mallory", {"preferred_username": "alice",
                                           "groups": ["gpu-sre"]})  # fmt: skip
    page = browser.new_context().new_page()
    sso_login(page, sso_service, "5d0b-mallory")
    page.wait_for_url(sso_service.url + "/")
    assert page.get_attribute("body", "data-role") == "operator"
    assert "sso:alice~" in page.inner_text(".who")
    audit = sso_service.api("/api/v1/audit/?verb=sso_login")
    rows = audit["results"] if isinstance(audit, dict) else audit
    subs = {r["data"]["sub"]: r["actor"] for r in rows}
    assert subs["8c1e2f3a-alice"] == "sso:alice"
    assert subs["5d0b-mallory"].startswith("sso:alice~")
