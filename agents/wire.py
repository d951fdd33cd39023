"""Small helpers that shape values for the v1 wire contract (DESIGN.md §3).

Owns timestamp formatting and the non-finite-float rule. Standard library only; it must not
know about transports, spools or the service.
"""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime
from typing import Any

Record = dict[str, Any]

# The largest batch body (uncompressed JSON) ingest accepts; agents/protocol.py re-exports
# it for the service. It lives here because the agent's runtime is stdlib only.
MAX_BATCH_BYTES = 8 * 1024 * 1024
# The longest an agent holds a record before sending it (its `send_interval` may not exceed
# it; events and process exits go at once). The service calls a node silent after 10 s
# without news, and an incident's verdict may be revised for this long after it opened: by
# then every node's records of the moment have arrived (docs/diagnosis.md, "Ordering").
MAX_SEND_INTERVAL_S = 5.0


_second_cache: tuple[int, str] = (-1, "")

_STEP_ID = re.compile(r"g([0-9]{1,10}):s([0-9]{1,19})")


def step_id(generation: int, step: int) -> str:
    """The logical step's stable correlation id, `g<generation>:s<step>`: the same on every
    rank of a generation (its step, collective and probe records carry it), different when
    a later generation re-runs the step."""
    return f"g{generation}:s{step}"


def parse_step_id(value: object) -> tuple[int, int] | None:
    """(generation, step) of a `step_id`; None for anything else (an older agent's or a
    foreign id is no correlation, not an error)."""
    if not isinstance(value, str):
        return None
    m = _STEP_ID.fullmatch(value)
    return (int(m.group(1)), int(m.group(2))) if m else None


def iso_ts(epoch: float | None = None) -> str:
    """ISO 8601 UTC with milliseconds and a `Z`, e.g. 2026-11-29T10:00:00.123Z.

    The formatted second is cached: the reporter stamps every call inside a training loop
    and must stay within a few microseconds.
    """
    global _second_cache
    now = time.time() if epoch is None else epoch
    whole = int(now)
    cached_second, prefix = _second_cache
    if cached_second != whole:
        prefix = datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        _second_cache = (whole, prefix)
    return f"{prefix}{int((now - whole) * 1000):03d}Z"


def real(value: float | int | None) -> float | int | str | None:
    """A number as JSON can carry it: NaN/inf become "NaN"/"Infinity"/"-Infinity".

    Losing a NaN loss would hide the very fault the console exists to catch, so non-finite
    values travel as the contract's strings rather than being dropped or zeroed.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        if math.isnan(value):
            return "NaN"
        return "Infinity" if value > 0 else "-Infinity"
    return value


def record(kind: str, ts: str | None = None, **fields: Any) -> Record:
    """A record dict with `kind` and `ts` first; None-valued fields are omitted."""
    out: Record = {"kind": kind, "ts": ts or iso_ts()}
    for key, value in fields.items():
        if value is not None:
            out[key] = value
    return out
