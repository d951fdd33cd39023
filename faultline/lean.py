"""A lean Django handler for POST /api/v1/ingest: the middleware the batch endpoint needs.

Every agent batch passed the whole middleware stack and the URL resolver, although the
endpoint reads no session, no cookie, no user and no message and is CSRF-exempt (it
authenticates by its bearer token, ingest.auth). At a fleet at rest the fixed cost per
batch is what limits ingest (docs/performance.md), so faultline.wsgi sends this
one path here: the same view, the same response headers (the security, metrics and NUL
middleware still run, in the configured order), no resolver walk. Any other middleware
added to settings.MIDDLEWARE later runs here too unless it is named in SKIPPED.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.handlers.exception import convert_exception_to_response
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest
from django.urls import ResolverMatch, get_resolver
from django.utils.module_loading import import_string

PATH = "/api/v1/ingest"
# What the ingest view never uses: static files, sessions, CSRF (the view is exempt),
# the session user (it authenticates by token) and flash messages.
SKIPPED = frozenset(
    {
        "whitenoise.middleware.WhiteNoiseMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    }
)


def ingest_middleware() -> list[str]:
    """settings.MIDDLEWARE without SKIPPED, in its order."""
    return [m for m in settings.MIDDLEWARE if m not in SKIPPED]


class LeanIngestMixin:
    """Load `ingest_middleware()` only, and answer every request with the ingest view's
    resolver match (the caller sends only PATH here)."""

    _match: ResolverMatch

    def load_middleware(self, is_async: bool = False) -> None:
        if is_async:
            raise NotImplementedError("the lean ingest handler is WSGI only")
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        # Resolved once, as the full stack would resolve it (route label for the metrics).
        self._match = get_resolver().resolve(PATH)
        handler = convert_exception_to_response(self._get_response)  # type: ignore[attr-defined]  # BaseHandler's, via the concrete handler class
        for path in reversed(ingest_middleware()):
            handler = convert_exception_to_response(import_string(path)(handler))
        self._middleware_chain = handler

    def resolve_request(self, request: HttpRequest) -> ResolverMatch:
        request.resolver_match = self._match
        return self._match


class IngestHandler(LeanIngestMixin, WSGIHandler):
    """The WSGI handler faultline.wsgi dispatches PATH to."""


def dispatch(full: Any, lean: Any) -> Any:
    """A WSGI app: PATH to `lean`, everything else to `full`."""

    def application(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") == PATH:
            return lean(environ, start_response)
        return full(environ, start_response)

    return application
