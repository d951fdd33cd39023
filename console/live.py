"""After-commit hand-off from ingest: the node card push and debounced diagnosis.

Both are best-effort by design: if Redis is down the batch is already stored, the page shows
its "live connection lost" banner, and the periodic sweep diagnoses the touched groups once
the broker is back. Nothing here may raise into the ingest response, write state, or
import ingest (ingest calls in).
"""

from __future__ import annotations

import time
from typing import Any

from console import events, queries, scheduling
from console.events import publish

# Per web process: when each node's card was last pushed. Agents report every second; the
# fleet page needs at most one update per node per second, urgent ones (device events) at
# once. Losing this on a restart only means one extra push.
_last_push: dict[str, float] = {}
PUSH_EVERY_S = 1.0


def push_due(node: str) -> bool:
    """Whether this node's card is due for a push (ingest then reads it in its last send)."""
    return time.monotonic() - _last_push.get(node, 0.0) >= PUSH_EVERY_S


def after_ingest(
    *, groups: list[str], nodes: list[str], urgent: bool = False, card: Any = None
) -> None:
    """Push the node card ingest read as it committed (`card`, when one was due or the batch
    carried a critical device event) and schedule diagnosis of the touched groups."""
    if card is not None:
        publish(events.FLEET, "node.changed", card)
        _last_push[card["name"]] = time.monotonic()
    # A device event (Xid, GPU lost) names no group: diagnose every group with ranks on the
    # node at once, so the root cause is named within a second, not at the next sweep.
    targets = set(groups) | (set(queries.groups_on_nodes(nodes)) if urgent else set())
    node = nodes[0] if len(nodes) == 1 else None  # whose urgent budget a device event spends
    for name in sorted(targets):
        scheduling.schedule_diagnosis(name, urgent=urgent, node=node)


def forget_recent() -> None:
    """Drop this process's memory of recent pushes and queued diagnoses (tests)."""
    _last_push.clear()
    scheduling.forget_recent()
