"""Redaction of notification secrets before they reach the audit log or a log line.

Owns what of a channel is safe to show every viewer: the scheme, host and port of its URL,
never its path, query, fragment or user info (a Slack webhook's path *is* its secret), and
never a routing key, token, HMAC key or password. Pure: no settings, no database.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

REDACTED = "[redacted]"
# Keys whose values are secrets whatever they look like (compared case-insensitively,
# and as suffixes, so "routing_key" and "hmac_secret" match too).
SECRET_KEYS = ("secret", "token", "password", "routing_key", "key", "authorization")


def redact_url(url: str) -> str:
    """`https://hooks.slack.com/services/T/B/x?y` -> `https://hooks.slack.com/[redacted]`."""
    try:
        parts = urlsplit(str(url))
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # an unparsable port, say: show nothing of it
        return REDACTED
    if not parts.scheme or not host:
        return REDACTED if url else ""
    hidden = parts.path not in ("", "/") or parts.query or parts.fragment
    return f"{parts.scheme}://{host}{port}/" + (REDACTED if hidden else "")


def _secret_key(key: str) -> bool:
    low = key.lower()
    return any(low == k or low.endswith("_" + k) for k in SECRET_KEYS)


def redact(data: Any) -> Any:
    """A copy of an audit payload with secrets replaced, recursively.

    Values under secret-looking keys become `[redacted]`; any string that is an http(s)
    URL (under `url` or not) keeps only its origin.
    """
    if isinstance(data, Mapping):
        return {
            k: (REDACTED if _secret_key(str(k)) and v not in (None, "") else redact(v))
            for k, v in data.items()
        }
    if isinstance(data, list | tuple):
        return [redact(v) for v in data]
    if isinstance(data, str) and data.lower().startswith(("http://", "https://")):
        return redact_url(data)
    return data


def channel_audit_data(*, name: str, kind: str, url: str, secret_set: bool) -> dict[str, Any]:
    """What `channel.saved` may record: the name, kind, URL origin and whether a secret is set."""
    return {"name": name, "kind": kind, "url": redact_url(url), "secret_set": secret_set}
