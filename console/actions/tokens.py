"""User API tokens issued and revoked, each with its audit row.

`issue_api_token` returns the only copy of a token in clear; the database keeps its SHA-256
(console.tokens.hash_token) and an 8-character prefix to tell tokens apart. The audit row
names the user, the token's name and prefix, never the token.
"""

from __future__ import annotations

import secrets
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import transaction

from console.actions.audit import audit
from console.models import ApiToken
from console.tokens import hash_token


def _audit(*, actor: str, verb: str, row: ApiToken, now: datetime) -> None:
    audit(
        actor=actor,
        verb=verb,
        obj=row,
        data={"user": row.user.get_username(), "name": row.name, "prefix": row.prefix},
        now=now,
    )


@transaction.atomic
def issue_api_token(*, username: str, name: str = "", actor: str, now: datetime) -> str:
    """Create a token for `username`; return it (the only time it exists in clear)."""
    user = get_user_model().objects.get(username=username)
    token = secrets.token_hex(20)  # 40 hex characters, like DRF's tokens
    row = ApiToken.objects.create(
        user=user, name=name[:64], key_hash=hash_token(token), prefix=token[:8], created_at=now
    )
    _audit(actor=actor, verb="token.issued", row=row, now=now)
    return token


@transaction.atomic
def revoke_api_tokens(*, username: str, actor: str, now: datetime, prefix: str = "") -> int:
    """Delete the user's tokens (those starting with `prefix`, if given); returns how many."""
    rows = ApiToken.objects.select_related("user").filter(user__username=username)
    if prefix:
        rows = rows.filter(prefix=prefix[:8])
    count = 0
    for row in rows:
        _audit(actor=actor, verb="token.revoked", row=row, now=now)
        row.delete()
        count += 1
    return count
