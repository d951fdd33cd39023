"""GET /api/v1/reliability/?days=N: the fleet's reliability record (viewers may read).

Validates the window and calls console.queries.recovery.fleet_report; the page at
/reliability/ renders the same dict. Nothing else.
"""

from __future__ import annotations

from typing import Any

from django.http import QueryDict
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.queries import recovery

DEFAULT_DAYS = 30.0
MAX_DAYS = 366.0


def days_of(params: QueryDict | dict[str, Any]) -> float:
    """`days` from the query string: 0 < days <= 366 (default 30)."""
    raw = params.get("days")
    if raw in (None, ""):
        return DEFAULT_DAYS
    try:
        days = float(str(raw))
    except ValueError:
        raise ValidationError({"days": "must be a number of days"}) from None
    if not 0 < days <= MAX_DAYS:
        raise ValidationError({"days": f"must be more than 0 and at most {MAX_DAYS:.0f}"})
    return days


class ReliabilityReport(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("days", float, description="the window (default 30)")],
        responses=OpenApiTypes.OBJECT,  # console.diagnosis.reliability.fleet_report's dict
    )
    def get(self, request: Request) -> Response:
        days = days_of(request.query_params)
        return Response(recovery.fleet_report(days=days, now=timezone.now()))
