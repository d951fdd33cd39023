"""A sample notification for payload tests."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from console.notify.message import Event, Notification

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def notification(**changes: Any) -> Notification:
    base = Notification(
        event=Event.TRIGGER,
        incident_id="inc-42",
        dedup_key="faultline:inc-42",
        title="Xid 79 on node-017 stalled group llama",
        severity="critical",
        subject="gpu:GPU-5e1c",
        occurred_at=NOW,
        group="llama",
        root_cause="gpu_lost",
        role="root_cause",
        url="https://faultline.example/incidents/inc-42",
        evidence={"xid": 79, "node": "node-017"},
    )
    return replace(base, **changes)
