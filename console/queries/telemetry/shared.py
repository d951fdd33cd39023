"""What the telemetry reads share: their time windows and the shape of a record they return.

A snapshot's records are contract-shaped dicts (the `kind` and field names of
agents.protocol, `node` the node's name), built here from ORM rows (`contract_rows`) or
binary rows (`decode_rows`). Must not read a table of its own.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import QuerySet

from console.queries import binary

# Events and the newest samples speak for the last EVENT_WINDOW; exits, device and kernel
# events explain a stop for as long as it lasts (HISTORY_WINDOW).
EVENT_WINDOW = timedelta(minutes=30)
HISTORY_WINDOW = timedelta(hours=24)

# An interruption's records lie within this much of its first evidence: the failed
# generation's steps since its checkpoint before it, the restart and redone work after it.
RECOVERY_WINDOW = timedelta(hours=6)

# Checkpoint-interval advice reads a week of checkpoints and transitions, bounded.
ADVICE_WINDOW = timedelta(days=7)
MAX_ADVICE_ROWS = 5000

# The per-rank reads are the bulk of a pass at fleet scale (16k rows a step at 16k ranks,
# ~200k for a full read), so they skip the ORM (console.queries.binary): one binary-format
# query per table, each row zipped into the same contract-shaped dict `contract_rows` builds.
# jsonb columns of the per-rank and node-scoped tables: read as text, decoded by orjson.
JSON_FIELDS = frozenset({"phases", "entries", "groups", "counters", "disks"})


def columns(fields: list[str]) -> str:
    return ", ".join(f"{f}::text" if f in JSON_FIELDS else f for f in fields)


def contract_rows(
    qs: QuerySet[Any], kind: str, fields: list[str], node_names: dict[int, str]
) -> list[dict[str, Any]]:
    out = []
    for row in qs.values("ts", "node_id", *fields):
        row["kind"] = kind
        row["node"] = node_names.get(row.pop("node_id"))
        out.append(row)
    return out


def decode_rows(
    rows: list[tuple[Any, ...]],
    kind: str,
    fields: list[str],
    node_names: dict[int, str],
    lead: tuple[str, ...] = ("id", "ts", "node"),
) -> list[dict[str, Any]]:
    """Rows of `lead` columns (ending with the node id) then `fields`, as contract-shaped
    dicts (what `contract_rows` makes): `node` is the node's name, jsonb decoded."""
    keys = (*lead, *fields)
    at = len(lead)
    decode = [(f, at + i) for i, f in enumerate(fields) if f in JSON_FIELDS]
    names = node_names.get
    out: list[dict[str, Any]] = []
    for row in rows:
        rec = dict(zip(keys, row, strict=True))
        rec["node"] = names(row[at - 1])
        for f, i in decode:
            raw = row[i]
            rec[f] = None if raw is None else binary.json.decode(raw)
        rec["kind"] = kind
        out.append(rec)
    return out
