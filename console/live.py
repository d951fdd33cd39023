"""After-commit hand-off from ingest: live websocket updates and debounced diagnosis.

Both are best-effort by design: if Redis is down the batch is already stored, the page shows
its "live connection lost" banner, and the periodic sweep diagnoses the touched groups once
the broker is back. Nothing here may raise into the ingest response.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from console import events, queries

log = logging.getLogger(__name__)


def publish(channel: str, kind: str, data: Any) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(
            channel, {"type": "push", "event": events.make_event(kind, data)}
        )
    except Exception:  # live updates must never break a write
        log.warning("live: could not publish %s to %s", kind, channel, exc_info=True)


# Per web process: when each node's card was last pushed. Agents report every second; the
# fleet page needs at most one update per node per second, urgent ones (device events) at
# once. Losing this on a restart only means one extra push.
_last_push: dict[str, float] = {}
PUSH_EVERY_S = 1.0


def after_ingest(*, groups: list[str], nodes: list[str], urgent: bool = False) -> None:
    now = time.monotonic()
    due = [n for n in nodes if urgent or now - _last_push.get(n, 0.0) >= PUSH_EVERY_S]
    if due:
        for node in queries.node_payloads(names=due):
            publish(events.FLEET, "node.changed", node)
            _last_push[node["name"]] = now
    # A device event (Xid, GPU lost) names no group: diagnose every group with ranks on the
    # node at once, so the root cause is named within a second, not at the next sweep.
    targets = set(groups) | (set(queries.groups_on_nodes(nodes)) if urgent else set())
    for name in sorted(targets):
        schedule_diagnosis(name)


PENDING_TIMEOUT_S = 5


def schedule_diagnosis(group: str) -> None:
    """Debounce: at most one pending diagnosis per group per debounce window."""
    from console.tasks import diagnose_group

    delay_ms = settings.DIAGNOSIS_DEBOUNCE_MS
    try:
        # The task deletes this key when it starts, so a batch arriving during a run
        # schedules the next one; the timeout only guards against a lost task (a worker
        # killed holding it). Keep it short: the sweep also goes through this key, so a
        # lost task silences the group's diagnosis until the key expires (30 s measured
        # with 30; docs/reliability.md). A too-early expiry only costs one extra run.
        if not cache.add(pending_key(group), 1, timeout=PENDING_TIMEOUT_S):
            return
        diagnose_group.apply_async(args=[group], countdown=delay_ms / 1000)
    except Exception:  # broker down: the sweep catches up
        log.warning("live: could not schedule diagnosis of %s", group, exc_info=True)


def pending_key(group: str) -> str:
    return f"diag-pending:{group}"


def actions_for_node(node: Any) -> list[dict[str, Any]]:
    """Approved actions for this node ride back on the ingest response.

    Handing an action to its agent is its dispatch, so this goes through the write path
    (every gate re-checked at dispatch), not through a read in console.queries.
    """
    from console.remediation import dispatch_for_node

    return dispatch_for_node(node=node, now=timezone.now())
