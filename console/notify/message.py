"""The channel-neutral notification every payload builder reads.

Owns what an outbound notification may carry: ids, versions, state and short evidence,
never prompts, generated text or tokens (correctness contract 8). It must not know any
channel's format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class Event(StrEnum):
    TRIGGER = "trigger"
    ACKNOWLEDGE = "acknowledge"
    RESOLVE = "resolve"


@dataclass(frozen=True)
class Notification:
    """One incident event to send. `dedup_key` is stable for the incident's lifetime,
    so a channel folds trigger, acknowledge and resolve into one alert."""

    event: Event
    incident_id: str
    dedup_key: str
    title: str
    severity: str
    subject: str
    occurred_at: datetime
    group: str | None = None
    root_cause: str | None = None
    role: str | None = None
    url: str | None = None
    evidence: Mapping[str, str | int | float | bool | None] = field(default_factory=dict)
