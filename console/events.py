"""Typed websocket payloads: what live pages receive, shaped like the REST API's answers.

Every message carries `type` and a monotonically increasing `version` (milliseconds since
the epoch at publish) so a page that reconnects can refetch anything newer than it saw.
"""

from __future__ import annotations

import time
from typing import Any, Literal, TypedDict

FLEET = "fleet"


def group_channel(name: str) -> str:
    # Channels group names allow only ASCII alphanumerics, hyphens, underscores and periods.
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return f"group.{safe}"[:99]


class NodeDevice(TypedDict):
    uuid: str
    index: int
    health: str
    temp_c: float | None
    power_w: float | None
    util_pct: float | None
    sm_clock_mhz: float | None
    throttle_reasons: list[str]


class NodePayload(TypedDict):
    name: str
    health: str
    last_seen: str | None
    quarantined: bool
    cordoned: bool
    devices: list[NodeDevice]


class Event(TypedDict):
    type: Literal[
        "node.changed", "group.changed", "incident.changed", "action.changed", "breaker.changed"
    ]
    version: int
    data: Any


def make_event(kind: str, data: Any) -> Event:
    return {"type": kind, "version": time.time_ns() // 1_000_000, "data": data}  # type: ignore[typeddict-item]
