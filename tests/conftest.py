"""Plain helpers shared by every test package (no database, no Django)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

_seq = itertools.count(1)


def iso(ts: datetime | None = None) -> str:
    return (ts or datetime.now(UTC)).isoformat().replace("+00:00", "Z")


def make_batch(
    records: list[dict[str, Any]],
    *,
    node: str = "node-1",
    agent_id: str | None = None,
    seq: int | None = None,
    sent_at: datetime | None = None,
) -> dict[str, Any]:
    now = iso(sent_at)
    for rec in records:
        rec.setdefault("ts", now)
    return {
        "agent": {"id": agent_id or f"agent-{node}-0001", "node": node, "version": "test"},
        "seq": next(_seq) if seq is None else seq,
        "sent_at": now,
        "records": records,
    }
