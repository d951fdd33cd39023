"""Template context every page gets: the user's role, where the live socket lives, and the
vocabularies the page scripts read (base.html hands them over as the `console-vocab` JSON)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest

from agents import vocab
from console.roles import role_of

# What static/console/*.js know of the shared vocabularies: agents.vocab's values, never
# spelled in the scripts (tests/test_vocab.py compares what a page hands over to the module).
PAGE_VOCAB: dict[str, Any] = {
    "HEALTH": {
        "OK": vocab.HEALTH_OK,
        "UNKNOWN": vocab.HEALTH_UNKNOWN,
        "WARNING": vocab.HEALTH_WARNING,
        "CRITICAL": vocab.HEALTH_CRITICAL,
        "DOWN": vocab.HEALTH_DOWN,
    },
    "HEALTH_ORDER": list(vocab.HEALTH_ORDER),
    "SEVERITY_ORDER": list(vocab.SEVERITY_ORDER),
    "GROUP_STATES": list(vocab.GROUP_STATES),
    "TERMINAL_GROUP_STATES": [s for s in vocab.GROUP_STATES if s in vocab.TERMINAL_GROUP_STATES],
    "HARDWARE_FAULT_KINDS": sorted(vocab.HARDWARE_FAULT_KINDS),
}


def console(request: HttpRequest) -> dict[str, Any]:
    return {
        "ws_port": settings.FAULTLINE_WS_PORT or "",
        "user_role": role_of(request.user) if request.user.is_authenticated else None,
        "vocab": PAGE_VOCAB,
    }
