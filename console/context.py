"""Template context every page gets: the user's role and where the live socket lives."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest

from console.roles import role_of


def console(request: HttpRequest) -> dict[str, Any]:
    return {
        "ws_port": settings.FAULTLINE_WS_PORT or "",
        "user_role": role_of(request.user) if request.user.is_authenticated else None,
    }
