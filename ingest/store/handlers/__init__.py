"""Each record kind's write handler, one module per record family, and the registry of them.

A handler takes the batch's writer state (ingest.store.fences.Fences), one record and its
skew-corrected time; it appends one COPY text line in the column order its `Kind` declares
and folds what the record changes into the live state the writer flushes. Handlers must
not query or write the database themselves. Each family module lists its kinds in `KINDS`;
a new family is added to FAMILIES.
"""

from __future__ import annotations

from typing import Any

from agents.protocol import kind_of
from ingest.store.handlers import checkpoints, devices, hosts, ranks, serving, transitions
from ingest.store.kinds import Handler, Keep, Kind

FAMILIES = (devices, hosts, ranks, checkpoints, transitions, serving)

# Record kind (the wire's `kind`) -> how ingest stores it.
REGISTRY: dict[str, Kind] = {kind_of(k.struct): k for family in FAMILIES for k in family.KINDS}
# The writer's dispatch: record struct -> its handler.
HANDLERS: dict[type[Any], Handler] = {k.struct: k.handler for k in REGISTRY.values()}
# Table (without the `ingest_` prefix) -> its COPY columns, and the kind its rows are of.
COLUMNS: dict[str, tuple[str, ...]] = {k.table: k.columns for k in REGISTRY.values() if k.table}
KIND_OF_TABLE: dict[str, str] = {k.table: kind for kind, k in REGISTRY.items() if k.table}


def kept(keep: Keep) -> tuple[str, ...]:
    """The tables (`ingest_<table>`) whose rows are kept as `keep` says."""
    return tuple(f"ingest_{k.table}" for k in REGISTRY.values() if k.table and k.keep is keep)
