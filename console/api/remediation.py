"""REST for remediation: actions and votes, audit, silences, escalation policies, breaker,
and the agent-facing action poll and result.

Thin adapters: validate with a serializer, call one console.remediation function, render.
Refusals become JSON `{"error": ...}` naming the problem. Agent endpoints authenticate
with the node's agent token (ingest.auth), never a console user.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import generics, serializers
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console import live, paging, remediation
from console.api.permissions import IsAdmin, IsApprover, IsOperator, IsViewer
from console.models import (
    ACTION_KINDS,
    ACTION_STATES,
    Action,
    AuditLog,
    EscalationPolicy,
    NotificationChannel,
    Silence,
)
from console.policy.breaker import BreakerError
from console.policy.escalation import SilenceError
from console.policy.lifecycle import TransitionError
from console.policy.votes import VoteRefused
from console.roles import has_role
from ingest.auth import authenticate
from ingest.models import AgentCredential

# -- serializers ------------------------------------------------------------------------------


class VoteOut(serializers.Serializer):
    user = serializers.CharField(source="user.username")
    decision = serializers.CharField()
    reason = serializers.CharField()
    cast_at = serializers.DateTimeField()


class ActionSerializer(serializers.ModelSerializer):
    # allow_null: the schema must say these are null for rule-made or node-less actions.
    node = serializers.CharField(source="node.name", default=None, allow_null=True)
    group = serializers.CharField(source="group.name", default=None, allow_null=True)
    incident = serializers.IntegerField(source="incident_id", default=None, allow_null=True)
    proposed_by = serializers.CharField(
        source="proposed_by.username", default=None, allow_null=True
    )
    votes = VoteOut(many=True, read_only=True)

    class Meta:
        model = Action
        fields = [
            "id",
            "kind",
            "target",
            "node",
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
            "proposed_at",
            "expires_at",
            "decided_at",
            "dispatched_at",
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


class AuditSerializer(serializers.ModelSerializer):
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


class ChannelSerializer(serializers.ModelSerializer):
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
    status = serializers.ChoiceField(choices=["succeeded", "failed"])
    exit_code = serializers.IntegerField(required=False, allow_null=True, default=None)
    output = serializers.CharField(
        required=False, allow_blank=True, default="", trim_whitespace=False
    )


# -- helpers ------------------------------------------------------------------------------------

_STATUS: list[tuple[type[Exception], int]] = [
    (remediation.NotFound, 404),
    (remediation.NotAllowed, 403),
    (remediation.Conflict, 409),
    (VoteRefused, 403),
    (TransitionError, 409),
    (remediation.RemediationError, 400),
    (SilenceError, 400),
]


def _call(fn: Callable[[], Any]) -> Any:
    """Run one write; a refusal becomes a JSON error response with a fitting status."""
    try:
        return fn()
    except tuple(cls for cls, _ in _STATUS) as exc:
        status = next(code for cls, code in _STATUS if isinstance(exc, cls))
        return Response({"error": str(exc)}, status=status)


def _by_method(request: Request, write: type[BasePermission]) -> list[BasePermission]:
    safe = request.method in ("GET", "HEAD", "OPTIONS")
    return [IsViewer()] if safe else [write()]


def _actions():  # type: ignore[no-untyped-def]
    return Action.objects.select_related("node", "group", "proposed_by").prefetch_related(
        "votes__user"
    )


# -- actions ---------------------------------------------------------------------------------


@extend_schema(parameters=[OpenApiParameter("state", str, enum=[s for s, _ in ACTION_STATES])])
class ActionList(generics.ListCreateAPIView):
    """List actions (viewer+), or propose one (operator+)."""

    serializer_class = ActionSerializer

    def get_permissions(self):  # type: ignore[no-untyped-def]
        return _by_method(self.request, IsOperator)

    def get_queryset(self):  # type: ignore[no-untyped-def]
        qs = _actions()
        state = self.request.query_params.get("state")
        if state is not None:
            allowed = [s for s, _ in ACTION_STATES]
            if state not in allowed:
                raise ValidationError(
                    {"state": f"must be one of {', '.join(allowed)}, got {state!r}"}
                )
            qs = qs.filter(state=state)
        return qs.order_by("-proposed_at", "-id")

    @extend_schema(request=ProposeIn, responses={201: DecisionOut})
    def post(self, request: Request) -> Response:
        data = ProposeIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data

        def propose() -> Response:
            outcome = remediation.propose_action(
                kind=v["kind"],
                target=v["target"],
                reason=v["reason"],
                actor=request.user,
                incident_id=v.get("incident"),
                dry_run=v["dry_run"],
                params=v["params"],
                now=timezone.now(),
            )
            return _decision(outcome, 201)

        return _call(propose)


def _decision(outcome: remediation.Outcome, status: int = 200) -> Response:
    action = _actions().get(pk=outcome.action.pk)
    body = {"action": ActionSerializer(action).data, "reasons": list(outcome.reasons)}
    return Response(body, status=status)


class ActionDetail(generics.RetrieveAPIView):
    serializer_class = ActionSerializer

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return _actions()


class ActionVote(APIView):
    """Approve or reject (approver+). Nobody approves their own action; any reject wins."""

    permission_classes = [IsApprover]
    approve = True

    @extend_schema(request=ReasonIn, responses={200: DecisionOut})
    def post(self, request: Request, pk: int) -> Response:
        data = ReasonIn(data=request.data)
        data.is_valid(raise_exception=True)
        return _call(
            lambda: _decision(
                remediation.vote_on_action(
                    action_id=pk,
                    actor=request.user,
                    approve=self.approve,
                    now=timezone.now(),
                    reason=data.validated_data["reason"],
                )
            )
        )


class ActionCancel(APIView):
    """Cancel a proposed or approved action: its proposer or an admin."""

    permission_classes = [IsOperator]

    @extend_schema(request=ReasonIn, responses={200: DecisionOut})
    def post(self, request: Request, pk: int) -> Response:
        data = ReasonIn(data=request.data)
        data.is_valid(raise_exception=True)
        return _call(
            lambda: _decision(
                remediation.cancel_action(
                    action_id=pk,
                    actor=request.user,
                    reason=data.validated_data["reason"],
                    now=timezone.now(),
                )
            )
        )


# -- audit -----------------------------------------------------------------------------------


@extend_schema(
    parameters=[
        OpenApiParameter("verb", str),
        OpenApiParameter("actor", str),
        OpenApiParameter("object_type", str),
        OpenApiParameter("object_id", str),
    ]
)
class AuditList(generics.ListAPIView):
    """The append-only audit log, newest first (viewer+)."""

    serializer_class = AuditSerializer

    def get_queryset(self):  # type: ignore[no-untyped-def]
        params = self.request.query_params
        return remediation.audit_log(
            verb=params.get("verb"),
            actor=params.get("actor"),
            object_type=params.get("object_type"),
            object_id=params.get("object_id"),
        )


# -- silences, escalation policies, channels ---------------------------------------------------


class SilenceList(generics.ListCreateAPIView):
    """Silences (viewer+ read, operator+ create; at most 72 h, reason required)."""

    serializer_class = SilenceSerializer

    def get_permissions(self):  # type: ignore[no-untyped-def]
        return _by_method(self.request, IsOperator)

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return Silence.objects.select_related("created_by")

    def post(self, request: Request) -> Response:
        data = SilenceSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        now = timezone.now()

        def create() -> Response:
            silence = paging.create_silence(
                matchers=v["matchers"],
                starts_at=v.get("starts_at") or now,
                ends_at=v["ends_at"],
                reason=v["reason"],
                actor=request.user,
                now=now,
            )
            return Response(SilenceSerializer(silence).data, status=201)

        return _call(create)


class SilenceDetail(generics.RetrieveDestroyAPIView):
    """Read a silence, or end it now (DELETE, operator+); the row is kept for the record."""

    serializer_class = SilenceSerializer

    def get_permissions(self):  # type: ignore[no-untyped-def]
        return _by_method(self.request, IsOperator)

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return Silence.objects.select_related("created_by")

    def delete(self, request: Request, pk: int) -> Response:
        def end() -> Response:
            silence = paging.expire_silence(silence_id=pk, actor=request.user, now=timezone.now())
            return Response(SilenceSerializer(silence).data)

        return _call(end)


class PolicyList(generics.ListCreateAPIView):
    """Escalation policies (viewer+ read, admin write)."""

    serializer_class = PolicySerializer
    queryset = EscalationPolicy.objects.all()

    def get_permissions(self):  # type: ignore[no-untyped-def]
        return _by_method(self.request, IsAdmin)

    def post(self, request: Request) -> Response:
        data = PolicySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return _call(
            lambda: Response(
                PolicySerializer(
                    paging.save_escalation_policy(
                        actor=request.user, now=timezone.now(), **data.validated_data
                    )
                ).data,
                status=201,
            )
        )


class PolicyDetail(generics.RetrieveUpdateDestroyAPIView):
    serializer_class = PolicySerializer
    queryset = EscalationPolicy.objects.all()

    def get_permissions(self):  # type: ignore[no-untyped-def]
        return _by_method(self.request, IsAdmin)

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        row = self.get_object()
        data = PolicySerializer(row, data=request.data, partial=kwargs.get("partial", False))
        data.is_valid(raise_exception=True)
        return _call(
            lambda: Response(
                PolicySerializer(
                    paging.save_escalation_policy(
                        actor=request.user,
                        now=timezone.now(),
                        policy_id=row.pk,
                        **data.validated_data,
                    )
                ).data
            )
        )

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        row = self.get_object()
        return _call(
            lambda: (
                paging.delete_escalation_policy(
                    policy_id=row.pk, actor=request.user, now=timezone.now()
                )
                or Response(status=204)
            )
        )


class ChannelList(generics.ListCreateAPIView):
    """Notification channels (admin only: they hold secrets and decide who is paged)."""

    serializer_class = ChannelSerializer
    queryset = NotificationChannel.objects.all()
    permission_classes = [IsAdmin]

    def post(self, request: Request) -> Response:
        data = ChannelSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return _call(
            lambda: Response(
                ChannelSerializer(
                    paging.save_channel(
                        actor=request.user, now=timezone.now(), **data.validated_data
                    )
                ).data,
                status=201,
            )
        )


# -- breaker -----------------------------------------------------------------------------------


class Breaker(APIView):
    """The automation circuit breaker: any operator may open it, only an admin closes it."""

    def get_permissions(self):  # type: ignore[no-untyped-def]
        return _by_method(self.request, IsOperator)

    @extend_schema(responses=BreakerOut)
    def get(self, request: Request) -> Response:
        return Response(BreakerOut(remediation.breaker_payload()).data)

    @extend_schema(request=BreakerIn, responses=BreakerOut)
    def post(self, request: Request) -> Response:
        data = BreakerIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        try:
            remediation.set_breaker(
                open=v["open"], actor=request.user, reason=v["reason"], now=timezone.now()
            )
        except BreakerError as exc:
            # Closing is admin-only (403); anything else refused is a bad request (400).
            allowed = v["open"] or has_role(request.user, "admin")
            return Response({"error": str(exc)}, status=400 if allowed else 403)
        return Response(BreakerOut(remediation.breaker_payload()).data)


# -- agent-facing ------------------------------------------------------------------------------


class AgentToken(BaseAuthentication):
    """`Authorization: Bearer <agent token>`: the caller is a node's agent, not a user."""

    def authenticate(self, request: Request) -> tuple[AnonymousUser, AgentCredential] | None:
        header = request.headers.get("Authorization", "")
        credential = authenticate(header) if header else None
        return (AnonymousUser(), credential) if credential is not None else None

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="agent"'


class AgentTokenScheme(OpenApiAuthenticationExtension):
    """Documents the agent token in the OpenAPI schema."""

    target_class = "console.api.remediation.AgentToken"
    name = "agentToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "the node's agent token"}


class IsAgent(BasePermission):
    message = "missing, unknown or revoked agent token"

    def has_permission(self, request: Any, view: Any) -> bool:
        return isinstance(request.auth, AgentCredential)


class AgentActions(APIView):
    """Approved and dispatched actions for the token's node (each re-checked on the way out)."""

    authentication_classes = [AgentToken]
    permission_classes = [IsAgent]

    @extend_schema(
        responses=inline_serializer(
            "AgentActions", {"actions": serializers.ListField(child=serializers.DictField())}
        )
    )
    def get(self, request: Request) -> Response:
        return Response({"actions": live.actions_for_node(request.auth.node)})


class ActionResult(APIView):
    """The agent reports an outcome; an action of another node is refused (403)."""

    authentication_classes = [AgentToken]
    permission_classes = [IsAgent]

    @extend_schema(request=ResultIn, responses={200: ActionSerializer})
    def post(self, request: Request, pk: int) -> Response:
        data = ResultIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data

        def record() -> Response:
            action = remediation.record_action_result(
                action_id=pk,
                node=request.auth.node,
                status=v["status"],
                exit_code=v["exit_code"],
                output=v["output"],
                now=timezone.now(),
            )
            return Response(ActionSerializer(get_object_or_404(_actions(), pk=action.pk)).data)

        return _call(record)
