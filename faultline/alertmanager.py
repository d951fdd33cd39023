"""POST /api/v1/alertmanager: Alertmanager's webhook receiver (payload version 4).

Owns who may deliver (FAULTLINE_ALERTMANAGER_TOKEN as a Bearer token, which Alertmanager's
`http_config.authorization` sends; without a token set the receiver is off) and parsing the
payload into console.actions.alertmanager's AlertIn. It must not decide what an alert
means: the write path does.
"""

from __future__ import annotations

import hmac
import json
from datetime import datetime
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from console.actions.alertmanager import ACTOR, AlertIn, record_alertmanager

MAX_BODY = 4 * 1024 * 1024
ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's "no end yet"


def _refused(status: int, message: str) -> JsonResponse:
    return JsonResponse({"detail": message}, status=status)


def _time(raw: Any) -> datetime | None:
    if not raw or raw == ZERO_TIME or str(raw).startswith("0001-"):
        return None
    value = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    return value if value.tzinfo else timezone.make_aware(value, timezone.utc)


def parse(body: dict[str, Any]) -> list[AlertIn]:
    """The payload's alerts; raises ValueError naming what is wrong."""
    if not isinstance(body, dict) or not isinstance(body.get("alerts"), list):
        raise ValueError("expected Alertmanager's webhook payload with an 'alerts' list")
    out = []
    for i, a in enumerate(body["alerts"]):
        if not isinstance(a, dict):
            raise ValueError(f"alerts[{i}] is not an object")
        labels, annotations = a.get("labels") or {}, a.get("annotations") or {}
        if not isinstance(labels, dict) or not isinstance(annotations, dict):
            raise ValueError(f"alerts[{i}]: labels and annotations must be objects")
        status = a.get("status") or body.get("status")
        if status not in ("firing", "resolved"):
            raise ValueError(f"alerts[{i}].status must be firing or resolved, got {status!r}")
        try:
            starts = _time(a.get("startsAt"))
            ends = _time(a.get("endsAt"))
        except ValueError as exc:
            raise ValueError(f"alerts[{i}]: bad time ({exc})") from exc
        fingerprint = str(a.get("fingerprint") or "")[:64]
        if starts is None or not fingerprint:
            raise ValueError(f"alerts[{i}] needs startsAt and fingerprint")
        out.append(AlertIn(
            status=status, starts_at=starts, ends_at=ends, fingerprint=fingerprint,
            labels={str(k): str(v) for k, v in labels.items()},
            annotations={str(k): str(v) for k, v in annotations.items()},
        ))  # fmt: skip
    return out


@csrf_exempt
@require_POST
def receiver(request: HttpRequest) -> JsonResponse:
    token = settings.ALERTMANAGER_TOKEN
    if not token:
        return _refused(403, "alertmanager: the receiver is off; set FAULTLINE_ALERTMANAGER_TOKEN")
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer "):
        return _refused(401, "alertmanager: send 'Authorization: Bearer <token>'")
    if not hmac.compare_digest(header.removeprefix("Bearer ").strip().encode(), token.encode()):
        return _refused(401, "alertmanager: wrong token")
    if len(request.body) > MAX_BODY:
        return _refused(413, "alertmanager: payload too large")
    try:
        alerts = parse(json.loads(request.body or b"null"))
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        return _refused(400, f"alertmanager: {exc}")
    ids = record_alertmanager(alerts=alerts, actor=ACTOR, now=timezone.now())
    return JsonResponse({"accepted": len(ids)})
