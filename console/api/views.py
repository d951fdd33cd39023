"""REST endpoints: validate query parameters, call one query, render. Nothing else."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Prefetch, QuerySet
from django.http import QueryDict
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.exceptions import ValidationError

from console import queries
from console.api import serializers as s
from console.choices import IncidentState, Role
from console.models import Alert, ConsistencyGroup, Device, Incident, Node
from console.queries import launcher
from console.queries.telemetry import agent_state


class NodeList(generics.ListAPIView):
    serializer_class = s.NodeSerializer

    def get_queryset(self) -> QuerySet[Any]:
        return Node.objects.annotate(gpu_count=Count("devices")).order_by("name")


class NodeDetail(generics.RetrieveAPIView):
    """A node with its GPUs' lifecycle, its fault history and its incidents."""

    serializer_class = s.NodeDetailSerializer
    lookup_field = "name"

    def get_queryset(self) -> QuerySet[Any]:
        return Node.objects.annotate(gpu_count=Count("devices")).prefetch_related("devices")


@extend_schema(parameters=[OpenApiParameter("node", str, description="only this node's GPUs")])
class DeviceList(generics.ListAPIView):
    serializer_class = s.DeviceSerializer

    def get_queryset(self) -> QuerySet[Any]:
        qs = Device.objects.select_related("node").order_by("node__name", "index")
        node = self.request.query_params.get("node")
        if node:
            get_object_or_404(Node, name=node)
            qs = qs.filter(node__name=node)
        return qs


class AgentList(generics.ListAPIView):
    serializer_class = s.AgentSerializer

    def get_queryset(self) -> QuerySet[Any]:
        return agent_state.agents()


class GroupList(generics.ListAPIView):
    serializer_class = s.GroupSerializer

    def get_queryset(self) -> QuerySet[Any]:
        return queries.groups_overview()


class GroupDetail(generics.RetrieveAPIView):
    serializer_class = s.GroupDetailSerializer
    lookup_field = "name"
    lookup_value_regex = "[^/]+"

    def get_queryset(self) -> QuerySet[Any]:
        return queries.groups_overview()


def _choice(params: QueryDict, name: str, allowed: list[str]) -> str | None:
    value = params.get(name)
    if value is not None and value not in allowed:
        raise ValidationError({name: f"must be one of {', '.join(allowed)}, got {value!r}"})
    return value


@extend_schema(
    parameters=[
        OpenApiParameter("group", str),
        OpenApiParameter("state", str, enum=IncidentState.values),
    ]
)
class IncidentList(generics.ListAPIView):
    serializer_class = s.IncidentSerializer

    def get_queryset(self) -> QuerySet[Any]:
        qs = Incident.objects.select_related("group", "node").prefetch_related(
            Prefetch("alerts", queryset=Alert.objects.order_by("subject")), "external_alerts"
        )
        group = self.request.query_params.get("group")
        if group:
            get_object_or_404(ConsistencyGroup, name=group)
            qs = qs.filter(group__name=group)
        state = _choice(self.request.query_params, "state", IncidentState.values)
        if state:
            qs = qs.filter(state=state)
        return qs.order_by("-opened_at")

    def paginate_queryset(self, queryset: Any) -> Any:
        page = super().paginate_queryset(queryset)
        # The page's launcher root causes in one query, not one per incident.
        self.launcher_root_causes = launcher.launcher_root_causes(
            page if page is not None else queryset
        )
        return page

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        known = getattr(self, "launcher_root_causes", None)
        return context if known is None else {**context, "launcher_root_causes": known}


class IncidentDetail(generics.RetrieveAPIView):
    serializer_class = s.IncidentSerializer

    def get_queryset(self) -> QuerySet[Any]:
        return Incident.objects.select_related("group", "node").prefetch_related(
            "alerts", "external_alerts"
        )

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "symptom_limit": 10_000, "live_costs": True}


@extend_schema(
    parameters=[
        OpenApiParameter("group", str),
        OpenApiParameter("role", str, enum=Role.values),
        OpenApiParameter("active", bool),
    ]
)
class AlertList(generics.ListAPIView):
    serializer_class = s.AlertSerializer

    def get_queryset(self) -> QuerySet[Any]:
        qs = Alert.objects.select_related("incident__group").order_by("-last_seen")
        params = self.request.query_params
        role = _choice(params, "role", Role.values)
        if role:
            qs = qs.filter(role=role)
        if params.get("group"):
            qs = qs.filter(incident__group__name=params["group"])
        active = _choice(params, "active", ["true", "false"])
        if active:
            qs = qs.filter(active=active == "true")
        return qs
