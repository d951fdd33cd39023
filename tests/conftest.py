"""Plain helpers shared by every test package (no database, no Django), and how the suite
is split across pytest-xdist workers (`pytest -n 2 --dist loadgroup`, the README's command).

The tests that start real processes (a `faultline up`, agents, torch ranks, Slurm, a
browser: marked `slow`) are grouped by module: a module runs on one worker, in file order,
so its module-scoped service or drill run is made once (split over two workers, the quick
drill ran twice: 9 of the suite's 34 minutes) and tests that build on an earlier one's state
(a sign-in, then a rename) see it. The slow modules go first, longest first, so the two
workers finish together; the rest is spread test by test.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest

# The longest slow modules (`--durations=0`, 2026-12-07): scheduled first so that neither
# worker starts one of them last. The other slow modules follow in file order.
LONGEST_FIRST = (
    "tests/system/test_drill.py",
    "tests/system/test_chaos.py",
    "tests/system/test_browser_console.py",
    "tests/server/scenarios/test_metamorphic_ingest.py",
    "tests/system/test_remediation_loop.py",
    "tests/system/test_drill_serving_topology.py",
    "tests/system/test_soak.py",
    "tests/system/test_up.py",
)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.has_plugin("xdist"):  # -p no:xdist: no groups to place
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    for item in slow:
        item.add_marker(pytest.mark.xdist_group(_module(item)))
    rank = {module: i for i, module in enumerate(LONGEST_FIRST)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(
        key=lambda item: (
            item.get_closest_marker("slow") is None,
            rank.get(_module(item), len(rank)),
            order[id(item)],
        )
    )


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
