"""Reads of the console's own tables for pages, the API and live payloads (no N+1).

Owns the fleet-side reads: groups with their counts, open incidents, node cards. Must not
read ingest's telemetry tables (that is `console.queries.telemetry`) or write anything.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

from django.db import connection
from django.db.models import Count, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce

from console import delivery, events
from console.models import Action, ConsistencyGroup, Device, HealthEvent, Incident, Node, Rank

_T = TypeVar("_T")


def groups_on_nodes(names: list[str]) -> list[str]:
    return list(
        Rank.objects.filter(node__name__in=names).values_list("group__name", flat=True).distinct()
    )


def groups_overview() -> QuerySet[ConsistencyGroup]:
    """Groups with their open incidents and ranks, each counted in its own subquery.

    Not two joined `Count(distinct=True)`: the join repeats each group's whole row
    (summary JSON and all) once per rank x incident and sorts that, which spilled 13 MB to
    disk for one 16,384-rank group and cost the fleet page 50-330 ms.
    """
    return ConsistencyGroup.objects.annotate(
        open_incidents=_count(Incident.objects.exclude(state="resolved")),
        rank_count=_count(Rank.objects.all()),
    ).order_by("name")


def _count(rows: QuerySet[Any]) -> Coalesce:
    """`count(*)` of these rows per outer group, 0 when it has none."""
    per_group = rows.filter(group=OuterRef("pk")).order_by().values("group")
    counted = per_group.annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), 0)


def open_incidents() -> QuerySet[Incident]:
    return Incident.objects.exclude(state="resolved").select_related("group", "node")


def node_payloads(
    names: list[str] | None = None,
    labels: dict[str, str] | None = None,
    hardware: str | None = None,
) -> list[events.NodePayload]:
    """Node cards for live pushes, the node page and a small fleet grid, in one query.

    No model instances: at 2,048 nodes x 8 GPUs, building Device models and decoding every
    `last_sample` costs more than the page; this reads just the fields the grid shows.
    """
    ids_sql, ids_params = _node_ids(names, labels, hardware)
    with connection.cursor() as cur:
        cur.execute(_PAYLOADS.format(ids=ids_sql, devices=_DEVICES), ids_params)
        rows = cur.fetchall()
    return _decoded(_cards, rows)


class FleetNode(TypedDict):
    """One node of the fleet grid: its name, GPU count and full card, or no card when it is a
    tile of a compact grid (healthy and unflagged, so there is nothing more to show)."""

    name: str
    gpus: int
    card: events.NodePayload | None


def fleet_grid(
    labels: dict[str, str] | None = None,
    hardware: str | None = None,
    *,
    compact_above: int,
) -> tuple[list[FleetNode], bool]:
    """The fleet grid's nodes in name order, in one query, and whether the grid is compact.

    A grid of more than `compact_above` nodes is compact: there a healthy, unflagged node
    (its own and every GPU's health `ok`, not quarantined, cordoned or latched) is a tile,
    which shows no GPU, so Postgres builds no GPU list for it. Building 16k GPUs' JSON was
    most of a 2,048-node page; a sick fleet still gets every sick node's card.
    """
    ids_sql, ids_params = _node_ids(None, labels, hardware)
    with connection.cursor() as cur:
        cur.execute(_GRID.format(ids=ids_sql, devices=_DEVICES), [*ids_params, compact_above])
        rows = cur.fetchall()
    compact = bool(rows) and rows[0][-1] > compact_above
    return _decoded(_grid_nodes, rows), compact


def _node_ids(
    names: list[str] | None, labels: dict[str, str] | None, hardware: str | None
) -> tuple[str, tuple[Any, ...]]:
    """The SQL (and its parameters) selecting the ids of the nodes these filters keep."""
    nodes = Node.objects.all()
    if names is not None:
        nodes = nodes.filter(name__in=names)
    if labels:
        nodes = nodes.filter(labels__contains=labels)
    if hardware == "out_of_service":  # every node with a latched fault or a mark
        nodes = nodes.filter(~Q(lifecycle="healthy") | Q(cordoned=True) | Q(quarantined=True))
    elif hardware == "repeat_offenders":
        nodes = nodes.filter(replace_flagged=True)
    return nodes.values("pk").query.sql_with_params()


def _decoded(decode: Callable[[list[tuple[Any, ...]]], _T], rows: list[tuple[Any, ...]]) -> _T:
    # 16k small dicts at 16k GPUs: without the collector's passes over a loaded process
    # (each full one walks every Django object) decoding them costs 20 ms, not 30-180.
    collect = gc.isenabled()
    gc.disable()
    try:
        return decode(rows)
    finally:
        if collect:
            gc.enable()


def _cards(rows: list[tuple[Any, ...]]) -> list[events.NodePayload]:
    return [events.node_payload(row) for row in rows]


def _grid_nodes(rows: list[tuple[Any, ...]]) -> list[FleetNode]:
    return [
        {
            "name": row[0],
            "gpus": row[12],
            "card": None if row[13] else events.node_payload(row[:12]),
        }
        for row in rows
    ]


# One node's GPU list as JSON: Postgres builds it, decoded once per node, so no per-GPU
# Python object or JSON decode (the per-field decodes of `last_sample` were most
# of a 2,048-node page). The same fields as ingest's NODE_CARD (ingest.store.fleet_card),
# which a test holds equal.
_DEVICES = """coalesce((
    SELECT json_agg(json_build_object(
        'uuid', d.uuid, 'index', d.index, 'health', d.health,
        'temp_c', d.last_sample -> 'temp_c', 'power_w', d.last_sample -> 'power_w',
        'util_pct', d.last_sample -> 'util_pct', 'sm_clock_mhz', d.last_sample -> 'sm_clock_mhz',
        'throttle_reasons',
        coalesce(nullif(d.last_sample -> 'throttle_reasons', 'null'::jsonb), '[]'::jsonb),
        'lifecycle', d.lifecycle
    ) ORDER BY d.index, d.id) FROM console_device d WHERE d.node_id = n.id), '[]')::text"""

# Node cards with their GPUs, one row per node, in `events.node_payload`'s column order.
_PAYLOADS = """
SELECT n.name, n.health, n.last_seen, n.quarantined, n.cordoned, {devices},
    n.lifecycle, n.lifecycle_reason, n.lifecycle_since, n.taken_out_by, n.replace_flagged,
    n.delivery_delay_s
FROM console_node n WHERE n.id IN ({ids}) ORDER BY n.name
"""

# The grid: the card's columns (a tile's GPUs and times NULL: it shows none), then the GPU
# count, whether the node is a tile, and how many nodes the grid has. The tile rule is this
# one expression (the fleet page's script applies the same one to a live push);
# `worst_health` is `ok` exactly when every health is `ok`. CASE runs the GPU subquery
# only for the rows that show GPUs.
_GRID = """
WITH kept AS (SELECT id, count(*) OVER () AS total FROM console_node WHERE id IN ({ids})),
gpus AS (
    SELECT d.node_id, count(*) AS gpus, bool_and(d.health = 'ok') AS ok
    FROM console_device d JOIN kept ON kept.id = d.node_id GROUP BY d.node_id
),
grid AS (
    SELECT n.*, coalesce(g.gpus, 0) AS gpu_count, kept.total, kept.total > %s
        AND n.health = 'ok' AND coalesce(g.ok, true) AND NOT n.quarantined
        AND NOT n.cordoned AND n.lifecycle = 'healthy' AS tile
    FROM kept JOIN console_node n ON n.id = kept.id LEFT JOIN gpus g ON g.node_id = n.id
)
SELECT n.name, n.health, CASE WHEN n.tile THEN NULL ELSE n.last_seen END, n.quarantined,
    n.cordoned, CASE WHEN n.tile THEN NULL ELSE {devices} END,
    n.lifecycle, n.lifecycle_reason, CASE WHEN n.tile THEN NULL ELSE n.lifecycle_since END,
    n.taken_out_by, n.replace_flagged, n.delivery_delay_s, n.gpu_count, n.tile, n.total
FROM grid n ORDER BY n.name
"""


def node_detail(name: str) -> dict[str, Any] | None:
    """One node for its page and `GET /api/v1/nodes/<name>/`: card, GPUs with their
    lifecycle, fault history (newest first), its incidents and those linked to them, its
    actions, and how late its data arrives (console.delivery)."""
    node = Node.objects.filter(name=name).first()
    if node is None:
        return None
    cards = node_payloads(names=[name])
    gpus = list(
        Device.objects.filter(node=node)
        .order_by("index")
        .values(
            "uuid",
            "index",
            "health",
            "lifecycle",
            "lifecycle_reason",
            "lifecycle_since",
            "repair_needed",
            "taken_out_by",
            "replace_flagged",
            "isolated",
            "last_seen",
        )
    )
    history = list(
        HealthEvent.objects.filter(node=node)
        .order_by("-at", "-id")[:200]
        .values("at", "gpu", "kind", "before", "after", "reason", "actor", "evidence")
    )
    own = list(Incident.objects.filter(node=node).order_by("-opened_at")[:50])
    linked = list(
        Incident.objects.filter(root_incident__in=own)
        .select_related("group")
        .order_by("-opened_at")[:50]
    )
    acts = list(
        Action.objects.filter(node=node)
        .order_by("-proposed_at")[:50]
        .values("id", "kind", "target", "state", "reason", "proposed_at", "outcome")
    )
    return {
        "node": node,
        "delivery": delivery.of_node(node.delivery_delay_s, node.delivery_delays),
        "card": cards[0],
        "gpus": gpus,
        "history": history,
        "incidents": own,
        "linked_incidents": linked,
        "actions": acts,
    }


def group_incidents(group: ConsistencyGroup, limit: int = 50) -> list[Incident]:
    return list(group.incidents.select_related("assignee").order_by("-opened_at")[:limit])
