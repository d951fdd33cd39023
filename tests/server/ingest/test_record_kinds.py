"""Which files a record kind needs, checked for every kind of the contract.

A new record kind is four things, each in one place:

1. its contract struct in agents/protocol.py, in the `Record` union;
2. its table: a model in ingest/models.py and its migration;
3. its handler, declared as a `Kind` (handler, table, COPY columns, retention rule) in its
   family's `KINDS` in ingest/store/handlers/<family>.py;
4. its reader, in the `READS` of a console/queries/telemetry/<family>.py module.

The writer's dispatch, the COPY column lists, the error map, retention and RECORD_KINDS
are derived from these. A kind that misses one of them fails here, by name. No database:
the checks read the registry and the models' metadata.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import replace
from typing import Any

import pytest
from django.apps import apps

from agents import protocol as p
from console.queries import telemetry
from ingest import partitions, retention
from ingest.store import errors, handlers, tables
from ingest.store.kinds import Keep, Kind

# Kinds that write no rows (a heartbeat only proves liveness): they need no table or reader.
NO_ROWS = frozenset({"heartbeat"})


def _readers() -> dict[str, set[str]]:
    """Kind -> the tables (`ingest_<table>`) the console's telemetry modules read for it."""
    out: dict[str, set[str]] = {}
    for info in pkgutil.iter_modules(telemetry.__path__):
        module = importlib.import_module(f"{telemetry.__name__}.{info.name}")
        for kind, model in getattr(module, "READS", {}).items():
            out.setdefault(kind, set()).add(model._meta.db_table)
    return out


def _tables() -> dict[str, set[str]]:
    """Table -> its columns, for every model of the ingest app."""
    return {
        model._meta.db_table: {f.column for f in model._meta.concrete_fields}
        for model in apps.get_app_config("ingest").get_models()
    }


def gaps(
    registry: dict[str, Kind],
    *,
    kinds: tuple[str, ...] = p.RECORD_KINDS,
    tables: dict[str, set[str]] | None = None,
    readers: dict[str, set[str]] | None = None,
) -> list[str]:
    """What each kind lacks, one line per gap, naming the kind and the file to add it in."""
    tables = _tables() if tables is None else tables
    readers = _readers() if readers is None else readers
    out = []
    for kind in kinds:
        spec = registry.get(kind)
        if spec is None:
            out.append(f"{kind}: no handler (a Kind in ingest/store/handlers/<family>.py KINDS)")
            continue
        if p.kind_of(spec.struct) != kind:
            out.append(f"{kind}: registered with the struct of {p.kind_of(spec.struct)!r}")
        if kind in NO_ROWS:
            continue
        table = f"ingest_{spec.table}"
        if not spec.table or table not in tables:
            out.append(f"{kind}: no table (a model in ingest/models.py and its migration)")
            continue
        missing = [c for c in spec.columns if c not in tables[table]]
        if not spec.columns or missing:
            out.append(f"{kind}: COPY columns {missing or '()'} are not columns of {table}")
        if spec.keep is None:
            out.append(f"{kind}: no retention rule (`keep` of its Kind)")
        elif (spec.keep is Keep.PARTITIONS) != (table in partitions.PARTITIONED):
            out.append(f"{kind}: kept as {spec.keep} but {table} partitioned is the other way")
        if table not in readers.get(kind, set()):
            out.append(f"{kind}: no reader (READS in console/queries/telemetry/<family>.py)")
    for kind in sorted(set(registry) - set(kinds)):
        out.append(f"{kind}: registered but not a kind of agents.protocol.Record")
    return out


def test_it_finds_every_record_kind_complete() -> None:
    assert gaps(handlers.REGISTRY) == []


def _without(part: str, kind: str) -> dict[str, Kind]:
    registry = dict(handlers.REGISTRY)
    if part == "handler":
        del registry[kind]
    elif part == "table":
        registry[kind] = replace(registry[kind], table="nosuchtable")
    elif part == "retention":
        registry[kind] = replace(registry[kind], keep=None)
    elif part == "columns":
        registry[kind] = replace(registry[kind], columns=(*registry[kind].columns, "nosuch"))
    return registry


_STORED = sorted(set(p.RECORD_KINDS) - NO_ROWS)


@pytest.mark.parametrize("kind", _STORED)
@pytest.mark.parametrize("part", ["handler", "table", "retention", "columns"])
def test_it_names_a_kind_that_misses_a_part(part: str, kind: str) -> None:
    found = gaps(_without(part, kind))
    word = {"handler": "no handler", "table": "no table", "retention": "no retention rule"}
    assert len(found) == 1 and found[0].startswith(f"{kind}: "), found
    assert word.get(part, "COPY columns") in found[0]


@pytest.mark.parametrize("kind", _STORED)
def test_it_names_a_kind_without_a_reader(kind: str) -> None:
    readers = {k: v for k, v in _readers().items() if k != kind}
    assert gaps(handlers.REGISTRY, readers=readers) == [
        f"{kind}: no reader (READS in console/queries/telemetry/<family>.py)"
    ]


def test_it_names_a_kind_the_contract_does_not_have() -> None:
    registry = {**handlers.REGISTRY, "ghost": handlers.REGISTRY["probe"]}
    assert gaps(registry) == ["ghost: registered but not a kind of agents.protocol.Record"]


def test_it_names_a_kind_registered_with_another_kinds_struct() -> None:
    registry = {**handlers.REGISTRY, "probe": handlers.REGISTRY["step"]}
    found = gaps(registry)
    assert found[0] == "probe: registered with the struct of 'step'", found


def test_it_names_a_new_contract_kind_nothing_handles() -> None:
    assert gaps(handlers.REGISTRY, kinds=(*p.RECORD_KINDS, "gpu_fan")) == [
        "gpu_fan: no handler (a Kind in ingest/store/handlers/<family>.py KINDS)"
    ]


def _stored(keep: Keep) -> set[str]:
    return {f"ingest_{k.table}" for k in handlers.REGISTRY.values() if k.keep is keep}


def test_the_derived_lists_follow_the_registry() -> None:
    """Dispatch, COPY columns, error map and retention each cover exactly the registry."""
    assert set(handlers.HANDLERS) == set(p.RECORD_TYPES)
    stored: dict[str, Any] = {k.table: kind for kind, k in handlers.REGISTRY.items() if k.table}
    assert set(tables.COLUMNS) == set(tables.COPY_SQL) == set(stored)
    assert stored == errors._KIND_OF_TABLE
    assert set(retention.NODE_EVENTS) == _stored(Keep.NODE_EVENTS)
    assert set(retention.GROUP_EVENTS) == _stored(Keep.GROUP_EVENTS) | {"ingest_contractviolation"}
    assert set(retention.SAMPLES) == _stored(Keep.A_DAY)
    assert set(partitions.PARTITIONED) == _stored(Keep.PARTITIONS)
