"""Agent tokens: issued once, stored as SHA-256, bound to one node, revocable.

Tokens are 256-bit random strings, so a fast hash is enough (no password stretching needed)
and lookup stays one indexed query on the hot path. The stored hash is also the key that
signs the actions handed to that agent (`sign_action`, agents/signing.py).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.utils import timezone

from agents import protocol as p
from agents import signing
from console import actions
from console.models import Node
from ingest.models import AgentCredential
from ingest.rawsql import columns, from_row, send

TOKEN_PREFIX = "flt_"  # noqa: S105 - a visible prefix, not a secret


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@transaction.atomic
def issue_token(*, node_name: str, launcher_group: str = "", actor: str = actions.SYSTEM) -> str:
    """Create the node if needed and return a new token (shown once, never stored); the
    audit row names `actor`, the node and the token's prefix.

    With `launcher_group`, a launcher token: it speaks for that group only, never for the
    node (`launcher_refusal`): no device or host records, no actions.
    """
    now = timezone.now()
    node = actions.register_node(name=node_name, actor=actor, now=now)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    prefix = token[:12]
    AgentCredential.objects.create(
        node=node, token_hash=hash_token(token), prefix=prefix, launcher_group=launcher_group
    )
    actions.audit(
        actor=actor,
        verb="agent_token.issued",
        obj=node,
        data={"prefix": prefix, "launcher_group": launcher_group},
        now=now,
    )
    return token


@transaction.atomic
def revoke_tokens(*, node_name: str, actor: str = actions.SYSTEM) -> int:
    """Revoke every live token of the node. Ingest refuses them on their next batch, in
    every process (its store re-checks revocation in the batch's transaction)."""
    transaction.on_commit(forget_credential)
    now = timezone.now()
    live = AgentCredential.objects.filter(node__name=node_name, revoked_at=None)
    prefixes = sorted(live.values_list("prefix", flat=True))
    count = live.update(revoked_at=now)
    if count:
        actions.audit(
            actor=actor,
            verb="agent_token.revoked",
            object_type="node",
            object_id=node_name,
            data={"prefixes": prefixes},
            now=now,
        )
    return count


_AUTHENTICATE = f"""
SELECT {columns(AgentCredential, "c")}, {columns(Node, "n")}
FROM ingest_agentcredential c JOIN console_node n ON n.id = c.node_id
WHERE c.token_hash = %s AND c.revoked_at IS NULL ORDER BY c.id LIMIT 1
"""  # noqa: S608 - constant column names


# Read in the transaction that stores a batch authenticated from the cache: a row while the
# credential is live, with its node's health before the batch (the sweep may have marked
# the node silent since the credential was cached).
CREDENTIAL_LIVE = """
SELECT n.health FROM ingest_agentcredential c JOIN console_node n ON n.id = c.node_id
WHERE c.id = %(credential)s AND c.revoked_at IS NULL
"""


class CredentialRevokedError(Exception):
    """The cached credential was revoked: the batch is refused (401), nothing stored."""


# What a launcher token may send (docs/security.md): its group's transitions and what a
# launcher sees of its children (a rank's process exit, a serving worker's exit window).
LAUNCHER_RECORDS = (p.Transition, p.Process, p.Serving)


def is_launcher(credential: AgentCredential) -> bool:
    """A launcher token speaks for its group, never for the node it is issued on: it reads
    and answers none of the node's actions and sends none of its device records."""
    return bool(credential.launcher_group)


def launcher_refusal(credential: AgentCredential, records: list[Any]) -> str | None:
    """Why a launcher token may not send this batch (403), or None."""
    group = credential.launcher_group
    if not group:
        return None
    for index, rec in enumerate(records):
        if not isinstance(rec, LAUNCHER_RECORDS) or rec.group != group:
            named = getattr(rec, "group", None)
            what = rec.__struct_config__.tag + (f' of group "{named}"' if named else "")
            return (
                f'record {index}: a launcher token speaks for group "{group}" only: it may '
                f"send transition, process and serving records of that group, not {what}"
            )
    return None


def _bearer(header: str) -> str | None:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def authenticate(header: str) -> AgentCredential | None:
    """Return the live credential for `Bearer <token>`, or None (missing/unknown/revoked).

    One indexed query, no cache: a revoked token is refused on its next request.
    """
    token = _bearer(header)
    return None if token is None else _lookup(hash_token(token))


# Ingest's cache of credentials that authenticated (token hash -> (credential, expiry)).
# Only known, live tokens are cached. It saves the lookup's round trip, never the check:
# the batch's own transaction re-reads `revoked_at` (ingest.store.batch, CREDENTIAL_LIVE),
# so a revoked token is still refused on its next batch in every process. The TTL bounds
# how stale the rest of the cached row (the node's name, the launcher group) can be.
_cache: dict[str, tuple[AgentCredential, float]] = {}
_cache_lock = threading.Lock()
CACHE_TTL_S = 60.0
CACHE_MAX = 50_000  # entries per process (two workers x 50k nodes' tokens is ~100 MB)


def authenticate_cached(header: str) -> AgentCredential | None:
    """`authenticate` for ingest, from this process's cache when it can be.

    The caller must confirm the credential is still live inside the transaction that
    stores the batch (`ingest_batch(credential_id=...)`), and `forget_credential` it when
    that says revoked.
    """
    token = _bearer(header)
    if token is None:
        return None
    key = hash_token(token)
    now = time.monotonic()
    hit = _cache.get(key)
    if hit is not None and hit[1] > now:
        return hit[0]
    credential = _lookup(key)
    if credential is not None:
        with _cache_lock:
            if len(_cache) >= CACHE_MAX:
                _cache.clear()  # a flood of distinct tokens: start again, never grow
            _cache[key] = (credential, now + CACHE_TTL_S)
    return credential


def forget_credential(token_hash: str | None = None) -> None:
    """Drop one cached credential (revoked, seen by the store), or all of them (tests)."""
    with _cache_lock:
        if token_hash is None:
            _cache.clear()
        else:
            _cache.pop(token_hash, None)


def _lookup(token_hash: str) -> AgentCredential | None:
    with send(_AUTHENTICATE, (token_hash,)) as cur:
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
