"""Scrub free-text record fields before storage (seed contract 8: no sensitive content).

`error_type`, `message`, `detail`, `reason` and a task's `comm` are the only free text an
agent may send. They can carry home directories, dataset paths, account or request ids and
tokens pasted into exception messages or kernel lines. This module bounds their length and
replaces file paths and long digit/hex/token runs with placeholders, once, as a batch
enters the writer (`scrub_record`): rows, latched faults, incident summaries and the audit
log all read the scrubbed text. Pure functions; no Django, no I/O. It must not touch
identifiers the console joins on (group, gpu, checkpoint_id, manifest shard paths).
"""

from __future__ import annotations

import re
from typing import Any

from agents import protocol as p

MAX_TEXT = 200
ELLIPSIS = "…"

# A POSIX path with 2+ components (/a/b, ~/a, ./a/b) or a Windows drive path (C:\a).
_PATH = re.compile(
    r"(?:(?<![\w.])~?/|(?<![\w/])\.{1,2}/|\b[A-Za-z]:\\)"  # how a path starts
    r"[^\s\"'`,;:()<>\[\]{}]+"  # path characters up to whitespace or punctuation
)
_POSIX_ROOT_ONLY = re.compile(r"^/[\w.\-]*$")  # "/s" or "/min": a unit, not a path
# 12+ digits (card numbers, account ids, epoch-ns) or 16+ hex chars with a digit (tokens,
# hashes, session ids). Shorter runs are Xid codes, PCI addresses, ports, PIDs.
_DIGITS = re.compile(r"\d{12,}")
_HEX = re.compile(r"\b(?=[0-9A-Fa-f]*\d)[0-9A-Fa-f]{16,}\b")
# Long runs of token characters (base64/url-safe secrets such as "flt_..." or "sk-...").
_TOKEN = re.compile(r"\b(?=[A-Za-z0-9_\-]*\d)(?=[A-Za-z0-9_\-]*[A-Za-z])[A-Za-z0-9_\-]{32,}\b")


def _path(match: re.Match[str]) -> str:
    text = match.group(0)
    return text if _POSIX_ROOT_ONLY.match(text) else "<path>"


def scrub_text(value: str | None, *, limit: int = MAX_TEXT) -> str | None:
    """Return `value` without paths or secret-looking runs, at most `limit` characters."""
    if value is None:
        return None
    text = _PATH.sub(_path, value)
    # Most specific first: an all-digit run is a number, a hex run is a hash or id.
    text = _DIGITS.sub("<num>", text)
    text = _HEX.sub("<hex>", text)
    text = _TOKEN.sub("<token>", text)
    if len(text) > limit:
        text = text[: limit - len(ELLIPSIS)] + ELLIPSIS
    return text


# The free-text fields of each record kind and how much of each is kept.
FREE_TEXT: dict[type[Any], dict[str, int]] = {
    p.DeviceEvent: {"detail": MAX_TEXT},
    p.HostEvent: {"comm": MAX_TEXT},
    p.Process: {"reason": 64, "error_type": 128, "message": MAX_TEXT},
    p.Checkpoint: {"detail": MAX_TEXT},
    p.Transition: {"reason": 64},
}


def scrub_record(rec: Any) -> None:
    """Scrub `rec`'s free-text fields in place (a decoded, validated contract record)."""
    for field, limit in FREE_TEXT.get(type(rec), {}).items():
        value = getattr(rec, field)
        if value is not None:
            setattr(rec, field, scrub_text(value, limit=limit))
