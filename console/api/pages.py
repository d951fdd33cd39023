"""The console pages' data: one builder per page, shared by the HTML view and its JSON twin.

The server-rendered page and GET /api/v1/pages/... return the same dicts, so a page that
reconnects (or receives an event) refetches exactly what it first rendered. Builders read
through console.queries (telemetry through console.queries.telemetry) and shape through
console.charts; they never write.
"""

from __future__ import annotations

import contextlib
import time
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db.models import Count
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from redis.exceptions import RedisError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents.vocab import HEALTH_OK, HEALTH_ORDER, SEVERITY_ORDER
from console import charts, queries
from console.choices import GroupState
from console.diagnosis.findings import culprit_of
from console.models import ConsistencyGroup, Incident
from console.queries import launcher, recovery
from console.queries.telemetry import checkpoint_rows, lifecycle, serving_windows, step_rows, traces
from console.serving import serving_state_of

# Chart aggregates scan every step row of the window (~1M at 16k ranks): one computation
# serves every viewer for this long unless the group has had no new activity since.
CHART_MAX_AGE_S = 5.0
# Above this many nodes the grid draws healthy nodes as compact tiles (no per-GPU cells).
COMPACT_ABOVE = 256


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat() if ts else None


def incident_row(i: Incident) -> dict[str, Any]:
    return {
        "id": i.pk,
        "group": i.group.name if i.group else None,
        "node": i.node.name if i.node_id and i.node else None,  # a fleet-scope incident
        "root_incident": i.root_incident_id,
        "generation": i.generation,
        "state": i.state,
        "kind": i.kind,
        "subject": i.subject,
        "severity": i.severity,
        "summary": i.summary,
        "symptom_count": i.symptom_count,
        "opened_at": i.opened_at.isoformat(),
        "resolved_at": _iso(i.resolved_at),
        "version": i.version,
    }


def group_row(g: ConsistencyGroup) -> dict[str, Any]:
    goodput = g.summary.get("goodput") or {}
    serving = serving_state_of(g)
    return {
        "name": g.name,
        "kind": g.kind,
        "state": serving["state"] if serving else g.state,
        "serving_state": serving,
        "generation": g.generation,
        "restart_count": g.restart_count,
        "ranks": getattr(g, "rank_count", None),
        "open_incidents": getattr(g, "open_incidents", 0),
        "g_train": goodput.get("g_train_tokens_per_s"),
        "g_serve": goodput.get("g_serve_requests_per_s"),
        "productive_fraction": goodput.get("productive_fraction"),
        "tail_ratio": g.summary.get("tail_ratio"),
        "goodput_label": _goodput_label(g.kind, goodput),
        "labels": g.labels,
    }


def _goodput_label(kind: str, goodput: dict[str, Any]) -> str:
    if not goodput:
        return "—"
    if kind == "serving":
        return charts.si(goodput.get("g_serve_requests_per_s"), "req/s")
    text = charts.si(goodput.get("g_train_tokens_per_s"), "tok/s")
    frac = goodput.get("productive_fraction")
    return f"{text} · {frac * 100:.0f}% productive" if frac is not None else text


# -- fleet ------------------------------------------------------------------------------------


def parse_label(raw: str | None) -> dict[str, str] | None:
    """`?label=pool=a100` -> {"pool": "a100"}; None when absent or malformed."""
    if not raw or "=" not in raw:
        return None
    key, _, value = raw.partition("=")
    return {key.strip(): value.strip()} if key.strip() else None


HARDWARE_FILTERS = {"out_of_service": "out of service", "repeat_offenders": "repeat offenders"}


def fleet_data(
    *, label: str | None = None, state: str | None = None, hardware: str | None = None
) -> dict[str, Any]:
    labels = parse_label(label)
    groups = queries.groups_overview()
    if labels:
        groups = groups.filter(labels__contains=labels)
    if state in GroupState.values:
        groups = groups.filter(state=state)
    hardware = hardware if hardware in HARDWARE_FILTERS else None
    grid, compact = queries.fleet_grid(labels, hardware, compact_above=COMPACT_ABOVE)
    node_rows: list[dict[str, Any]] = []
    for n in grid:
        card = n["card"]
        if card is None:
            # Big fleets: a healthy, unflagged node is one compact tile, not eight GPU
            # cells, and comes as just that (see queries.fleet_grid).
            node_rows.append(
                {"name": n["name"], "gpus": n["gpus"], "worst": HEALTH_OK, "compact": True}
            )
        else:
            worst = charts.worst_health(card)
            node_rows.append({**card, "worst": worst, "compact": False, "gpus": n["gpus"]})
    incidents = sorted(
        queries.open_incidents().order_by("-opened_at")[:100],
        key=lambda i: SEVERITY_ORDER.index(i.severity) if i.severity in SEVERITY_ORDER else 9,
    )
    counts: dict[str, int] = {h: 0 for h in HEALTH_ORDER}
    gpu_total = 0
    for row in node_rows:
        counts[row["worst"]] += 1
        gpu_total += row["gpus"]
    return {
        "filters": {"label": label or "", "state": state or "", "hardware": hardware or ""},
        "hardware_filters": HARDWARE_FILTERS,
        "compact": compact,
        "nodes": node_rows,
        "node_counts": counts,
        "gpu_total": gpu_total,
        "groups": [group_row(g) for g in groups],
        "incidents": [incident_row(i) for i in incidents],
    }


# -- group ------------------------------------------------------------------------------------


def group_data(group: ConsistencyGroup) -> dict[str, Any]:
    """Facts, goodput, checkpoints, state timeline, incidents (and serving workers)."""
    summary = group.summary or {}
    data: dict[str, Any] = {
        **group_row(group),
        "world_size": group.world_size,
        "topology": group.topology,
        "data_cursor": group.data_cursor,
        "model_version": group.model_version,
        "state_since": _iso(group.state_since),
        "last_activity": _iso(group.last_activity),
        "diagnosed_at": summary.get("diagnosed_at"),
        "goodput": summary.get("goodput"),
        "badput": charts.badput(summary.get("goodput")),
        "newest_valid_checkpoint": summary.get("newest_valid_checkpoint"),
        "recovery_advice": summary.get("recovery_advice"),
        "phase_medians_ms": summary.get("phase_medians_ms") or {},
        "utilisation": summary.get("utilisation"),
        "incidents": [incident_row(i) for i in queries.group_incidents(group)],
        "workers": [],
        "checkpoints": [],
        "states": [],
    }
    if group.kind == "serving":
        workers = serving_windows.serving_workers(group)
        data["workers"] = [{**w, "ts": w["ts"].isoformat()} for w in workers]
    else:
        data["checkpoints"] = charts.checkpoint_table(
            checkpoint_rows.group_checkpoints(group), summary.get("newest_valid_checkpoint")
        )
        data["states"] = charts.state_segments(lifecycle.group_transitions(group), timezone.now())
    return data


def group_charts(group: ConsistencyGroup) -> dict[str, Any]:
    """Heatmap, percentiles + tail ratio, slowest ranks' phases; cached briefly (see above)."""
    key = f"page-charts:{group.pk}:{group.generation}"
    activity = _iso(group.last_activity)
    try:
        hit = cache.get(key)
    except (RedisError, OSError):  # a cache outage must not take the page down
        hit = None
    if hit and (hit["activity"] == activity or time.time() - hit["at"] < CHART_MAX_AGE_S):
        return hit["data"]
    data = compute_group_charts(group)
    with contextlib.suppress(RedisError, OSError):  # best effort: the next request recomputes
        cache.set(key, {"at": time.time(), "activity": activity, "data": data}, timeout=300)
    return data


def compute_group_charts(group: ConsistencyGroup, *, rollups: bool = True) -> dict[str, Any]:
    """The chart JSON, from the step-bin rollup plus the raw open tail (`rollups=False`: raw)."""
    empty = {"heatmap": None, "percentiles": None, "slowest": None, "window": None, "scale": None}
    window = step_rows.step_window(group)
    if window is None:
        return empty
    first, newest = window
    world = max(group.world_size or 0, getattr(group, "rank_count", 0) or 0, 1)
    bins = charts.rank_bins(world)
    # Time bins are whole rollup buckets, so rollup rows add up without being split.
    grid = charts.time_grid(first, newest, step_s=step_rows.STEP_BUCKET_S)
    agg = step_rows.step_aggregates(group, world=world, grid=grid, until=newest, rollups=rollups)
    heatmap = charts.heatmap(agg["cells"], world=world, bins=bins, grid=grid)
    percentiles = charts.percentile_series(agg["percentiles"], grid=grid)
    cells = [v for row in heatmap["z"] for v in row]
    return {
        "heatmap": heatmap,
        "percentiles": percentiles,
        "scale": charts.step_scale(
            cells + percentiles["p50"], (group.summary or {}).get("step_scale_ms")
        ),
        "slowest": charts.slowest_phases(
            agg["slowest"], (group.summary or {}).get("phase_medians_ms")
        ),
        "window": {"start": first.isoformat(), "end": newest.isoformat(), "world": world},
    }


# -- incident ---------------------------------------------------------------------------------


def incident_query() -> Any:
    return Incident.objects.select_related("group", "acknowledged_by", "assignee", "root_incident")


def incident_data(incident: Incident) -> dict[str, Any]:
    alerts = list(incident.alerts.all())
    symptoms = [
        {
            "kind": a.kind,
            "subject": a.subject,
            "severity": a.severity,
            "summary": a.summary,
            "active": a.active,
            "first_seen": a.first_seen.isoformat(),
        }
        for a in alerts
        if a.role == "symptom"
    ]
    comments = [
        {"author": c.author.username, "at": c.created.isoformat(), "body": c.body}
        for c in incident.comments.all()
    ]
    root = incident.root_cause or {}
    return {
        **incident_row(incident),
        "role": incident.role,
        "acknowledged_by": incident.acknowledged_by.username if incident.acknowledged_by else None,
        "assignee": incident.assignee.username if incident.assignee else None,
        "evidence": charts.evidence_rows(root.get("evidence") or {}),
        "first_seen": root.get("first_seen"),
        "last_seen": root.get("last_seen"),
        "recovery": incident.recovery or {},
        "costs": recovery.costs_of(incident),
        "launcher_root_cause": launcher.launcher_root_cause(incident),
        "symptoms_total": len(symptoms),
        "symptom_folds": charts.symptom_groups(
            symptoms[:2000], root_kind=incident.kind, root_subject=incident.subject
        ),
        "timeline": charts.timeline(incident.timeline or {}, comments),
        "comments": comments,
        "trace": incident_trace(incident),
        "part_of": _part_of(incident.root_incident),
    }


def _part_of(root: Incident | None) -> dict[str, Any] | None:
    """The incident this one is folded under (a node's hardware fault, a fleet silence)."""
    if root is None:
        return None
    return {"id": root.pk, "kind": root.kind, "state": root.state, "summary": root.summary}


def incident_trace(incident: Incident) -> dict[str, Any] | None:
    """The one step (a rank's incident) or request window (a worker's) the incident is
    about, end to end (`traces.step_trace`, `request_trace`); None for the others."""
    root = incident.root_cause or {}
    culprit = culprit_of(incident.subject, root.get("evidence") or {})
    if incident.group is None or culprit is None:
        return None
    around = incident.opened_at
    with contextlib.suppress(TypeError, ValueError):
        around = datetime.fromisoformat(root["first_seen"]) if root.get("first_seen") else around
    kind, who = culprit
    if kind == "worker":
        trace = traces.request_trace(incident.group, worker=str(who), around=around)
    else:
        trace = traces.step_trace(
            incident.group, generation=incident.generation, rank=int(who), around=around
        )
    return {"kind": kind, **trace} if trace else None


def incident_with_related(pk: int) -> Incident:
    return get_object_or_404(incident_query().prefetch_related("alerts", "comments__author"), pk=pk)


# -- JSON twins -------------------------------------------------------------------------------


class FleetPage(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)  # the page's own dict; see the builders
    def get(self, request: Request) -> Response:
        params = request.query_params
        return Response(
            fleet_data(
                label=params.get("label"),
                state=params.get("state"),
                hardware=params.get("hardware"),
            )
        )


class GroupPage(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)  # the page's own dict; see the builders
    def get(self, request: Request, name: str) -> Response:
        return Response(group_data(get_object_or_404(queries.groups_overview(), name=name)))


class GroupCharts(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)  # the page's own dict; see the builders
    def get(self, request: Request, name: str) -> Response:
        group = get_object_or_404(
            ConsistencyGroup.objects.annotate(rank_count=Count("ranks")), name=name
        )
        return Response(group_charts(group))


class IncidentPage(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)  # the page's own dict; see the builders
    def get(self, request: Request, pk: int) -> Response:
        return Response(incident_data(incident_with_related(pk)))
