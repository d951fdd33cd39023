"""Every request's edge: bodies bounded before anything reads them, and the headers every
page gets (a CSP without inline scripts, no referrer leaks)."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from faultline import dbwrites

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self' ws: wss:; frame-ancestors 'none'; "
    "base-uri 'self'; form-action 'self'"
)


class SecurityHeadersMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not request.path.startswith(("/api/docs", "/admin/")):
            response.setdefault("Content-Security-Policy", CSP)
        response.setdefault("Referrer-Policy", "same-origin")
        return response


class BodyLimitMiddleware:
    """413 for a body larger than any endpoint takes (DATA_UPLOAD_MAX_MEMORY_SIZE, the agent
    batch limit), 411 for one without a length, from the headers alone: before sessions,
    CSRF or authentication read a byte of it, whoever sends it (a multipart body was
    spooled to disk whole by the CSRF check before any 401). gunicorn then drains at most
    64 KiB of what is left before it closes the connection."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = request.META.get("CONTENT_LENGTH") or "0"
        if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
            return _closing(411, "send a Content-Length; chunked request bodies are refused")
        try:
            length = int(raw)
        except ValueError:
            return _closing(400, f"Content-Length {raw[:20]!r} is not a number")
        if length > limit:
            return _closing(413, f"request body of {length} bytes; the limit is {limit}")
        return self.get_response(request)


def _closing(status: int, message: str) -> HttpResponse:
    return JsonResponse({"error": message}, status=status)


class DatabaseRefusalMiddleware:
    """A write Postgres refused for want of a resource (full disk, out of memory), raised by
    any view, is answered 503 with Retry-After and counted (faultline.dbwrites): the
    request's transaction rolled back whole, and the caller should retry, not report a bug
    (a 500). Other exceptions pass through untouched."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        refused = dbwrites.refusal(exception)
        if refused is None:
            return None
        dbwrites.record(*refused)
        response = JsonResponse(
            {"error": f"database refused writes ({refused[0]}): nothing was changed; retry later"},
            status=503,
        )
        response["Retry-After"] = str(dbwrites.RETRY_AFTER_S)
        return response
