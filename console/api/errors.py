"""The one place an exception becomes an API response: JSON `{"error": ...}`, never a 500.

Owns the status of every refusal the write path and the pure rules raise (a table, most
specific first), and the 503 for a database that is away. DRF's own errors (validation,
authentication, 404) keep DRF's shapes. Views must not catch these themselves: they
raise, and this handler (settings REST_FRAMEWORK["EXCEPTION_HANDLER"]) answers.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import OperationalError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from console.actions.errors import ChangeError, Conflict, NotAllowed, NotFound
from console.policy.breaker import BreakerError
from console.policy.escalation import EscalationError, SilenceError
from console.policy.lifecycle import TransitionError
from console.policy.votes import VoteRefused

log = logging.getLogger(__name__)

STATUS: tuple[tuple[type[Exception], int], ...] = (
    (NotFound, 404),
    (NotAllowed, 403),
    (VoteRefused, 403),
    (Conflict, 409),
    (TransitionError, 409),
    (BreakerError, 400),  # a refused breaker change by someone allowed to try
    (SilenceError, 400),
    (EscalationError, 400),
    (ChangeError, 400),
)


def status_for(exc: Exception) -> int | None:
    """The HTTP status of a domain refusal, None for anything else."""
    return next((code for cls, code in STATUS if isinstance(exc, cls)), None)


def error_response(exc: Exception) -> Response | None:
    status = status_for(exc)
    return Response({"error": str(exc)}, status=status) if status is not None else None


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, OperationalError):
        log.warning("api: database unavailable", exc_info=True)
        return Response(
            {"error": "database unavailable: retry later"}, status=503, headers={"Retry-After": "5"}
        )
    return error_response(exc) or drf_handler(exc, context)
