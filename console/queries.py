"""Reads for pages, the API and live payloads, with their joins baked in (no N+1)."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Prefetch, Q, QuerySet

from console import events
from console.models import ConsistencyGroup, Device, Incident, Node, Rank


def nodes_with_devices(names: list[str] | None = None) -> QuerySet[Node]:
    qs = Node.objects.prefetch_related(
        Prefetch("devices", queryset=Device.objects.order_by("index"))
    ).order_by("name")
    return qs.filter(name__in=names) if names is not None else qs


def node_payload(node: Node) -> events.NodePayload:
    return {
        "name": node.name,
        "health": node.health,
        "last_seen": node.last_seen.isoformat() if node.last_seen else None,
        "quarantined": node.quarantined,
        "cordoned": node.cordoned,
        "devices": [
            {
                "uuid": d.uuid,
                "index": d.index,
                "health": d.health,
                "temp_c": d.last_sample.get("temp_c"),
                "power_w": d.last_sample.get("power_w"),
                "util_pct": d.last_sample.get("util_pct"),
                "sm_clock_mhz": d.last_sample.get("sm_clock_mhz"),
                "throttle_reasons": d.last_sample.get("throttle_reasons") or [],
            }
            for d in node.devices.all()
        ],
    }


def node_payloads(names: list[str] | None = None) -> list[events.NodePayload]:
    return [node_payload(n) for n in nodes_with_devices(names)]


def groups_on_nodes(names: list[str]) -> list[str]:
    return list(
        Rank.objects.filter(node__name__in=names).values_list("group__name", flat=True).distinct()
    )


def groups_overview() -> QuerySet[ConsistencyGroup]:
    return ConsistencyGroup.objects.annotate(
        open_incidents=Count("incidents", filter=~Q(incidents__state="resolved")),
        rank_count=Count("ranks", distinct=True),
    ).order_by("name")


def open_incidents() -> QuerySet[Incident]:
    return Incident.objects.exclude(state="resolved").select_related("group")


def dispatchable_actions(node: Node) -> list[dict[str, Any]]:
    """Approved actions waiting for this node's agent."""
    return []
