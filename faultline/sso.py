"""Single sign-on through OpenID Connect (mozilla-django-oidc), off unless configured.

Owns turning an IdP identity into a console user. The identity is the ID token's (issuer,
`sub`) after checking that the token was issued by FAULTLINE_OIDC_ISSUER for this client
(`iss`, `aud`/`azp`, `exp`; the library checks only the signature and nonce): one identity
is one account (console.models.SsoIdentity), whatever username or email it later claims, so
a person has one vote. Never linked by username or email: the username claim only names a
new account `sso:<name>` (NFKC, and a suffix from the identity when the name is taken), and
a local account is never matched, so a local password stays the break-glass way in. The
role comes from the IdP's group claim through settings.OIDC_ROLE_MAP (the highest mapped
role wins; re-read at every login, so removing someone from the IdP group demotes them),
and every login writes one audit row naming the identity. Someone whose groups map to no
role is refused, not made a viewer, unless FAULTLINE_OIDC_DEFAULT_ROLE says otherwise.
"""

from __future__ import annotations

import hashlib
import logging
import time
import unicodedata
from typing import Any

import jwt
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.db import IntegrityError, transaction
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
    """How the identity is named in logs and the audit log: issuer and `sub`."""
    return f"{claims.get('iss') or settings.OIDC_ISSUER} sub {claims.get('sub')!r}"


def username_for(claims: dict[str, Any]) -> str:
    """`sso:<name>` for a new account: the username claim (else email, else `sub`) as
    Django stores names (NFKC), trimmed to fit with room for a suffix."""
    raw = claims.get(settings.OIDC_USERNAME_CLAIM) or claims.get("email") or claims["sub"]
    name = unicodedata.normalize("NFKC", str(raw)).strip()
    return f"{PREFIX}{name}"[:140]


def _suffix(issuer: str, sub: str) -> str:
    return hashlib.sha256(f"{issuer}\n{sub}".encode()).hexdigest()[:8]


def check_id_token(payload: dict[str, Any], *, now: float | None = None) -> None:
    """Raise SuspiciousOperation unless the ID token is ours: issued by the configured
    issuer, to this client (`aud`; `azp` when there are several audiences), not expired,
    naming a subject. The signature and nonce were checked before."""
    client = settings.OIDC_RP_CLIENT_ID
    if payload.get("iss") != settings.OIDC_ISSUER:
        raise SuspiciousOperation(
            f"ID token issued by {str(payload.get('iss'))[:200]!r}, not {settings.OIDC_ISSUER!r}"
        )
    audience = payload.get("aud")
    audiences = [audience] if isinstance(audience, str) else audience
    if not isinstance(audiences, list) or client not in audiences:
        raise SuspiciousOperation(f"ID token is for {str(audience)[:200]!r}, not this client")
    if len(audiences) > 1 and payload.get("azp") != client:
        raise SuspiciousOperation("ID token has several audiences and is not authorized for us")
    expires = payload.get("exp")
    if not isinstance(expires, int | float) or expires <= (time.time() if now is None else now):
        raise SuspiciousOperation("ID token has no expiry or has expired")
    if not isinstance(payload.get("sub"), str) or not payload["sub"]:
        raise SuspiciousOperation("ID token names no subject")


class FaultlineOIDCBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend with Faultline's usernames, roles and audit."""

    def authenticate(self, request: Any, **kwargs: Any) -> Any:
        # A provider that is down, a bad signature or a malformed token is a refused login
        # (back to the login page, where the local form still works), never a 500.
        try:
            return super().authenticate(request, **kwargs)
        except (
            SuspiciousOperation,
            requests.RequestException,
            jwt.PyJWTError,
            KeyError,
            ValueError,
        ) as exc:
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

    def verify_token(self, token: str, **kwargs: Any) -> Any:
        payload = super().verify_token(token, **kwargs)
        if "nonce" in kwargs:  # the ID token (userinfo as a JWT comes without one)
            check_id_token(payload)
        return payload

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        # Some IdPs put the group claim only in the ID token, others only in userinfo. The
        # identity is the ID token's: userinfo naming another subject is refused (OpenID
        # Connect Core 5.3.2), and it can never replace the issuer or subject.
        info = super().get_userinfo(access_token, id_token, payload)
        if not isinstance(info, dict):
            raise SuspiciousOperation("userinfo is not a JSON object")
        if "sub" in info and info["sub"] != payload.get("sub"):
            raise SuspiciousOperation("userinfo names another subject than the ID token")
        return {**payload, **info, "iss": payload.get("iss"), "sub": payload.get("sub")}

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
        # By (issuer, sub) alone: never by username or email, so no other person's account
        # (a local one, or another identity's) is ever matched, and one person is one user.
        from console.models import SsoIdentity

        found = SsoIdentity.objects.select_related("user").filter(
            issuer=self._issuer(claims), subject=str(claims["sub"])
        )
        return [row.user for row in found]

    def create_user(self, claims: dict[str, Any]) -> Any:
        from console.models import SsoIdentity

        issuer, sub = self._issuer(claims), str(claims["sub"])
        users = get_user_model().objects
        name = username_for(claims)
        if users.filter(username__iexact=name).exists():
            # The name is someone else's (a local account, another identity, a look-alike
            # differing in case or width): this identity gets its own, told apart.
            name = f"{name}~{_suffix(issuer, sub)}"
        email = claims.get("email") if claims.get("email_verified") is True else ""
        try:
            with transaction.atomic():
                user = users.create_user(username=name, email=str(email or "")[:254])
                # no password: unusable, so the login form never accepts this account
                SsoIdentity.objects.create(
                    issuer=issuer, subject=sub[:255], user=user, created_at=timezone.now()
                )
        except IntegrityError:  # a concurrent first sign-in, or a name taken meanwhile
            raise SuspiciousOperation(f"{identity(claims)}: account {name!r} exists") from None
        return self._apply(user, claims, created=True)

    def update_user(self, user: Any, claims: dict[str, Any]) -> Any:
        return self._apply(user, claims, created=False)

    @staticmethod
    def _issuer(claims: dict[str, Any]) -> str:
        return str(claims.get("iss") or settings.OIDC_ISSUER)[:255]

    def _apply(self, user: Any, claims: dict[str, Any], *, created: bool) -> Any:
        from console import actions

        actions.record_sso_sign_in(
            actor=user,
            role=role_for(claims) or "viewer",  # never empty: verify_claims refused that
            issuer=self._issuer(claims),
            sub=str(claims["sub"]),
            groups=groups_of(claims),
            created=created,
            now=timezone.now(),
        )
        return user
