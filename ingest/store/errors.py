"""Errors that name the record: a record ahead of its batch, a value beyond its column.

Owns the 400 answers ingest gives for records that passed the contract but cannot be
stored, and finding the record behind a COPY line Postgres refused (only on that error
path, at no cost to good batches). Must not touch the database.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import psycopg

from agents import protocol as p
from ingest.store import handlers


class RecordError(ValueError):
    """A record that passed the contract but cannot be stored; 400 naming record and field."""

    def __init__(self, message: str, *, index: int | None = None, field: str | None = None):
        super().__init__(message)
        self.message, self.index, self.field = message, index, field

    def as_dict(self) -> dict[str, Any]:
        return {"error": self.message, "record": self.index, "field": self.field}


class FutureRecordError(RecordError):
    """A record stamped too far ahead of the batch's own send time."""


def check_shift(batch: p.Batch, shift: timedelta) -> None:
    """A record stamp that the clock-skew correction would carry outside the calendar."""
    for index, rec in enumerate(batch.records):
        try:
            rec.ts - shift  # only whether it can be computed
        except OverflowError:
            raise RecordError(
                f'record {index}: field "ts": {rec.ts.isoformat()} is out of range once '
                f"corrected for the agent's clock skew ({shift}); fix the node's clock",
                index=index,
                field="ts",
            ) from None


def check_future(batch: p.Batch, max_future_s: int) -> None:
    try:
        limit = batch.sent_at + timedelta(seconds=max_future_s)
    except OverflowError:  # sent_at at the end of the calendar (year 9999): not a 500
        raise RecordError(
            f'batch: field "sent_at": {batch.sent_at.isoformat()} is out of range',
            field="sent_at",
        ) from None
    for index, rec in enumerate(batch.records):
        if rec.ts > limit:
            raise FutureRecordError(
                f'record {index}: field "ts": {rec.ts.isoformat()} is more than '
                f"{max_future_s} s after the batch's sent_at {batch.sent_at.isoformat()}",
                index=index,
                field="ts",
            )


_COPY_CONTEXT = re.compile(r"COPY ingest_(\w+), line (\d+), column (\w+)")
_KIND_OF_TABLE = handlers.KIND_OF_TABLE  # a COPY's table -> the kind of its records


def out_of_range(exc: psycopg.errors.DataError, batch: p.Batch) -> RecordError:
    """Name the record behind a COPY row Postgres refused (a number beyond its column).

    The contract bounds most numbers; the rest (generation, codes, counters) are bounded by
    their columns. Line N of a table's COPY is the N-th record of that kind, so the index
    is found again only on this error path, at no cost to good batches.
    """
    match = _COPY_CONTEXT.search(getattr(exc.diag, "context", None) or "")
    if match is None:
        return RecordError(
            f"batch: a value is out of range for storage ({exc.diag.message_primary})"
        )
    table, line, column = match.group(1), int(match.group(2)), match.group(3)
    kind = _KIND_OF_TABLE.get(table)
    field = column.removesuffix("_id")
    same_kind = [i for i, r in enumerate(batch.records) if r.__struct_config__.tag == kind]
    index = same_kind[line - 1] if 0 < line <= len(same_kind) else None
    where = f"record {index}" if index is not None else f"a {kind} record"
    return RecordError(
        f'{where}: field "{field}": value is out of range for storage ({exc.diag.message_primary})',
        index=index,
        field=field,
    )
