"""Recovery objectives of a group: read the effective set with where each key came
from, replace the operator's (operator or admin, audited through console.actions), and the
checkpoint-interval / hot-spare advice computed from the group's own numbers."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents.protocol import DATA_CONSISTENCY, SERVING_SEMANTICS
from console import actions
from console.api.permissions import allows
from console.models import ConsistencyGroup
from console.policy.roles import Permission
from console.queries import objectives as queries

ObjectivesSerializer = inline_serializer(
    name="Objectives",
    fields={
        "rpo_steps": serializers.IntegerField(required=False, min_value=1),
        "rpo_minutes": serializers.FloatField(required=False),
        "rto_s": serializers.FloatField(required=False),
        "consistency": serializers.ChoiceField(choices=DATA_CONSISTENCY, required=False),
        "semantics": serializers.ChoiceField(choices=SERVING_SEMANTICS, required=False),
        "goodput_target": serializers.FloatField(required=False),
    },
)
ObjectivesView = inline_serializer(
    name="GroupObjectives",
    fields={
        "objectives": serializers.DictField(),
        "declared": serializers.DictField(),
        "advice": serializers.DictField(),
    },
)


def payload(group: ConsistencyGroup) -> dict[str, Any]:
    """What GET answers and the group page shows."""
    return queries.objectives_and_advice(group, now=timezone.now())


class GroupObjectives(APIView):
    """GET the effective objectives and advice (viewer+); PUT replaces the operator's
    objectives (operator and above), audited."""

    permission_classes = [allows(write=Permission.SET_GROUP_OBJECTIVES)]

    @extend_schema(responses=ObjectivesView)
    def get(self, request: Request, name: str) -> Response:
        return Response(payload(get_object_or_404(ConsistencyGroup, name=name)))

    @extend_schema(request=ObjectivesSerializer, responses=ObjectivesView)
    def put(self, request: Request, name: str) -> Response:
        get_object_or_404(ConsistencyGroup, name=name)
        if not isinstance(request.data, dict):
            return Response({"error": "the body must be a JSON object"}, status=400)
        group = actions.set_group_objectives(
            group_name=name, objectives=dict(request.data), actor=request.user, now=timezone.now()
        )
        return Response(payload(group))
