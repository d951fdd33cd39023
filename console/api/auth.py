"""DRF authentication for user API tokens (`Authorization: Token <token>`), by hash.

A thin adapter over console.tokens: the header's token is hashed and looked up, so the
database never holds a token that works. It replaces DRF's TokenAuthentication, whose table
stored tokens in clear and whose admin listed them.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from console.tokens import user_for_token


class HashedTokenAuthentication(authentication.TokenAuthentication):
    """`Token <key>` checked against `ApiToken.key_hash` (SHA-256)."""

    keyword = "Token"

    def authenticate_credentials(self, key: str) -> tuple[Any, None]:
        user = user_for_token(key, now=timezone.now())
        if user is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        return user, None


class HashedTokenScheme(OpenApiAuthenticationExtension):
    """Documents the hashed token auth as `tokenAuth` in the OpenAPI schema."""

    target_class = "console.api.auth.HashedTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": 'Token-based authentication with required prefix "Token"',
        }
