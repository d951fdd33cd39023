"""REST for remediation actions: list, propose, approve, reject, cancel, abandon.

Thin adapters: validate with a serializer, call one console.actions verb, render. Each
view names the table's Permission its verb needs (refused before validation: a caller
below it learns nothing from a 400 or 404); the verb asks the table again and decides.
A refusal is raised and becomes JSON `{"error": ...}` in console/api/errors.py.
"""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console import actions
from console.api.permissions import allows
from console.api.remediation_serializers import (
    ActionSerializer,
    DecisionOut,
    ProposeIn,
    ReasonIn,
)
from console.choices import ACTION_STATES
from console.models import Action
from console.policy.roles import Permission


def actions_with_votes() -> QuerySet[Action]:
    return Action.objects.select_related(
        "node", "executor", "group", "proposed_by"
    ).prefetch_related("votes__user")


def decision(outcome: actions.Outcome, status: int = 200) -> Response:
    action = actions_with_votes().get(pk=outcome.action.pk)
    body = {"action": ActionSerializer(action).data, "reasons": list(outcome.reasons)}
    return Response(body, status=status)


@extend_schema(parameters=[OpenApiParameter("state", str, enum=[s for s, _ in ACTION_STATES])])
class ActionList(generics.ListCreateAPIView):
    """List actions (viewer+), or propose one (the table: operator+)."""

    serializer_class = ActionSerializer
    permission_classes = [allows(write=Permission.PROPOSE)]

    def get_queryset(self) -> QuerySet[Action]:
        qs = actions_with_votes()
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
        outcome = actions.propose_action(
            kind=v["kind"],
            target=v["target"],
            reason=v["reason"],
            actor=request.user,
            incident_id=v.get("incident"),
            dry_run=v["dry_run"],
            params=v["params"],
            now=timezone.now(),
        )
        return decision(outcome, 201)


class ActionDetail(generics.RetrieveAPIView):
    serializer_class = ActionSerializer

    def get_queryset(self) -> QuerySet[Action]:
        return actions_with_votes()


class ActionVote(APIView):
    """Approve or reject (the table: approver+). Nobody approves their own action; any
    reject wins."""

    approve = True

    def get_permissions(self) -> list[BasePermission]:
        return [allows(write=Permission.APPROVE if self.approve else Permission.REJECT)()]

    @extend_schema(request=ReasonIn, responses={200: DecisionOut})
    def post(self, request: Request, pk: int) -> Response:
        data = ReasonIn(data=request.data)
        data.is_valid(raise_exception=True)
        outcome = actions.vote_on_action(
            action_id=pk,
            actor=request.user,
            approve=self.approve,
            now=timezone.now(),
            reason=data.validated_data["reason"],
        )
        return decision(outcome)


class _ReasonedDecision(APIView):
    """POST {reason} → one console.actions verb on the action; subclasses name the verb."""

    verb: staticmethod

    @extend_schema(request=ReasonIn, responses={200: DecisionOut})
    def post(self, request: Request, pk: int) -> Response:
        data = ReasonIn(data=request.data)
        data.is_valid(raise_exception=True)
        outcome = type(self).verb(
            action_id=pk,
            actor=request.user,
            reason=data.validated_data["reason"],
            now=timezone.now(),
        )
        return decision(outcome)


class ActionCancel(_ReasonedDecision):
    """Cancel a proposed or approved action (the table: its proposer, or an admin)."""

    permission_classes = [allows(write=Permission.CANCEL_OWN)]  # the verb: own or any
    verb = staticmethod(actions.cancel_action)


class ActionAbandon(_ReasonedDecision):
    """Give up on a dispatched action whose agent never reported (the table: admin): it
    fails, audited."""

    permission_classes = [allows(write=Permission.ABANDON)]
    verb = staticmethod(actions.abandon_action)
