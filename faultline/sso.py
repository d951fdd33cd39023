"""Single sign-on through OpenID Connect (mozilla-django-oidc), off unless configured.

Owns turning an IdP identity into a console user: the username `sso:<claim>` (never a local
account's, so a local password stays the break-glass way in), the role from the IdP's
group claim through settings.OIDC_ROLE_MAP (the highest mapped role wins; re-read at every
login, so removing someone from the IdP group demotes them), and one audit row per login
naming the SSO identity. Someone whose groups map to no role is refused, not made a viewer,
unless FAULTLINE_OIDC_DEFAULT_ROLE says otherwise. It must not touch local accounts.
"""

from __future__ import annotations

import logging
from typing import Any

import jwt
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from faultline.sso_config import ROLES, parse_role_map  # noqa: F401 - re-exported

log = logging.getLogger(__name__)

PREFIX = "sso:"


def groups_of(claims: dict[str, Any]) -> list[str]:
    value = claims.get(settings.OIDC_GROUPS_CLAIM)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [g for g in value if isinstance(g, str)]
    return []


def role_for(claims: dict[str, Any]) -> str | None:
    """The highest role any of the identity's groups maps to, else the default (or None)."""
    mapped = [settings.OIDC_ROLE_MAP[g] for g in groups_of(claims) if g in settings.OIDC_ROLE_MAP]
    if mapped:
        return max(mapped, key=ROLES.index)
    return settings.OIDC_DEFAULT_ROLE or None


def identity(claims: dict[str, Any]) -> str:
    value = claims.get(settings.OIDC_USERNAME_CLAIM) or claims.get("email") or claims["sub"]
    return f"{PREFIX}{value}"[:150]


class FaultlineOIDCBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend with Faultline's usernames, roles and audit."""

    def authenticate(self, request: Any, **kwargs: Any) -> Any:
        # A provider that is down, a bad signature or a malformed token is a refused login
        # (back to the login page, where the local form still works), never a 500.
        try:
            return super().authenticate(request, **kwargs)
        except (SuspiciousOperation, requests.RequestException, jwt.PyJWTError,
                KeyError, ValueError) as exc:  # fmt: skip
            log.warning("sso: sign-in refused: %s: %s", type(exc).__name__, exc)
            return None

    def retrieve_matching_jwk(self, token: str) -> Any:
        # Tokens whose header names no `kid` (IdPs with one signing key): match by
        # algorithm only; the signature is still checked against that key.
        if "kid" in jwt.get_unverified_header(token):
            return super().retrieve_matching_jwk(token)
        response = requests.get(
            self.OIDC_OP_JWKS_ENDPOINT,
            verify=self.get_settings("OIDC_VERIFY_SSL", True),
            timeout=self.get_settings("OIDC_TIMEOUT", None),
        )
        response.raise_for_status()
        alg = jwt.get_unverified_header(token).get("alg")
        keys = [k for k in response.json().get("keys", []) if k.get("alg", alg) == alg]
        if len(keys) != 1:
            raise SuspiciousOperation(f"token names no kid and the JWKS has {len(keys)} keys")
        return jwt.PyJWK(keys[0])

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        # Some IdPs put the group claim only in the ID token, others only in userinfo.
        return {**payload, **super().get_userinfo(access_token, id_token, payload)}

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        if not claims.get("sub"):
            return False
        if role_for(claims) is None:
            log.warning(
                "sso: %s has no group mapped to a role (groups %s); refused",
                identity(claims),
                groups_of(claims)[:20],
            )
            return False
        return True

    def filter_users_by_claims(self, claims: dict[str, Any]) -> Any:
        # Only accounts SSO made (no usable password): a local account is never taken over.
        users = get_user_model().objects.filter(username=identity(claims))
        return [u for u in users if not u.has_usable_password()]

    def create_user(self, claims: dict[str, Any]) -> Any:
        if get_user_model().objects.filter(username=identity(claims)).exists():
            # A local account holds the name: refuse rather than share it (or 500).
            raise SuspiciousOperation(f"{identity(claims)} is a local account's name")
        user = get_user_model().objects.create_user(
            username=identity(claims), email=claims.get("email") or ""
        )  # no password: unusable, so the login form never accepts this account
        return self._apply(user, claims, created=True)

    def update_user(self, user: Any, claims: dict[str, Any]) -> Any:
        return self._apply(user, claims, created=False)

    def _apply(self, user: Any, claims: dict[str, Any], *, created: bool) -> Any:
        from console import actions

        actions.record_sso_sign_in(
            actor=user,
            role=role_for(claims) or "viewer",  # never empty: verify_claims refused that
            issuer=settings.OIDC_ISSUER,
            sub=str(claims["sub"]),
            groups=groups_of(claims),
            created=created,
            now=timezone.now(),
        )
        return user
