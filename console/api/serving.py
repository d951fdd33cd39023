"""Serving endpoints: a group's SLO (read, replace) and its serving overview."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console import actions, serving
from console.api.permissions import IsViewer, allows
from console.diagnosis.records import SLO_KEYS
from console.models import ConsistencyGroup
from console.policy.roles import Permission

SloSerializer = inline_serializer(
    name="Slo", fields={key: serializers.FloatField(required=False) for key in SLO_KEYS}
)


class GroupSlo(APIView):
    """GET the effective SLO; PUT replaces the overrides (operator+, audited)."""

    permission_classes = [allows(write=Permission.SET_GROUP_OBJECTIVES)]

    @extend_schema(responses=SloSerializer)
    def get(self, request: Request, name: str) -> Response:
        group = get_object_or_404(ConsistencyGroup, name=name)
        return Response(serving.effective_slo(group))

    @extend_schema(request=SloSerializer, responses=SloSerializer)
    def put(self, request: Request, name: str) -> Response:
        get_object_or_404(ConsistencyGroup, name=name)
        if not isinstance(request.data, dict):
            return Response({"error": "the body must be a JSON object"}, status=400)
        try:
            group = actions.set_group_slo(
                group_name=name, slo=dict(request.data), actor=request.user, now=timezone.now()
            )
        except actions.SloError as exc:
            return Response({"error": str(exc)}, status=400)
        return Response(serving.effective_slo(group))


class GroupServing(APIView):
    """G_serve over the last hour, each worker's newest window, and per-version traffic."""

    permission_classes = [IsViewer]

    @extend_schema(
        responses=inline_serializer(
            name="ServingOverview",
            fields={
                "group": serializers.CharField(),
                "slo": SloSerializer,
                "g_serve": serializers.FloatField(allow_null=True),
                "workers": serializers.ListField(child=serializers.DictField()),
                "versions": serializers.ListField(child=serializers.DictField()),
                "series": serializers.ListField(child=serializers.DictField()),
            },
        )
    )
    def get(self, request: Request, name: str) -> Response:
        group = get_object_or_404(ConsistencyGroup, name=name)
        return Response(serving.overview(group, timezone.now()))
