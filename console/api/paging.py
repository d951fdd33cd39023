"""REST for paging configuration: silences, escalation policies, notification channels.

Thin adapters: validate with a serializer, call one console.actions verb, render. A
refusal is raised and becomes JSON `{"error": ...}` in console/api/errors.py.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from rest_framework import generics
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response

from console import actions
from console.api.actions import by_method
from console.api.permissions import IsAdmin, IsOperator
from console.api.remediation_serializers import (
    ChannelSerializer,
    PolicySerializer,
    SilenceSerializer,
)
from console.models import EscalationPolicy, NotificationChannel, Silence


class SilenceList(generics.ListCreateAPIView):
    """Silences (viewer+ read, operator+ create; at most 72 h, reason required)."""

    serializer_class = SilenceSerializer

    def get_permissions(self) -> list[BasePermission]:
        return by_method(self.request, IsOperator)

    def get_queryset(self) -> QuerySet[Silence]:
        return Silence.objects.select_related("created_by")

    def post(self, request: Request) -> Response:
        data = SilenceSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        now = timezone.now()
        silence = actions.create_silence(
            matchers=v["matchers"],
            starts_at=v.get("starts_at") or now,
            ends_at=v["ends_at"],
            reason=v["reason"],
            actor=request.user,
            now=now,
        )
        return Response(SilenceSerializer(silence).data, status=201)


class SilenceDetail(generics.RetrieveDestroyAPIView):
    """Read a silence, or end it now (DELETE, operator+); the row is kept for the record."""

    serializer_class = SilenceSerializer

    def get_permissions(self) -> list[BasePermission]:
        return by_method(self.request, IsOperator)

    def get_queryset(self) -> QuerySet[Silence]:
        return Silence.objects.select_related("created_by")

    def delete(self, request: Request, pk: int) -> Response:
        silence = actions.expire_silence(silence_id=pk, actor=request.user, now=timezone.now())
        return Response(SilenceSerializer(silence).data)


class PolicyList(generics.ListCreateAPIView):
    """Escalation policies (viewer+ read, admin write)."""

    serializer_class = PolicySerializer
    queryset = EscalationPolicy.objects.all()

    def get_permissions(self) -> list[BasePermission]:
        return by_method(self.request, IsAdmin)

    def post(self, request: Request) -> Response:
        data = PolicySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        row = actions.save_escalation_policy(
            actor=request.user, now=timezone.now(), **data.validated_data
        )
        return Response(PolicySerializer(row).data, status=201)


class PolicyDetail(generics.RetrieveUpdateDestroyAPIView):
    serializer_class = PolicySerializer
    queryset = EscalationPolicy.objects.all()

    def get_permissions(self) -> list[BasePermission]:
        return by_method(self.request, IsAdmin)

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        row = self.get_object()
        data = PolicySerializer(row, data=request.data, partial=kwargs.get("partial", False))
        data.is_valid(raise_exception=True)
        saved = actions.save_escalation_policy(
            actor=request.user, now=timezone.now(), policy_id=row.pk, **data.validated_data
        )
        return Response(PolicySerializer(saved).data)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        row = self.get_object()
        actions.delete_escalation_policy(policy_id=row.pk, actor=request.user, now=timezone.now())
        return Response(status=204)


class ChannelList(generics.ListCreateAPIView):
    """Notification channels (admin only: they hold secrets and decide who is paged)."""

    serializer_class = ChannelSerializer
    queryset = NotificationChannel.objects.all()
    permission_classes = [IsAdmin]

    def post(self, request: Request) -> Response:
        data = ChannelSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        row = actions.save_channel(actor=request.user, now=timezone.now(), **data.validated_data)
        return Response(ChannelSerializer(row).data, status=201)
