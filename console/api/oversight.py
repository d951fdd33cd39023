"""REST for oversight of automation: the audit log and the circuit breaker.

Thin adapters: the audit log reads console.remediation_queries; the breaker reads and
changes through console.actions. Refusals become JSON in console/api/errors.py.
"""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console import actions, remediation_queries
from console.api.permissions import allows
from console.api.remediation_serializers import AuditSerializer, BreakerIn, BreakerOut
from console.models import AuditLog
from console.policy.roles import Permission


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

    def get_queryset(self) -> QuerySet[AuditLog]:
        params = self.request.query_params
        return remediation_queries.audit_log(
            verb=params.get("verb"),
            actor=params.get("actor"),
            object_type=params.get("object_type"),
            object_id=params.get("object_id"),
        )


class Breaker(APIView):
    """The automation circuit breaker (the table: an operator opens it, an admin closes it;
    the verb refuses anyone else with NotAllowed, 403)."""

    # Opening is the least a breaker change needs; the verb decides open or close.
    permission_classes = [allows(write=Permission.OPEN_BREAKER)]

    @extend_schema(responses=BreakerOut)
    def get(self, request: Request) -> Response:
        return Response(BreakerOut(actions.breaker_payload()).data)

    @extend_schema(request=BreakerIn, responses=BreakerOut)
    def post(self, request: Request) -> Response:
        data = BreakerIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        actions.set_breaker(
            open=v["open"], actor=request.user, reason=v["reason"], now=timezone.now()
        )
        return Response(BreakerOut(actions.breaker_payload()).data)
