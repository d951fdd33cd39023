"""The API's pagination: limit/offset with a ceiling, so one request cannot ask for every row."""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination


class Pagination(LimitOffsetPagination):
    """`?limit=` beyond MAX_LIMIT is served as MAX_LIMIT (DRF clamps; `next` pages on)."""

    default_limit = 200
    max_limit = 1000
