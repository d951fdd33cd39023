"""Plain helpers shared by every test package (no database, no Django), and how the suite
is split across pytest-xdist workers (`pytest -n 2 --dist loadgroup`, the README's command).

The tests that start real processes (a `faultline up`, agents, torch ranks, Slurm, a
browser: marked `slow`) run one after another on one worker, in file order, as they would
alone: several services at once on a 2-core machine would change the timing they measure,
and the system modules share a session's service. Everything else is spread over the
other workers.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest

SLOW_GROUP = "processes"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.has_plugin("xdist"):  # -p no:xdist: no groups to place
        return
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.xdist_group(SLOW_GROUP))


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
