"""The agent-facing action endpoints: poll for approved actions, report an outcome.

Owns the agent token authentication for DRF (a node's agent, never a console user) and
the two endpoints `GET /api/v1/agents/actions` and `POST /api/v1/actions/<id>/result`.
Thin: handing actions out is their dispatch and a result is a state change, so both go
through console.actions (every gate re-checked at dispatch). Refusals become JSON in
console/api/errors.py (the project's one exception handler).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents.actions_contract import Action as AgentAction
from console import actions
from console.api.actions import actions_with_votes
from console.api.remediation_serializers import ActionSerializer, ResultIn
from console.models import Node
from ingest.auth import authenticate, is_launcher, sign_action
from ingest.models import AgentCredential


def actions_for_node(credential: AgentCredential) -> list[dict[str, Any]]:
    """Approved actions for this node ride back on the ingest response (and the poll).

    Handing an action to its agent is its dispatch, so this goes through the write path,
    not through a read. Each is signed for the credential that asked (agents/signing.py):
    the agent drops an unsigned or badly signed action. A launcher token gets none.
    """
    if is_launcher(credential):
        return []
    node: Node = credential.node
    dispatched: list[AgentAction] = actions.dispatch_for_node(node=node, now=timezone.now())
    return [sign_action(dict(a), credential=credential) for a in dispatched]


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

    target_class = "ingest.agent_actions.AgentToken"
    name = "agentToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "the node's agent token"}


class IsAgent(BasePermission):
    """A node's agent token; a launcher token is refused (403): it speaks for its group,
    never for the node's actions."""

    message = "missing, unknown or revoked agent token"

    def has_permission(self, request: Any, view: Any) -> bool:
        credential = request.auth
        if isinstance(credential, AgentCredential) and is_launcher(credential):
            self.message = (
                "a launcher token may not read or answer its node's actions: "
                "use the node agent's own token"
            )
            return False
        return isinstance(credential, AgentCredential)


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
        return Response({"actions": actions_for_node(request.auth)})


class ActionResult(APIView):
    """The agent reports an outcome; an action of another node is refused (403)."""

    authentication_classes = [AgentToken]
    permission_classes = [IsAgent]

    @extend_schema(request=ResultIn, responses={200: ActionSerializer})
    def post(self, request: Request, pk: int) -> Response:
        data = ResultIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        action = actions.record_action_result(
            action_id=pk,
            node=request.auth.node,
            status=v["status"],
            exit_code=v["exit_code"],
            output=v["output"],
            now=timezone.now(),
            outcome=v.get("outcome") or {},
        )
        return Response(
            ActionSerializer(get_object_or_404(actions_with_votes(), pk=action.pk)).data
        )
