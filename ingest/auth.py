"""Agent tokens: issued once, stored as SHA-256, bound to one node, revocable.

Tokens are 256-bit random strings, so a fast hash is enough (no password stretching needed)
and lookup stays one indexed query on the hot path.
"""

from __future__ import annotations

import hashlib
import secrets

from django.db import transaction
from django.utils import timezone

from console.models import Node
from ingest.models import AgentCredential

TOKEN_PREFIX = "flt_"  # noqa: S105 - a visible prefix, not a secret


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@transaction.atomic
def issue_token(*, node_name: str) -> str:
    """Create the node if needed and return a new token (shown once, never stored)."""
    node, _ = Node.objects.get_or_create(name=node_name)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    AgentCredential.objects.create(node=node, token_hash=hash_token(token), prefix=token[:12])
    return token


@transaction.atomic
def revoke_tokens(*, node_name: str) -> int:
    return AgentCredential.objects.filter(node__name=node_name, revoked_at=None).update(
        revoked_at=timezone.now()
    )


def authenticate(header: str) -> AgentCredential | None:
    """Return the live credential for `Bearer <token>`, or None (missing/unknown/revoked)."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    return (
        AgentCredential.objects.select_related("node")
        .filter(token_hash=hash_token(token.strip()), revoked_at=None)
        .first()
    )
