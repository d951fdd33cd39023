"""User API tokens: issue (shown once), revoke, and look up by hash.

Owns the only place a user token exists in clear: the return value of `issue_api_token`.
The database keeps its SHA-256 (`ApiToken.key_hash`) and an 8-character prefix to tell
tokens apart; authentication hashes what the caller presents. It must not log, audit or
store a token itself.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from console.models import ApiToken, AuditLog

# How often `last_used_at` is written: every request would make each API call a write.
LAST_USED_EVERY = timedelta(minutes=5)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _audit(*, actor: str, verb: str, row: ApiToken, now: datetime) -> None:
    AuditLog.objects.create(
        ts=now,
        actor=actor[:150],
        verb=verb,
        object_type="apitoken",
        object_id=str(row.pk),
        data={"user": row.user.get_username(), "name": row.name, "prefix": row.prefix},
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


def user_for_token(token: str, *, now: datetime) -> Any | None:
    """The active user holding `token`, or None; refreshes `last_used_at` now and then."""
    row = (
        ApiToken.objects.select_related("user")
        .filter(key_hash=hash_token(token), user__is_active=True)
        .first()
    )
    if row is None:
        return None
    if row.last_used_at is None or now - row.last_used_at > LAST_USED_EVERY:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row.user
