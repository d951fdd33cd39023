"""API errors as JSON with a message that names the problem; never a bare 500 page."""

from __future__ import annotations

import logging
from typing import Any

from django.db import OperationalError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

log = logging.getLogger(__name__)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, OperationalError):
        log.warning("api: database unavailable", exc_info=True)
        return Response(
            {"error": "database unavailable: retry later"}, status=503, headers={"Retry-After": "5"}
        )
    return drf_handler(exc, context)
