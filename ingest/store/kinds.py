"""What the service keeps per record kind: its write handler, its table, how long it is kept.

Each handler module (ingest.store.handlers.<family>) declares its kinds as `Kind`s beside
the handlers and COPY column lists they name; ingest.store.handlers gathers them into
REGISTRY, and the writer's dispatch, the COPY column lists (ingest.store.tables), the
error map (ingest.store.errors) and retention (ingest.retention) read it. The wire side of
a kind is its struct in agents.protocol. Must not import a handler module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ingest.store.fences import Fences

Handler = Callable[["Fences", Any, datetime], None]


class Keep(StrEnum):
    """How long a kind's rows are kept (ingest.retention)."""

    PARTITIONS = "partitions"  # whole days dropped past FAULTLINE_RETENTION_DAYS
    A_DAY = "a day"  # per-round samples: only the newest are ever read
    NODE_EVENTS = "node events"  # FAULTLINE_EVENT_RETENTION_DAYS
    GROUP_EVENTS = "group events"  # the same, but never a live or incident-bound group's


@dataclass(frozen=True)
class Kind:
    """One record kind as ingest stores it."""

    struct: type[Any]  # its contract struct (agents.protocol)
    handler: Handler
    table: str = ""  # ingest_<table>, the table its rows are COPYed into; "" for none
    columns: tuple[str, ...] = ()  # the table's COPY columns, in the order `handler` writes
    keep: Keep | None = None  # None only for a kind without a table
