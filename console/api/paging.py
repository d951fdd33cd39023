"""REST for paging configuration: silences, escalation policies, notification channels.

Thin adapters: validate with a serializer, call one console.actions verb, render. Each
view names the table's Permission for its writes (refused early, before validation); the
verb asks the table again and decides. A refusal is raised and becomes JSON
`{"error": ...}` in console/api/errors.py. Channels are not even read below
manage_channels (they hold secrets).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console import actions
from console.actions import notifications
from console.api.permissions import allows
from console.api.remediation_serializers import (
    ChannelSerializer,
    PolicySerializer,
    SilenceSerializer,
)
from console.models import EscalationPolicy, NotificationChannel, Silence
from console.policy.roles import Permission


class SilenceList(generics.ListCreateAPIView):
    """Silences (viewer+ read, operator+ create; at most 72 h, reason required)."""

    serializer_class = SilenceSerializer
    permission_classes = [allows(write=Permission.MANAGE_SILENCES)]

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
    permission_classes = [allows(write=Permission.MANAGE_SILENCES)]

    def get_queryset(self) -> QuerySet[Silence]:
        return Silence.objects.select_related("created_by")

    def delete(self, request: Request, pk: int) -> Response:
        silence = actions.expire_silence(silence_id=pk, actor=request.user, now=timezone.now())
        return Response(SilenceSerializer(silence).data)


class PolicyList(generics.ListCreateAPIView):
    """Escalation policies (viewer+ read, admin write)."""

    serializer_class = PolicySerializer
    queryset = EscalationPolicy.objects.all()
    permission_classes = [allows(write=Permission.MANAGE_POLICIES)]

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
    permission_classes = [allows(write=Permission.MANAGE_POLICIES)]

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
    permission_classes = [allows(read=Permission.MANAGE_CHANNELS)]

    def post(self, request: Request) -> Response:
        data = ChannelSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        row = actions.save_channel(actor=request.user, now=timezone.now(), **data.validated_data)
        return Response(ChannelSerializer(row).data, status=201)


class ChannelUpdate(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["webhook", "slack", "pagerduty"], required=False)
    url = serializers.URLField(max_length=512, required=False)
    enabled = serializers.BooleanField(required=False)
    secret = serializers.CharField(max_length=256, required=False, write_only=True)


class ChannelRotate(serializers.Serializer):
    secret = serializers.CharField(max_length=256, required=False, allow_blank=True)


class ChannelDetail(generics.GenericAPIView):
    """One channel (admin): GET, PATCH kind/url/enabled/secret (audited, secret never shown)."""

    serializer_class = ChannelSerializer
    permission_classes = [allows(read=Permission.MANAGE_CHANNELS)]
    lookup_field = "name"

    def get(self, request: Request, name: str) -> Response:
        row = NotificationChannel.objects.filter(name=name).first()
        if row is None:
            return Response({"error": f"no notification channel named {name!r}"}, status=404)
        return Response(ChannelSerializer(row).data)

    def patch(self, request: Request, name: str) -> Response:
        data = ChannelUpdate(data=request.data)
        data.is_valid(raise_exception=True)
        row = notifications.update_channel(
            actor=request.user, now=timezone.now(), name=name, **data.validated_data
        )
        return Response(ChannelSerializer(row).data)


class ChannelEnable(generics.GenericAPIView):
    """POST .../disable/ or .../enable/ (admin, audited; optional reason)."""

    serializer_class = ChannelSerializer
    permission_classes = [allows(read=Permission.MANAGE_CHANNELS)]
    enabled = True

    def post(self, request: Request, name: str) -> Response:
        reason = str(request.data.get("reason", ""))[:1000] if hasattr(request.data, "get") else ""
        row = notifications.set_channel_enabled(
            actor=request.user, now=timezone.now(), name=name, enabled=self.enabled, reason=reason
        )
        return Response(ChannelSerializer(row).data)


class ChannelRotateSecret(generics.GenericAPIView):
    """POST .../rotate-secret/ (admin): the new secret is in this answer only."""

    serializer_class = ChannelRotate
    permission_classes = [allows(read=Permission.MANAGE_CHANNELS)]

    def post(self, request: Request, name: str) -> Response:
        data = ChannelRotate(data=request.data)
        data.is_valid(raise_exception=True)
        row, secret = notifications.rotate_channel_secret(
            actor=request.user,
            now=timezone.now(),
            name=name,
            secret=data.validated_data.get("secret") or None,
        )
        return Response({**ChannelSerializer(row).data, "secret": secret})
