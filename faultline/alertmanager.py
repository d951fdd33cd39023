"""POST /api/v1/alertmanager: Alertmanager's webhook receiver (payload version 4).

Owns who may deliver (FAULTLINE_ALERTMANAGER_TOKEN as a Bearer token, which Alertmanager's
`http_config.authorization` sends; without a token set the receiver is off) and parsing the
payload into console.actions.alertmanager's AlertIn, refusing what is not Alertmanager's
payload with a 400 naming the alert and field (a time without a zone is UTC; an Xid code
must be a whole number; labels are flat strings). It must not decide what an alert means:
the write path does.
"""

from __future__ import annotations

import hmac
import json
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agents.protocol import EARLIEST_TS, LATEST_TS
from console.actions.alertmanager import ACTOR, AlertIn, record_alertmanager, xid_code

MAX_BODY = 4 * 1024 * 1024
ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's "no end yet"
MAX_LABELS = 256  # labels (or annotations) of one alert


def _refused(status: int, message: str) -> JsonResponse:
    return JsonResponse({"detail": message}, status=status)


def _time(raw: Any, where: str) -> datetime | None:
    """An RFC 3339 time (Alertmanager's, nanoseconds allowed); without a zone it is UTC.
    None for Alertmanager's zero time; ValueError naming `where` for anything else."""
    if raw is None or raw == "" or raw == ZERO_TIME:
        return None
    if not isinstance(raw, str):
        raise ValueError(f"{where} must be an RFC 3339 time, got {type(raw).__name__}")
    if raw.startswith("0001-"):
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"{where} must be an RFC 3339 time, got {raw[:40]!r}") from None
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    if not EARLIEST_TS <= value < LATEST_TS:
        raise ValueError(f"{where} {raw[:40]!r} is outside {EARLIEST_TS:%Y}-{LATEST_TS:%Y}")
    return value


def _strings(raw: Any, where: str) -> dict[str, str]:
    """Labels or annotations: a flat object of strings, as Alertmanager sends them."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object of strings")
    if len(raw) > MAX_LABELS:
        raise ValueError(f"{where} has {len(raw)} entries; at most {MAX_LABELS}")
    for key, value in raw.items():
        if not isinstance(value, str):
            raise ValueError(f"{where}.{key[:60]} must be a string, got {type(value).__name__}")
        if "\x00" in key or "\x00" in value:
            raise ValueError(f"{where}.{key[:60]}: NUL characters are not allowed")
    return raw


def parse(body: Any) -> list[AlertIn]:
    """The payload's alerts; raises ValueError naming the alert and field that is wrong
    (nothing of a delivery with one bad alert is stored)."""
    if not isinstance(body, dict) or not isinstance(body.get("alerts"), list):
        raise ValueError("expected Alertmanager's webhook payload with an 'alerts' list")
    out = []
    for i, a in enumerate(body["alerts"]):
        where = f"alerts[{i}]"
        if not isinstance(a, dict):
            raise ValueError(f"{where} is not an object")
        labels = _strings(a.get("labels"), f"{where}.labels")
        annotations = _strings(a.get("annotations"), f"{where}.annotations")
        status = a.get("status") or body.get("status")
        if status not in ("firing", "resolved"):
            shown = status[:40] if isinstance(status, str) else type(status).__name__
            raise ValueError(f"{where}.status must be firing or resolved, got {shown!r}")
        starts = _time(a.get("startsAt"), f"{where}.startsAt")
        ends = _time(a.get("endsAt"), f"{where}.endsAt")
        fingerprint = a.get("fingerprint")
        if starts is None or not isinstance(fingerprint, str) or not fingerprint.strip():
            raise ValueError(f"{where} needs startsAt and a fingerprint")
        if "\x00" in fingerprint:
            raise ValueError(f"{where}.fingerprint: NUL characters are not allowed")
        try:
            xid = xid_code(labels, annotations)
        except ValueError as exc:
            raise ValueError(f"{where}.{exc}") from None
        out.append(
            AlertIn(
                status=status,
                starts_at=starts,
                ends_at=ends,
                fingerprint=fingerprint[:64],
                labels=labels,
                annotations=annotations,
                xid=xid,
            )
        )
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
    try:
        length = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        length = MAX_BODY + 1
    if length > MAX_BODY:  # before reading it
        return _refused(413, f"alertmanager: payload over {MAX_BODY} bytes; set max_alerts")
    try:
        alerts = parse(json.loads(request.body or b"null"))
    except RecursionError:
        return _refused(400, "alertmanager: JSON nested too deep")
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        return _refused(400, f"alertmanager: {exc}")
    ids = record_alertmanager(alerts=alerts, actor=ACTOR, now=timezone.now())
    return JsonResponse({"accepted": len(ids)})
