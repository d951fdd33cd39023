"""Where a node's fault sits, as the remediation table reads it (docs/safety.md).

Owns reading a node's placement from the inventory: hosting ranks of a training group that
is neither completed nor stopped, hosting a serving worker that reported in the last
SERVING_RECENT, a launcher-only host (no GPU, rank or worker of its own), or idle. Reads
only; the policy (console.policy.remediation) decides what each placement calls for.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import F

from console.choices import TERMINAL_GROUP_STATES, GroupKind, GroupState
from console.models import ConsistencyGroup, Device, Node, Rank
from console.policy import remediation as rp
from console.queries.telemetry import serving_windows

SERVING_RECENT = timedelta(minutes=5)
# A failed group still counts as placed (docs/safety.md): its ranks are what a restart of
# it brings back, so only a completed or stopped group has left its nodes.
_ENDED = tuple(s for s in TERMINAL_GROUP_STATES if s != GroupState.FAILED)


def placement_of(node: Node, *, now: datetime) -> str:
    """rp.RANKS, rp.SERVING, rp.LAUNCHER or rp.IDLE for this node now."""
    live = ConsistencyGroup.objects.exclude(state__in=_ENDED)
    serving = list(live.filter(kind=GroupKind.SERVING).values_list("pk", flat=True))
    if node.pk in serving_windows.serving_nodes(serving, since=now - SERVING_RECENT):
        return rp.SERVING
    hosting = Rank.objects.filter(
        node=node, group__in=live.exclude(kind=GroupKind.SERVING), generation=F("group__generation")
    )
    if hosting.exists():
        return rp.RANKS
    if (
        not Device.objects.filter(node=node).exists()
        and not Rank.objects.filter(node=node).exists()
    ):
        return rp.LAUNCHER
    return rp.IDLE
