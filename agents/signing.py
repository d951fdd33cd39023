"""Action signatures: HMAC-SHA256 over a canonical JSON of the action, per agent.

Owns the one definition both sides use (the service imports this module; the agent cannot
import the service). The key is SHA-256 of the agent's token: the agent holds the token,
the service stores exactly that hash (ingest/auth.py), so neither side needs a new secret.
A signature binds every field of the action (id, kind, target, group, generation, params,
node) to the node holding that token: an action cannot be altered, forged by someone on
the path, or replayed to another node. Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

SIGNATURE_FIELD = "signature"
SCHEME = "hmac-sha256:v1:"


def key_from_token(token: str) -> bytes:
    """The agent's signing key: SHA-256 of its token (what the service stores, as bytes)."""
    return hashlib.sha256(token.encode()).digest()


def key_from_token_hash(token_hash: str) -> bytes:
    """The same key on the service, from the stored hex `token_hash`."""
    return bytes.fromhex(token_hash)


def canonical(action: Mapping[str, Any]) -> bytes:
    """Sorted keys, no spaces, ASCII only, no NaN: one byte string per action value."""
    body = {k: v for k, v in action.items() if k != SIGNATURE_FIELD}
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def signature(action: Mapping[str, Any], key: bytes) -> str:
    return SCHEME + hmac.new(key, canonical(action), hashlib.sha256).hexdigest()


def sign(action: Mapping[str, Any], key: bytes) -> dict[str, Any]:
    """A copy of `action` carrying its signature."""
    return {**action, SIGNATURE_FIELD: signature(action, key)}


def verify(action: Mapping[str, Any], key: bytes) -> bool:
    """True when the action carries a valid signature for `key` (constant-time compare)."""
    given = action.get(SIGNATURE_FIELD)
    if not isinstance(given, str) or not given.startswith(SCHEME):
        return False
    try:
        expected = signature(action, key)
    except (TypeError, ValueError):  # a value JSON cannot carry: never valid
        return False
    return hmac.compare_digest(given, expected)
