"""Raw SQL on the ingest hot path: one round trip for several statements, models from rows.

The ORM compiled each statement in more Python time than Postgres took to run it, so the
hot path sends prepared text instead (docs/performance.md). These helpers keep that small.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
import psycopg
from django.db import connection, models

M = TypeVar("M", bound=models.Model)


def send(sql: str, params: dict[str, Any] | tuple[Any, ...]) -> psycopg.ClientCursor[Any]:
    """Run `;`-joined statements in one round trip (client-side binding); the caller
    reads each result with `nextset()` and closes the cursor."""
    # Django's error classes (OperationalError -> 503 in the view), and a broken connection
    # is marked so that Django discards it instead of returning it to the pool.
    with connection.wrap_database_errors:
        connection.ensure_connection()
        cur = psycopg.ClientCursor(connection.connection)
        cur.execute(sql, params)
    return cur


def columns(model: type[models.Model], alias: str) -> str:
    """The select list that `from_row` expects, for `model` under table alias `alias`."""
    return ", ".join(f"{alias}.{f.column}" for f in model._meta.concrete_fields)


def from_row(model: type[M], row: tuple[Any, ...] | list[Any]) -> M:
    """A model instance from a row selected with `columns(model, ...)`.

    Django's connections load jsonb as text and decode it in the ORM's converters, which a
    raw row never passes through: JSON fields are decoded here.
    """
    fields = model._meta.concrete_fields
    values = list(row[: len(fields)])
    for i, field in enumerate(fields):
        if field.get_internal_type() == "JSONField" and isinstance(values[i], str):
            values[i] = msgspec.json.decode(values[i])
    return model.from_db(connection.alias, [f.attname for f in fields], values)
