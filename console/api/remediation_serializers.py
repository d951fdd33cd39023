"""Serializers of the remediation REST API: actions and votes, audit, paging, breaker.

Owns the JSON shapes in and out (and so the OpenAPI schema); validation of *shape* only.
Whether a change may happen is the write path's (console.actions) to decide.
"""

from __future__ import annotations

from typing import Any, get_args

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import URLValidator
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from agents.actions_contract import Status
from console.choices import ACTION_KINDS
from console.models import Action, AuditLog, EscalationPolicy, NotificationChannel, Silence
from console.notify import redact


class VoteOut(serializers.Serializer):
    user = serializers.CharField(source="user.username")
    decision = serializers.CharField()
    reason = serializers.CharField()
    cast_at = serializers.DateTimeField()


class ActionSerializer(serializers.ModelSerializer):
    # allow_null: the schema must say these are null for rule-made or node-less actions.
    node = serializers.CharField(source="node.name", default=None, allow_null=True)
    executor = serializers.CharField(
        source="executor.name",
        default=None,
        allow_null=True,
        help_text="the agent that runs it when not the node's own (a controller agent)",
    )
    group = serializers.CharField(source="group.name", default=None, allow_null=True)
    incident = serializers.IntegerField(source="incident_id", default=None, allow_null=True)
    proposed_by = serializers.CharField(
        source="proposed_by.username", default=None, allow_null=True
    )
    votes = VoteOut(many=True, read_only=True)
    deadline = serializers.SerializerMethodField(
        help_text="when a dispatched action fails unless its agent reported (null before dispatch)"
    )

    def get_deadline(self, action: Action) -> str | None:
        from console.actions.remediation import deadline_of

        when = deadline_of(action)
        return when.isoformat() if when else None

    class Meta:
        model = Action
        fields = [
            "id",
            "kind",
            "target",
            "node",
            "executor",
            "gpu",
            "group",
            "generation",
            "reason",
            "evidence",
            "incident",
            "proposed_by",
            "proposed_by_rule",
            "trigger",
            "state",
            "approvals_required",
            "votes",
            "gate_reasons",
            "preview",
            "escalated",
            "dry_run",
            "params",
            "result",
            "outcome",
            "proposed_at",
            "expires_at",
            "decided_at",
            "dispatched_at",
            "deadline",
            "finished_at",
        ]


class ProposeIn(serializers.Serializer):
    kind = serializers.ChoiceField(choices=[k for k, _ in ACTION_KINDS])
    target = serializers.CharField(max_length=256, help_text="node:<name>, gpu:<uuid>, ...")
    reason = serializers.CharField(max_length=2000)
    incident = serializers.IntegerField(required=False, allow_null=True)
    dry_run = serializers.BooleanField(default=False)
    params = serializers.DictField(required=False, default=dict)


class ReasonIn(serializers.Serializer):
    reason = serializers.CharField(max_length=512, required=False, allow_blank=True, default="")


class DecisionOut(serializers.Serializer):
    action = ActionSerializer()
    reasons = serializers.ListField(child=serializers.CharField())


class RedactedJSONField(serializers.JSONField):
    """Audit data with notification secrets hidden (console.notify.redact), for rows written
    before channel.saved recorded only a URL's origin: the table is append-only."""

    def to_representation(self, value: Any) -> Any:
        return redact.redact(super().to_representation(value))


class AuditSerializer(serializers.ModelSerializer):
    data = RedactedJSONField(read_only=True)

    class Meta:
        model = AuditLog
        fields = ["id", "ts", "actor", "verb", "object_type", "object_id", "reason", "data"]


class SilenceSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", read_only=True)
    starts_at = serializers.DateTimeField(required=False)
    matchers = serializers.DictField(child=serializers.CharField())

    class Meta:
        model = Silence
        fields = ["id", "matchers", "starts_at", "ends_at", "reason", "created_by", "created_at"]
        read_only_fields = ["id", "created_by", "created_at"]


class PolicySerializer(serializers.ModelSerializer):
    severities = serializers.ListField(child=serializers.CharField(), required=False)
    labels = serializers.DictField(child=serializers.CharField(), required=False)
    steps = serializers.ListField(child=serializers.DictField(), min_length=1)

    class Meta:
        model = EscalationPolicy
        fields = ["id", "name", "position", "severities", "labels", "steps", "enabled"]


@extend_schema_field(OpenApiTypes.STR)  # shown redacted, so not a "uri" in the schema
class RedactedUrlField(serializers.CharField):
    """Takes a URL; shows only its origin (console.notify.redact): a Slack webhook's path
    is its secret, and admins' screens and API clients are no place for it. A CharField
    that checks the URL itself: a URLValidator in `validators` makes the schema say "uri",
    which the redacted form (`https://host/[redacted]`) is not."""

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        try:
            URLValidator()(value)
        except DjangoValidationError:
            raise serializers.ValidationError("Enter a valid URL.") from None
        return value

    def to_representation(self, value: Any) -> str:
        return redact.redact_url(str(super().to_representation(value)))


class ChannelSerializer(serializers.ModelSerializer):
    """A channel; its URL is shown as its origin only, its secret never."""

    url = RedactedUrlField(max_length=512)
    secret = serializers.CharField(write_only=True, required=False, max_length=256)

    class Meta:
        model = NotificationChannel
        fields = ["id", "name", "kind", "url", "secret", "enabled"]


class BreakerIn(serializers.Serializer):
    open = serializers.BooleanField()
    reason = serializers.CharField(max_length=1000, allow_blank=True)


class BreakerOut(serializers.Serializer):
    open = serializers.BooleanField()
    reason = serializers.CharField()
    opened_at = serializers.DateTimeField(allow_null=True)
    opened_by = serializers.CharField()
    closed_at = serializers.DateTimeField(allow_null=True)
    closed_by = serializers.CharField()
    closed_reason = serializers.CharField()
    description = serializers.CharField()


class ResultIn(serializers.Serializer):
    status = serializers.ChoiceField(choices=list(get_args(Status)))
    exit_code = serializers.IntegerField(required=False, allow_null=True, default=None)
    output = serializers.CharField(
        required=False, allow_blank=True, default="", trim_whitespace=False
    )
    # agents/actions_contract.Outcome: what really happened (applied, already, held_by_other,
    # refused...) and who holds the node; stored on the action, read for ownership.
    outcome = serializers.DictField(required=False, default=dict)
