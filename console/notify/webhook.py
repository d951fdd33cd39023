"""Generic JSON webhook: the body and its HMAC-SHA256 signature.

Owns the wire format receivers verify: header `X-Faultline-Timestamp` (unix seconds)
and `X-Faultline-Signature: v1=<hex>` over `<timestamp>.<body>`, so a captured body
cannot be replayed later with a new timestamp. It must not send anything.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from console.notify.message import Notification

SIGNATURE_HEADER = "X-Faultline-Signature"
TIMESTAMP_HEADER = "X-Faultline-Timestamp"
SCHEME = "v1"
TOLERANCE_S = 300


class SignatureError(ValueError):
    """A webhook whose signature or timestamp does not verify."""


def build_payload(n: Notification) -> dict[str, Any]:
    """The JSON document a webhook receiver gets."""
    return {
        "version": 1,
        "event": str(n.event),
        "incident": n.incident_id,
        "dedup_key": n.dedup_key,
        "title": n.title,
        "severity": n.severity,
        "subject": n.subject,
        "group": n.group,
        "root_cause": n.root_cause,
        "role": n.role,
        "url": n.url,
        "occurred_at": n.occurred_at.isoformat(),
        "evidence": dict(n.evidence),
    }


def encode(payload: Mapping[str, Any]) -> bytes:
    """Compact, key-sorted JSON: the exact bytes that are signed and sent."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _digest(body: bytes, secret: str, timestamp: int) -> str:
    message = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign(body: bytes, secret: str, now: datetime) -> dict[str, str]:
    """Headers that sign `body` with `secret` at `now`."""
    if not secret:
        raise ValueError("a webhook secret is required to sign")
    timestamp = int(now.timestamp())
    return {
        "Content-Type": "application/json",
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: f"{SCHEME}={_digest(body, secret, timestamp)}",
    }


def request(n: Notification, secret: str, now: datetime) -> tuple[bytes, dict[str, str]]:
    """(body, headers) ready for `transport.send`."""
    body = encode(build_payload(n))
    return body, sign(body, secret, now)


def verify(
    body: bytes,
    headers: Mapping[str, str],
    secret: str,
    now: datetime,
    tolerance_s: int = TOLERANCE_S,
) -> None:
    """Raise `SignatureError` unless `body` was signed with `secret` recently."""
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ts = lowered.get(TIMESTAMP_HEADER.lower())
    raw_sig = lowered.get(SIGNATURE_HEADER.lower())
    if not raw_ts or not raw_sig:
        raise SignatureError(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header")
    try:
        timestamp = int(raw_ts)
    except ValueError:
        raise SignatureError(f"{TIMESTAMP_HEADER} must be unix seconds, got {raw_ts!r}") from None
    skew = abs(now.timestamp() - timestamp)
    if skew > tolerance_s:
        raise SignatureError(
            f"webhook timestamp is {skew:.0f} s away from now (tolerance {tolerance_s} s); "
            "replayed or clock skew"
        )
    expected = f"{SCHEME}={_digest(body, secret, timestamp)}"
    # Several signatures may be sent during secret rotation, comma-separated.
    candidates = [s.strip() for s in raw_sig.split(",")]
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise SignatureError("webhook signature does not match the body")
