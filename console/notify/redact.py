"""Redaction of notification secrets before they reach the audit log or a log line.

Owns what of a channel is safe to show every viewer: the scheme, host and port of its URL,
never its path, query, fragment or user info (a Slack webhook's path *is* its secret), and
never a routing key, token, HMAC key or password. Pure: no settings, no database.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

REDACTED = "[redacted]"
# Keys whose values are secrets whatever they look like (compared case-insensitively,
# and as suffixes, so "routing_key" and "hmac_secret" match too).
SECRET_KEYS = ("secret", "token", "password", "routing_key", "key", "authorization")
# An http(s) URL anywhere in a string (a reason that quotes the webhook, say).
_URL = re.compile(r"https?://[^\s\"'<>]+", re.IGNORECASE)


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

    Values under secret-looking keys become `[redacted]`; any http(s) URL in a string
    (under `url` or not, the whole string or quoted in a sentence) keeps only its origin.
    """
    if isinstance(data, Mapping):
        return {
            k: (REDACTED if _secret_key(str(k)) and v not in (None, "") else redact(v))
            for k, v in data.items()
        }
    if isinstance(data, list | tuple):
        return [redact(v) for v in data]
    if isinstance(data, str) and "://" in data:
        return _URL.sub(lambda m: redact_url(m.group(0)), data)
    return data


def channel_audit_data(
    *, name: str, kind: str, url: str, secret_set: bool, **extra: Any
) -> dict[str, Any]:
    """What a channel's audit row (`channel.saved`, `.updated`, `.enabled`, `.disabled`,
    `.secret_rotated`) may record: the name, kind, URL origin, whether a secret is set, and
    `extra` (changed fields, a reason) redacted like any payload. The one place that
    decides it, so a new channel verb cannot audit a webhook path or a key by mistake."""
    return {
        **redact(extra),
        "name": name,
        "kind": kind,
        "url": redact_url(url),
        "secret_set": secret_set,
    }
