"""Postgres COPY text format for the ingest hot path, one string per table.

psycopg's `write_row` dumps every value through its adapters, a Python call per JSON value;
formatting each record straight into a COPY line cost 30-40 % less CPU per row here
(docs/performance.md). Only the value types the contract produces are handled: str, int,
float (and "NaN"/"Infinity"/"-Infinity" strings), bool, aware datetimes, JSON-able Structs.
Postgres still parses and range-checks every value, so a number beyond its column fails
with the COPY line, which ingest maps back to the record.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import msgspec

NULL = "\\N"
_SPECIAL = re.compile(r"[\\\t\n\r]")
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_JSON = msgspec.json.Encoder()


def text(value: str | None) -> str:
    """A string column: backslash, tab, newline and CR escaped (NUL is refused earlier)."""
    if value is None:
        return NULL
    return value.translate(_ESCAPES) if _SPECIAL.search(value) else value


def num(value: float | int | str | None) -> str:
    """A number column. Python's repr of a float round-trips (`nan`, `inf` and `1e+300` are
    read by Postgres as NaN, Infinity, 1e300); the contract's "NaN"/"Infinity" strings pass."""
    return NULL if value is None else str(value)


def flag(value: bool | None) -> str:
    return NULL if value is None else ("t" if value else "f")


def when(value: datetime) -> str:
    return value.isoformat()


def json(value: Any) -> str:
    """A jsonb column from a Struct, list or dict, encoded by msgspec (the same JSON as before)."""
    if value is None:
        return NULL
    encoded = _JSON.encode(value).decode()
    # JSON escapes control characters as \n, \t...; COPY reads a backslash as an escape.
    return encoded.replace("\\", "\\\\") if "\\" in encoded else encoded
