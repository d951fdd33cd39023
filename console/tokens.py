"""User API tokens looked up by hash (issue and revoke: console.actions.tokens).

The database keeps a token's SHA-256 (`ApiToken.key_hash`); authentication hashes what the
caller presents. It must not log or store a token. Its one write, `last_used_at` now and
then, is bookkeeping of the lookup, not a change anybody makes: it has no audit row.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from console.models import ApiToken

# How often `last_used_at` is written: every request would make each API call a write.
LAST_USED_EVERY = timedelta(minutes=5)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


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
