"""Server-rendered pages: fetch through console.queries, render a template. Thin."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from console import queries
from console.models import Incident


@login_required
def fleet(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "console/fleet.html",
        {
            "nodes": queries.node_payloads(),
            "groups": queries.groups_overview(),
            "incidents": queries.open_incidents()[:50],
        },
    )


@login_required
def group_page(request: HttpRequest, name: str) -> HttpResponse:
    group = get_object_or_404(queries.groups_overview(), name=name)
    return render(
        request,
        "console/group.html",
        {"group": group, "incidents": group.incidents.order_by("-opened_at")[:50]},
    )


@login_required
def incident_page(request: HttpRequest, pk: int) -> HttpResponse:
    incident = get_object_or_404(
        Incident.objects.select_related("group").prefetch_related("alerts"), pk=pk
    )
    symptoms = [a for a in incident.alerts.all() if a.role == "symptom"]
    return render(
        request,
        "console/incident.html",
        {"incident": incident, "symptoms": symptoms[:500], "symptom_total": len(symptoms)},
    )
