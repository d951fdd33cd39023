"""Agent tokens: issued once, stored as SHA-256, bound to one node, revocable.

Tokens are 256-bit random strings, so a fast hash is enough (no password stretching needed)
and lookup stays one indexed query on the hot path. The stored hash is also the key that
signs the actions handed to that agent (`sign_action`, agents/signing.py).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.utils import timezone

from agents import signing
from console.models import Node
from ingest.models import AgentCredential
from ingest.rawsql import columns, from_row, send

TOKEN_PREFIX = "flt_"  # noqa: S105 - a visible prefix, not a secret


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@transaction.atomic
def issue_token(*, node_name: str, launcher_group: str = "") -> str:
    """Create the node if needed and return a new token (shown once, never stored).

    With `launcher_group`, a launcher token: besides what any token of the node may send,
    it may send transitions of that group although the node hosts none of its ranks.
    """
    node, _ = Node.objects.get_or_create(name=node_name)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    AgentCredential.objects.create(
        node=node, token_hash=hash_token(token), prefix=token[:12], launcher_group=launcher_group
    )
    return token


@transaction.atomic
def revoke_tokens(*, node_name: str) -> int:
    return AgentCredential.objects.filter(node__name=node_name, revoked_at=None).update(
        revoked_at=timezone.now()
    )


_AUTHENTICATE = f"""
SELECT {columns(AgentCredential, "c")}, {columns(Node, "n")}
FROM ingest_agentcredential c JOIN console_node n ON n.id = c.node_id
WHERE c.token_hash = %s AND c.revoked_at IS NULL ORDER BY c.id LIMIT 1
"""  # noqa: S608 - constant column names


def authenticate(header: str) -> AgentCredential | None:
    """Return the live credential for `Bearer <token>`, or None (missing/unknown/revoked).

    One indexed query per batch, no cache: a revoked token is refused on its next batch.
    """
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    with send(_AUTHENTICATE, (hash_token(token.strip()),)) as cur:
        row = cur.fetchone()
    if row is None:
        return None
    credential = from_row(AgentCredential, row)
    credential.node = from_row(Node, row[len(AgentCredential._meta.concrete_fields) :])
    return credential


def sign_action(action: Mapping[str, Any], *, credential: AgentCredential) -> dict[str, Any]:
    """The action as the agent holding `credential` verifies it: its node named, signed.

    Call it on every action handed to an agent, with the credential that authenticated
    the request that carries it (the ingest response, the action poll): the agent drops
    an unsigned or badly signed action (agents/executor.py).
    """
    body = {**action, "node": credential.node.name}
    return signing.sign(body, signing.key_from_token_hash(credential.token_hash))
