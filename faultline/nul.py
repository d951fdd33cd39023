"""Refuse NUL (U+0000) in request input with 400, before it reaches Postgres.

Postgres text and jsonb cannot hold NUL: a lookup or insert with one raises DataError,
which surfaced as a 500 on every filter, path parameter and free-form JSON field
(`?node=a%00`, `/groups/a%00/`, `"params": {"k": "\\u0000"}`). No legitimate name, label,
reason or parameter contains NUL, so it is refused once at the edge rather than in each
view: the middleware covers the path and query string of every page, the parsers cover
API bodies. (DRF's CharField already refuses NUL; dict and JSON fields did not.) The
JSON parser also refuses bodies nested deeper than MAX_JSON_DEPTH, for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework import parsers
from rest_framework.exceptions import ParseError

MESSAGE = "NUL (0x00) characters are not allowed"
# No API body nests deeper than a few levels (params, matchers, policy steps); a deeper one
# is refused with 400 rather than stored in jsonb or walked recursively (it was a 500).
MAX_JSON_DEPTH = 32


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True if containers nest more than `limit` levels (iterative: no recursion limit)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping | list | tuple):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, Mapping) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def has_nul(value: Any) -> bool:
    """True if a string anywhere in a parsed body (keys included) contains NUL."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        if hasattr(value, "lists"):  # QueryDict: every value of a repeated key
            return any(has_nul(k) or has_nul(vs) for k, vs in value.lists())
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(has_nul(v) for v in value)
    return False


class RejectNulMiddleware:
    """400 for a path or query string with NUL (`%00`), on the API and the pages alike."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path or has_nul(request.GET):
            return JsonResponse({"error": f"{MESSAGE} in the path or query string"}, status=400)
        return self.get_response(request)


class _RejectNul:
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)  # type: ignore[misc]  # mixin: the parser class it is mixed into has parse()
        except RecursionError:
            raise ParseError(f"JSON nested more than {MAX_JSON_DEPTH} levels deep") from None
        fields = data.data if isinstance(data, parsers.DataAndFiles) else data
        if not hasattr(fields, "lists") and too_deep(fields):
            raise ParseError(f"JSON nested more than {MAX_JSON_DEPTH} levels deep")
        if has_nul(fields):
            raise ParseError(f"{MESSAGE} in the request body")
        return data


class JSONParser(_RejectNul, parsers.JSONParser):
    """DRF's JSON parser, refusing NUL in any key or string value."""


class FormParser(_RejectNul, parsers.FormParser):
    """DRF's form parser, refusing NUL in any field."""


class MultiPartParser(_RejectNul, parsers.MultiPartParser):
    """DRF's multipart parser, refusing NUL in any field (file contents are not checked)."""
