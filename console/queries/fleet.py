"""Reads of the console's own tables for pages, the API and live payloads (no N+1).

Owns the fleet-side reads: groups with their counts, open incidents, node cards. Must not
read ingest's telemetry tables (that is `console.queries.telemetry`) or write anything.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q, QuerySet

from console import events
from console.models import Action, ConsistencyGroup, Device, HealthEvent, Incident, Node, Rank


def groups_on_nodes(names: list[str]) -> list[str]:
    return list(
        Rank.objects.filter(node__name__in=names).values_list("group__name", flat=True).distinct()
    )


def groups_overview() -> QuerySet[ConsistencyGroup]:
    return ConsistencyGroup.objects.annotate(
        # distinct: the ranks join repeats every incident once per rank.
        open_incidents=Count("incidents", filter=~Q(incidents__state="resolved"), distinct=True),
        rank_count=Count("ranks", distinct=True),
    ).order_by("name")


def open_incidents() -> QuerySet[Incident]:
    return Incident.objects.exclude(state="resolved").select_related("group", "node")


def node_payloads(
    names: list[str] | None = None,
    labels: dict[str, str] | None = None,
    hardware: str | None = None,
) -> list[events.NodePayload]:
    """Node cards for the fleet grid and its live pushes, in two flat queries.

    No model instances: at 2,048 nodes x 8 GPUs, building Device models and decoding every
    `last_sample` costs more than the page; this reads just the fields the grid shows.
    """
    nodes = Node.objects.order_by("name")
    if names is not None:
        nodes = nodes.filter(name__in=names)
    if labels:
        nodes = nodes.filter(labels__contains=labels)
    if hardware == "out_of_service":  # every node with a latched fault or a mark
        nodes = nodes.filter(~Q(lifecycle="healthy") | Q(cordoned=True) | Q(quarantined=True))
    elif hardware == "repeat_offenders":
        nodes = nodes.filter(replace_flagged=True)
    rows = list(
        nodes.values(
            "pk", "name", "health", "last_seen", "quarantined", "cordoned", "lifecycle",
            "lifecycle_reason", "lifecycle_since", "taken_out_by", "replace_flagged",
        )
    )  # fmt: skip
    devices: dict[int, list[Any]] = {r["pk"]: [] for r in rows}
    sample = ("temp_c", "power_w", "util_pct", "sm_clock_mhz", "throttle_reasons")
    qs = Device.objects.filter(node__in=nodes).order_by("node_id", "index")
    for d in qs.values(
        "node_id", "uuid", "index", "health", "lifecycle", *[f"last_sample__{k}" for k in sample]
    ):
        devices[d["node_id"]].append(
            {
                "uuid": d["uuid"],
                "index": d["index"],
                "health": d["health"],
                **{k: d[f"last_sample__{k}"] for k in sample},
                "throttle_reasons": d["last_sample__throttle_reasons"] or [],
                "lifecycle": d["lifecycle"],
            }
        )
    return [
        {
            "name": r["name"],
            "health": r["health"],
            "last_seen": r["last_seen"].isoformat() if r["last_seen"] else None,
            "quarantined": r["quarantined"],
            "cordoned": r["cordoned"],
            "devices": devices[r["pk"]],
            "lifecycle": r["lifecycle"],
            "lifecycle_reason": r["lifecycle_reason"],
            "lifecycle_since": r["lifecycle_since"].isoformat() if r["lifecycle_since"] else None,
            "taken_out_by": r["taken_out_by"],
            "replace_flagged": r["replace_flagged"],
        }
        for r in rows
    ]


def node_detail(name: str) -> dict[str, Any] | None:
    """One node for its page and `GET /api/v1/nodes/<name>/`: card, GPUs with their
    lifecycle, fault history (newest first), its incidents and those linked to them, and
    its actions."""
    node = Node.objects.filter(name=name).first()
    if node is None:
        return None
    cards = node_payloads(names=[name])
    gpus = list(
        Device.objects.filter(node=node).order_by("index").values(
            "uuid", "index", "health", "lifecycle", "lifecycle_reason", "lifecycle_since",
            "repair_needed", "taken_out_by", "replace_flagged", "isolated", "last_seen",
        )
    )  # fmt: skip
    history = list(
        HealthEvent.objects.filter(node=node).order_by("-at", "-id")[:200].values(
            "at", "gpu", "kind", "before", "after", "reason", "actor", "evidence"
        )
    )  # fmt: skip
    own = list(Incident.objects.filter(node=node).order_by("-opened_at")[:50])
    linked = list(
        Incident.objects.filter(root_incident__in=own).select_related("group")
        .order_by("-opened_at")[:50]
    )  # fmt: skip
    acts = list(
        Action.objects.filter(node=node).order_by("-proposed_at")[:50].values(
            "id", "kind", "target", "state", "reason", "proposed_at", "outcome"
        )
    )  # fmt: skip
    return {
        "node": node,
        "card": cards[0],
        "gpus": gpus,
        "history": history,
        "incidents": own,
        "linked_incidents": linked,
        "actions": acts,
    }


def group_incidents(group: ConsistencyGroup, limit: int = 50) -> list[Incident]:
    return list(group.incidents.select_related("assignee").order_by("-opened_at")[:limit])
