"""Cached agent tokens and group commit: cheaper per batch, never less safe.

A revoked token is refused on its next batch although its credential is cached in this
process (the store re-checks revocation in the batch's transaction); batches that share one
transaction are each acknowledged only after it commits, and one bad batch of a group gets
its own answer while the others are stored.
"""

from __future__ import annotations

import contextlib
import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from agents import protocol
from ingest import auth
from ingest.models import AgentCredential, BatchReceipt, StepRecord
from ingest.store import group_commit, writer
from tests.conftest import make_batch


def _post(client: Any, batch: dict[str, Any], token: str) -> Any:
    return client.post(
        "/api/v1/ingest",
        data=json.dumps(batch),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )


def _step(step: int, **fields: object) -> dict[str, Any]:
    return {"kind": "step", "group": "job-gc", "generation": 1, "rank": 0, "step": step, **fields}


def _item(node: str, token: str, records: list[dict[str, Any]]) -> Any:
    """A queued batch of `node`'s, as `group_commit.store` makes it."""
    batch = protocol.decode_batch(json.dumps(make_batch(records, node=node)).encode())
    credential = auth.authenticate(f"Bearer {token}")
    assert credential is not None
    return group_commit._Item(
        {"node": credential.node, "batch": batch, "now": timezone.now(),
         "max_future_s": 300, "want_card": False, "launcher_group": "",
         "credential_id": credential.pk},
        group_commit._shareable(batch) or ("", ""),
    )  # fmt: skip


@pytest.mark.django_db
def test_a_token_revoked_elsewhere_is_refused_on_its_next_batch_although_cached(client):
    token = auth.issue_token(node_name="node-rv")
    first = make_batch([{"kind": "heartbeat"}], node="node-rv")
    assert _post(client, first, token).status_code == 202
    assert auth.hash_token(token) in auth._cache  # the next batch authenticates from it
    # As `faultline token revoke` does from another process: this one's cache is untouched.
    AgentCredential.objects.update(revoked_at=timezone.now())
    assert auth.hash_token(token) in auth._cache

    second = make_batch([_step(1)], node="node-rv")
    response = _post(client, second, token)
    assert response.status_code == 401
    assert not BatchReceipt.objects.filter(seq=second["seq"]).exists()  # nothing stored
    assert StepRecord.objects.count() == 0
    assert auth.hash_token(token) not in auth._cache
    # A replay of a stored batch is refused too, not acknowledged as a duplicate.
    auth._cache[auth.hash_token(token)] = (AgentCredential.objects.get(), 1e18)
    assert _post(client, first, token).status_code == 401


@pytest.mark.django_db
def test_revoking_in_this_process_forgets_the_cached_credential(
    client, django_capture_on_commit_callbacks
):
    token = auth.issue_token(node_name="node-rv2")
    batch = make_batch([{"kind": "heartbeat"}], node="node-rv2")
    assert _post(client, batch, token).status_code == 202
    assert auth.hash_token(token) in auth._cache
    with django_capture_on_commit_callbacks(execute=True):
        assert auth.revoke_tokens(node_name="node-rv2") == 1
    assert auth._cache == {}
    batch = make_batch([{"kind": "heartbeat"}], node="node-rv2")
    assert _post(client, batch, token).status_code == 401


@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_share_a_transaction_and_a_bad_one_gets_its_own_400(monkeypatch):
    """Hold the first group's transaction open until the others queued behind it: they are
    stored as one group, each answered after its commit; the bad one fails alone."""
    monkeypatch.setattr(group_commit.settings, "INGEST_GROUP_COMMIT_MAX", 16)
    tokens = {f"node-gc{i}": auth.issue_token(node_name=f"node-gc{i}") for i in range(6)}
    sizes: list[int] = []
    release = threading.Event()
    run = group_commit._run

    def held_run(group: list[Any]) -> None:
        sizes.append(len(group))
        if len(sizes) == 1:
            release.wait(10)  # the first leader holds while the others queue
        run(group)

    monkeypatch.setattr(group_commit, "_run", held_run)
    answers: dict[str, Any] = {}

    def send(node: str, records: list[dict[str, Any]]) -> None:
        try:
            answers[node] = _post(Client(), make_batch(records, node=node), tokens[node])
        finally:
            connection.close()

    first = threading.Thread(target=send, args=("node-gc0", [_step(1)]))
    first.start()
    while not sizes:  # the first batch leads and holds
        threading.Event().wait(0.01)
    others = [
        threading.Thread(target=send, args=(node, [_step(i + 2, rank=i + 1)]))
        for i, node in enumerate(list(tokens)[1:5])
    ]
    # Out of range for its column: the group's COPY fails, so each batch is stored alone.
    bad = threading.Thread(target=send, args=("node-gc5", [_step(9, generation=2**40)]))
    for t in [*others, bad]:
        t.start()
    while len(group_commit._queue) < 5:
        threading.Event().wait(0.01)
    release.set()
    for t in [first, *others, bad]:
        t.join(30)

    assert sizes[:2] == [1, 5]  # the five queued behind the first went as one group
    assert {n: r.status_code for n, r in answers.items()} == {
        **{f"node-gc{i}": 202 for i in range(5)},
        "node-gc5": 400,
    }
    assert answers["node-gc5"].json()["field"] == "generation"
    assert BatchReceipt.objects.count() == 5
    assert sorted(StepRecord.objects.values_list("step", flat=True)) == [1, 2, 3, 4, 5]


@pytest.mark.django_db(transaction=True)
def test_a_group_without_a_bad_batch_commits_once_for_all(monkeypatch):
    monkeypatch.setattr(group_commit.settings, "INGEST_GROUP_COMMIT_MAX", 16)
    tokens = {f"node-gk{i}": auth.issue_token(node_name=f"node-gk{i}") for i in range(4)}
    alone: list[Any] = []
    monkeypatch.setattr(group_commit, "_alone", lambda item: alone.append(item))
    items = [_item(node, tokens[node], [_step(i + 1, rank=i)]) for i, node in enumerate(tokens)]
    group_commit._run(items)
    assert alone == []  # stored together, nobody retried alone
    assert all(i.finished and i.result and not i.result.duplicate for i in items)
    assert BatchReceipt.objects.count() == 4
    assert StepRecord.objects.count() == 4


def test_only_a_batch_of_one_group_that_locks_no_group_row_shares_a_transaction():
    def shareable(records: list[dict[str, Any]]) -> Any:
        return group_commit._shareable(
            protocol.decode_batch(
                json.dumps(make_batch(records, node="n", agent_id="agent-00")).encode()
            )
        )

    assert shareable([{"kind": "heartbeat"}]) == ("", "agent-00")
    assert shareable([{"kind": "heartbeat"}, _step(1), _step(2, rank=1)]) == ("job-gc", "agent-00")
    # Two groups, or a checkpoint or a transition (FOR UPDATE): a transaction of its own.
    assert shareable([_step(1), {**_step(1), "group": "job-other"}]) is None
    checkpoint = {"kind": "checkpoint", "group": "job-gc", "generation": 1,
                  "checkpoint_id": "ck-1", "phase": "committed", "step": 1}  # fmt: skip
    assert shareable([_step(1), checkpoint]) is None
    transition = {"kind": "transition", "group": "job-gc", "generation": 2, "to_state": "running"}
    assert shareable([transition]) is None


@pytest.mark.django_db(transaction=True)
def test_two_processes_groups_naming_two_jobs_in_opposite_orders_do_not_deadlock(monkeypatch):
    """Two web processes' shared transactions, each holding the first job's row (its
    activity update) when it reaches the second: stored in job order, the second waits for
    the first instead of deadlocking (which Postgres breaks after a second, and then every
    batch of the aborted group is stored again alone)."""
    tokens = {
        n: auth.issue_token(node_name=n) for n in ("node-dA", "node-dB", "node-dC", "node-dD")
    }
    jobs = {"node-dA": ("job-dl-1", 0), "node-dD": ("job-dl-1", 1),
            "node-dB": ("job-dl-2", 0), "node-dC": ("job-dl-2", 1)}  # fmt: skip
    for node, (job, rank) in jobs.items():  # the jobs and their ranks exist
        group_commit._run([_item(node, tokens[node], [{**_step(1, rank=rank), "group": job}])])
    # Every batch moves its job's activity: a row lock held to the commit.
    monkeypatch.setattr(writer, "ACTIVITY_STEP", timedelta(0))

    def items(*nodes: str) -> list[Any]:
        return [
            _item(node, tokens[node], [{**_step(2, rank=jobs[node][1]), "group": jobs[node][0]}])
            for node in nodes
        ]

    first = items("node-dA", "node-dB")  # job-dl-1, then job-dl-2
    second = items("node-dC", "node-dD")  # job-dl-2, then job-dl-1, as queued
    store, alone, run_alone = group_commit.store_batch, [], group_commit._alone
    barrier, stored = threading.Barrier(2), threading.local()

    def held_store(**kwargs: Any) -> Any:
        written = store(**kwargs)
        if not getattr(stored, "one", False):  # both hold their first job's row, then go on
            stored.one = True
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=3)
        return written

    monkeypatch.setattr(group_commit, "store_batch", held_store)
    monkeypatch.setattr(group_commit, "_alone", lambda item: (alone.append(item), run_alone(item)))

    def deadlocks() -> int:
        with connection.cursor() as cur:
            cur.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
            return int(cur.fetchone()[0])

    before = deadlocks()

    def run(group: list[Any]) -> None:
        try:
            group_commit._run(group)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(g,)) for g in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert alone == []  # neither group was rolled back
    assert all(i.finished and i.result and not i.result.duplicate for i in first + second)
    assert StepRecord.objects.filter(step=2).count() == 4
    connection.close()  # pg_stat_database is read from a snapshot per transaction
    assert deadlocks() == before
