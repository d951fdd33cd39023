"""Group commit: the batches that reach one web process while it stores another share the
next transaction, with one COPY per table for all of them.

A fleet at rest sends many small batches; per batch, the transaction (BEGIN, COMMIT) and
a COPY per table cost more than its rows (docs/performance.md, Ingest). Here the request
threads of one process queue their batch; one of them (the leader) stores the queued
batches one after another in one transaction, COPYs their rows at once and commits, and
only then answers each: no batch is acknowledged before the commit that stores it.

Nothing waits to fill a group: a lone batch is stored alone at once; a group is whatever
queued while the previous transaction ran. If any batch of a group fails (a 400, a
revoked token, a lock timeout, Postgres down), the group's transaction rolls back and each
of its batches is stored again on its own, so one bad batch costs the others only a retry
and every batch gets the answer it would have had alone. The (agent, seq) receipt keeps a
replay idempotent as before: within a group a retried batch sees its original's receipt.

Each web process runs its own shared transactions; each holds its batches' consistency-group
row locks until it commits, so the shared transactions of two processes take those rows in
one order or they deadlock (`_shareable`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from agents import protocol as p
from console.models import Node
from ingest.store.batch import (
    IngestResult,
    check_batch,
    ingest_batch,
    store_batch,
    writer_result,
)
from ingest.store.batch_state import locks_group
from ingest.store.receipts import Receipts
from ingest.store.tables import copy_rows


@dataclass
class _Item:
    kwargs: dict[str, Any]
    order: tuple[str, str] = ("", "")  # its place in a shared transaction (`_shareable`)
    done: threading.Event = field(default_factory=threading.Event)
    finished: bool = False  # result or error set; False when woken only to lead
    result: IngestResult | None = None
    error: BaseException | None = None

    def outcome(self) -> IngestResult:
        if self.error is not None:
            raise self.error
        assert self.result is not None  # noqa: S101 - set together with finished
        return self.result


_lock = threading.Lock()
_queue: list[_Item] = []
_leading = False  # a thread is storing a group; the queued wait for it


def store(
    *,
    node: Node,
    batch: p.Batch,
    now: datetime,
    max_future_s: int,
    want_card: bool = False,
    launcher_group: str = "",
    credential_id: int | None = None,
) -> IngestResult:
    """`ingest_batch`, sharing a transaction with batches stored at the same moment.

    Same arguments, result and exceptions as `ingest_batch`; returns once the batch is
    committed (or raises what storing it alone raised).
    """
    kwargs: dict[str, Any] = {
        "node": node,
        "batch": batch,
        "now": now,
        "max_future_s": max_future_s,
        "want_card": want_card,
        "launcher_group": launcher_group,
        "credential_id": credential_id,
    }
    if settings.INGEST_GROUP_COMMIT_MAX <= 1:
        return ingest_batch(**kwargs)
    check_batch(batch, now, max_future_s)  # a 400 before it can fail anyone's group
    order = _shareable(batch)
    if order is None:
        return ingest_batch(**kwargs)
    item = _Item(kwargs, order)
    global _leading
    with _lock:
        _queue.append(item)
        lead = not _leading
        _leading = True
    if not lead:
        if not connection.in_atomic_block:
            connection.close()  # back to the pool while waiting: the leader may need it
        item.done.wait()
        if item.finished:
            return item.outcome()
        # Woken to lead: this item heads the queue.
    with _lock:
        group = _queue[: settings.INGEST_GROUP_COMMIT_MAX]
        del _queue[: len(group)]
    try:
        _run(group)
    finally:
        for other in group:
            if not other.finished:  # only if storing was interrupted (BaseException)
                other.error, other.finished = RuntimeError("ingest interrupted"), True
            if other is not item:
                other.done.set()
        with _lock:
            if _queue:
                _queue[0].done.set()  # the next leader: its own batch heads the group
            else:
                _leading = False
    return item.outcome()


def _shareable(batch: p.Batch) -> tuple[str, str] | None:
    """The place of `batch` in a shared transaction (its group's name, its agent),
    or None when it is to be stored in a transaction of its own.

    A shared transaction holds each of its batches' group row locks until it commits: the
    FOR KEY SHARE of the read and the update of the group's activity (ingest.store.writer).
    Two processes' shared transactions that took two groups in opposite orders deadlocked,
    and Postgres breaks a deadlock only after `deadlock_timeout` (1 s), after which each batch
    is stored again alone: the backlog shape (4 nodes a training group) lost ~2/3 of its
    throughput (docs/performance.md). So every shared transaction stores its batches in
    group-name order, and a batch that would break that order is stored alone, as before
    group commit, its locks taken in name order within it: one that names several groups,
    or one that locks its group FOR UPDATE (a transition, a checkpoint or a process record
    naming its job waits for every batch sharing the row; in a shared transaction it would
    also hold up the others).
    """
    name = ""
    for rec in batch.records:
        group = getattr(rec, "group", None)
        if group is None:
            continue
        if locks_group(rec) or (name and group != name):
            return None
        name = group
    return name, batch.agent.id


def _alone(item: _Item) -> None:
    try:
        item.result = ingest_batch(**item.kwargs)
    except BaseException as exc:  # noqa: BLE001 - handed to the batch's own request
        item.error = exc
    item.finished = True


def _run(group: list[_Item]) -> None:
    """Store `group` in one transaction, or (one batch, or any failure) each on its own."""
    if len(group) == 1:
        _alone(group[0])
        return
    group = sorted(group, key=lambda item: item.order)  # one lock order (`_shareable`)
    results: list[IngestResult] = []
    try:
        with transaction.atomic(), connection.wrap_database_errors:
            rows: dict[str, list[str]] = {}
            writers = []
            for item in group:
                kw = item.kwargs
                batch = kw["batch"]
                skew, shift = check_batch(batch, kw["now"], kw["max_future_s"])
                writer = store_batch(
                    node=kw["node"],
                    batch=batch,
                    now=kw["now"],
                    skew=skew,
                    shift=shift,
                    want_card=kw["want_card"],
                    launcher_group=kw["launcher_group"],
                    credential_id=kw["credential_id"],
                )
                writers.append(writer)
                if not isinstance(writer, Receipts):
                    for table, lines in writer.rows.items():
                        rows.setdefault(table, []).extend(lines)
            copy_rows(rows)  # a DataError: stored alone, the batch's 400 names its record
        for item, writer in zip(group, writers, strict=True):
            batch = item.kwargs["batch"]
            results.append(
                IngestResult(ack_seq=batch.seq, duplicate=True, receipts=writer)
                if isinstance(writer, Receipts)
                else writer_result(writer, batch)
            )
    except Exception:  # noqa: BLE001 - rolled back: each batch gets its own answer
        for item in group:
            _alone(item)
        return
    for item, result in zip(group, results, strict=True):
        item.result, item.finished = result, True
