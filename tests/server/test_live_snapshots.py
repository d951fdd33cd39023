"""Incremental diagnosis passes on the real database: ingest over HTTP, then the live
state (console.snapshots) against a full read of the same rows, and through to incidents."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from console import pipeline, snapshots
from console.models import Incident
from tests.conftest import iso, make_batch
from tests.server.test_pipeline import GROUP, _history

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_states():
    snapshots.forget()
    yield
    snapshots.forget()


def _step(rank: int, step: int, ts: datetime, ms: float = 1000.0, gen: int = 1) -> dict:
    return {
        "kind": "step",
        "group": GROUP,
        "generation": gen,
        "rank": rank,
        "step": step,
        "tokens": 2048,
        "duration_ms": ms,
        "loss": 2.5,
        "ts": iso(ts),
        "phases": {"compute": ms * 0.7, "collective": ms * 0.25, "input": ms * 0.05},
    }


def test_a_live_pass_reads_only_new_rows_and_equals_a_full_read(post_batch):
    start = datetime.now(UTC) - timedelta(seconds=30)
    _history(post_batch, ranks=8, per_node=4, start=start, steps=10)
    now = start + timedelta(seconds=11)
    first = snapshots.load(group_name=GROUP, now=now)
    assert snapshots.last_pass["mode"] == "full"
    assert first == snapshots.load(group_name=GROUP, now=now, incremental=False)

    # Two ranks step on; one exits; rank 3 reports a collective window.
    t = start + timedelta(seconds=10)
    news = [
        _step(0, 10, t),
        _step(1, 10, t),
        {
            "kind": "process",
            "group": GROUP,
            "generation": 1,
            "rank": 2,
            "event": "exited",
            "exit_code": 1,
            "reason": "exception",
            "ts": iso(t),
        },
        {
            "kind": "collective",
            "group": GROUP,
            "generation": 1,
            "rank": 3,
            "ts": iso(t),
            "entries": [
                {
                    "seq": 9,
                    "pg": "0",
                    "op": "all_reduce",
                    "numel": 8,
                    "dtype": "bfloat16",
                    "state": "started",
                    "started_ts": iso(t),
                }
            ],
        },
    ]
    assert post_batch(make_batch(news, node="node-0", sent_at=t)).status_code == 202
    later = now + timedelta(seconds=1)
    live = snapshots.load(group_name=GROUP, now=later)
    assert snapshots.last_pass == {"mode": "incremental", "rows": 4, "touched": 4}
    assert live == snapshots.load(group_name=GROUP, now=later, incremental=False)
    # Nothing new: nothing read, nothing rebuilt, the same snapshot.
    again = snapshots.load(group_name=GROUP, now=later)
    assert snapshots.last_pass == {"mode": "incremental", "rows": 0, "touched": 0}
    assert again == live
    # A worker restart loses the state: the next pass rebuilds it from a full read.
    snapshots.forget()
    assert snapshots.load(group_name=GROUP, now=later) == live
    assert snapshots.last_pass["mode"] == "full"


@pytest.mark.django_db(transaction=True)
def test_a_row_committed_late_below_the_cursor_is_read_by_the_next_pass(post_batch, monkeypatch):
    """A writer in flight at a pass commits a row whose id is below rows that pass read:
    the pass after the commit reads it, and only it. Until then a pass finds nothing late by
    counting the rows between the floor and the newest id applied, not by reading their ids
    (16k of them after a stepped pass at 16k ranks)."""
    import threading

    from django.db import connection, transaction

    from console.models import ConsistencyGroup, Node
    from console.queries.telemetry import rank_tables
    from ingest.models import StepRecord

    start = datetime.now(UTC) - timedelta(seconds=30)
    _history(post_batch, ranks=4, per_node=4, start=start, steps=5)
    now = start + timedelta(seconds=6)
    snapshots.load(group_name=GROUP, now=now)
    assert snapshots.last_pass["mode"] == "full"
    group, node = ConsistencyGroup.objects.get(name=GROUP), Node.objects.get(name="node-0")
    t = start + timedelta(seconds=5)
    holding, release = threading.Event(), threading.Event()

    def late_writer() -> None:
        try:
            with transaction.atomic():  # the row's id is drawn now, visible at commit
                StepRecord.objects.create(
                    ts=t, node=node, group=group, generation=1, rank=1, step=5, tokens=2048,
                    duration_ms=1000.0, phases={"compute": 700.0}, loss=2.5,
                )  # fmt: skip
                holding.set()
                release.wait(30)
        finally:
            connection.close()

    writer = threading.Thread(target=late_writer)
    writer.start()
    try:
        assert holding.wait(30)
        batch = [_step(rk, 5, t) for rk in (0, 2, 3)]  # ids above the late row's
        assert post_batch(make_batch(batch, node="node-0", sent_at=t)).status_code == 202
        snapshots.load(group_name=GROUP, now=now + timedelta(seconds=1))
        assert snapshots.last_pass["rows"] == 3
        sql: list[str] = []
        real = rank_tables._fetch

        def spy(query: str, params: list[Any]) -> list[tuple[Any, ...]]:
            sql.append(query)
            return real(query, params)

        monkeypatch.setattr(rank_tables, "_fetch", spy)
        snapshots.load(group_name=GROUP, now=now + timedelta(seconds=2))
        assert snapshots.last_pass["rows"] == 0  # the late row is not visible yet
        assert any(q.startswith("SELECT count(*)") for q in sql), sql
        assert not any(q.startswith("SELECT id ") for q in sql), sql
    finally:
        release.set()
        writer.join(30)
    sql.clear()
    later = now + timedelta(seconds=3)
    live = snapshots.load(group_name=GROUP, now=later)
    assert snapshots.last_pass["mode"] == "incremental"
    assert snapshots.last_pass["rows"] == 1  # the late row, once
    assert any(q.startswith("SELECT id ") for q in sql), sql
    assert live == snapshots.load(group_name=GROUP, now=later, incremental=False)
    rank1 = next(r for r in live.ranks if r.rank == 1)
    assert 5 in [s.step for s in rank1.steps]


def test_an_earlier_now_or_a_new_generation_rebuilds(post_batch):
    start = datetime.now(UTC) - timedelta(seconds=30)
    _history(post_batch, ranks=4, per_node=4, start=start, steps=5)
    now = start + timedelta(seconds=6)
    snapshots.load(group_name=GROUP, now=now)
    snapshots.load(group_name=GROUP, now=now - timedelta(seconds=1))
    assert snapshots.last_pass["mode"] == "full"
    restart = {
        "kind": "transition",
        "group": GROUP,
        "generation": 2,
        "to_state": "recovering",
        "restart_count": 1,
        "ts": iso(now),
    }
    batch = make_batch([restart, _step(0, 1, now, gen=2)], node="node-0", sent_at=now)
    assert post_batch(batch).status_code == 202, post_batch
    snap = snapshots.load(group_name=GROUP, now=now + timedelta(seconds=1))
    assert snapshots.last_pass["mode"] == "full"
    assert snap is not None and snap.generation == 2
    assert [r.rank for r in snap.ranks] == [0]


def test_the_passes_across_a_restart_equal_a_full_read(post_batch):
    """A restart's first pass rebuilds on the transition alone (the new generation has no
    rows yet); the next one reads the new generation's processes and steps and judges
    every restarted rank, as a full read does."""
    start = datetime.now(UTC) - timedelta(seconds=30)
    _history(post_batch, ranks=4, per_node=4, start=start, steps=5)
    t = datetime.now(UTC) - timedelta(seconds=10)
    snapshots.load(group_name=GROUP, now=t)
    restart = {"kind": "transition", "group": GROUP, "generation": 2, "to_state": "running",
               "world_size": 4, "ts": iso(t)}  # fmt: skip
    assert post_batch(make_batch([restart], node="node-0")).status_code == 202
    first = snapshots.load(group_name=GROUP, now=t + timedelta(seconds=1))
    assert snapshots.last_pass["mode"] == "full"
    assert first is not None and first.generation == 2 and first.ranks == ()
    news: list[dict[str, Any]] = [
        {"kind": "process", "group": GROUP, "generation": 2, "rank": rk, "event": "started",
         "pid": 50 + rk, "ts": iso(t + timedelta(seconds=1))}
        for rk in range(4)
    ]  # fmt: skip
    news += [_step(rk, 0, t + timedelta(seconds=2), gen=2) for rk in range(4)]
    assert post_batch(make_batch(news, node="node-0")).status_code == 202
    later = t + timedelta(seconds=3)
    live = snapshots.load(group_name=GROUP, now=later)
    assert snapshots.last_pass == {"mode": "incremental", "rows": 8, "touched": 4}
    assert live is not None and [r.rank for r in live.ranks] == [0, 1, 2, 3]
    assert live == snapshots.load(group_name=GROUP, now=later, incremental=False)


def test_a_silent_hang_is_found_by_live_passes(post_batch):
    """Ranks keep stepping, one stops: passes on the live state open its hang incident."""
    start = datetime.now(UTC) - timedelta(seconds=60)
    # sent_at is the real clock (no skew to correct): the records keep their ts.
    started = [
        {
            "kind": "process",
            "group": GROUP,
            "generation": 1,
            "rank": rk,
            "event": "started",
            "pid": 100 + rk,
            "ts": iso(start),
        }
        for rk in range(4)
    ]
    post_batch(make_batch(started, node="node-0"))
    for s in range(22):
        t = start + timedelta(seconds=s + 1)
        batch = [_step(rk, s, t) for rk in range(4) if rk != 2 or s < 10]
        post_batch(make_batch(batch, node="node-0"))
        pipeline.diagnose(group_name=GROUP, now=t + timedelta(milliseconds=500))
        assert snapshots.last_pass["mode"] == ("full" if s == 0 else "incremental")
        assert snapshots.last_pass["rows"] == (len(batch) + 4 if s == 0 else len(batch))
    (incident,) = Incident.objects.filter(group__name=GROUP)
    assert incident.kind in {"rank_hang", "group_stall"}
    assert incident.subject in {f"rank:{GROUP}/2", f"group:{GROUP}"}


def test_a_pipeline_pass_freezes_the_live_state_and_a_rebuild_releases_it(post_batch):
    """console.collector wired into the worker's path: a pass leaves what it kept frozen
    (no gen-2 walk of it later), and the next full rebuild collects what was frozen."""
    import gc

    start = datetime.now(UTC) - timedelta(seconds=30)
    _history(post_batch, ranks=4, per_node=4, start=start, steps=5)
    gc.unfreeze()
    try:
        pipeline.diagnose(group_name=GROUP, now=start + timedelta(seconds=6))
        assert snapshots.last_pass["mode"] == "full"
        assert gc.isenabled()
        frozen = gc.get_freeze_count()
        assert frozen > 0
        pipeline.diagnose(group_name=GROUP, now=start + timedelta(seconds=7))
        assert snapshots.last_pass["mode"] == "incremental"
        assert gc.get_freeze_count() >= frozen  # frozen again, not released
        snapshots.forget()
        released: list[int] = []
        real = gc.unfreeze

        def unfreeze() -> None:
            released.append(gc.get_freeze_count())
            real()

        gc_mod = pytest.MonkeyPatch()
        gc_mod.setattr(gc, "unfreeze", unfreeze)
        try:
            pipeline.diagnose(group_name=GROUP, now=start + timedelta(seconds=8))
        finally:
            gc_mod.undo()
        assert snapshots.last_pass["mode"] == "full"
        assert released and released[0] > 0  # the rebuild released the frozen heap
    finally:
        gc.unfreeze()


def _gpu(gpu: str, ts: datetime, **fields: object) -> dict:
    return {"kind": "device_sample", "gpu": gpu, "index": 0, "temp_c": 50.0, "ts": iso(ts),
            **fields}  # fmt: skip


def _device_read(node_ids: set[int], names: dict[int, str], now: datetime) -> list[dict]:
    return sorted(snapshots._device_records(node_ids, names, now), key=lambda r: r["gpu"])


def test_gpu_samples_are_decoded_again_only_when_their_row_changed(post_batch):
    """The per-GPU cache (decoding 16k last_samples each pass cost up to 1 s)
    gives what a cold read gives, after every kind of change ingest makes."""
    from console.models import Node

    t = datetime.now(UTC) - timedelta(seconds=20)
    post_batch(make_batch([_gpu("GPU-a", t), _gpu("GPU-b", t)], node="node-1"))
    post_batch(make_batch([_gpu("GPU-c", t)], node="node-2"))
    nodes = {n.pk: n.name for n in Node.objects.filter(name__in=["node-1", "node-2"])}
    ids, now = set(nodes), t + timedelta(seconds=30)

    def cold() -> list[dict]:
        snapshots.forget()
        return _device_read(ids, nodes, now)

    first = _device_read(ids, nodes, now)
    assert [r["gpu"] for r in first] == ["GPU-a", "GPU-b", "GPU-c"]
    assert _device_read(ids, nodes, now) == first
    again = {r["gpu"]: r for r in _device_read(ids, nodes, now)}
    by_gpu = {r["gpu"]: r for r in first}
    assert all(again[g] is by_gpu[g] for g in by_gpu)  # nothing changed: nothing decoded

    # A throttled sample on GPU-a, then a clean one (ingest carries `throttled` over).
    hot = _gpu("GPU-a", t + timedelta(seconds=5), temp_c=91.0,
               throttle_reasons=["hw_thermal_slowdown"])  # fmt: skip
    post_batch(make_batch([hot], node="node-1"))
    warm = _device_read(ids, nodes, now)
    assert warm[0]["temp_c"] == 91.0 and warm[0]["throttle_reasons"] == ["hw_thermal_slowdown"]
    assert warm[1] is by_gpu["GPU-b"]  # only the changed row was read again
    assert warm == cold()
    post_batch(make_batch([_gpu("GPU-a", t + timedelta(seconds=6), temp_c=70.0)], node="node-1"))
    warm = _device_read(ids, nodes, now)
    assert warm[0]["temp_c"] == 70.0
    assert isinstance(warm[0]["throttled"]["ts"], datetime)  # the last throttle, kept
    assert warm == cold()

    # A GPU of another node is not this group's; a node renamed is read again.
    node_2 = next(pk for pk, name in nodes.items() if name == "node-2")
    assert [r["gpu"] for r in _device_read({node_2}, nodes, now)] == ["GPU-c"]
    renamed = {pk: f"{name}-x" for pk, name in nodes.items()}
    assert {r["node"] for r in _device_read(ids, renamed, now)} == {"node-1-x", "node-2-x"}


def test_the_binary_reads_give_what_the_orm_gives_for_every_per_rank_table(post_batch):
    """console.queries.binary skips the ORM for the bulk rows: the records (types, time
    zones, jsonb, NaN and null) must be the ones Django's values() gives for the same rows."""
    import math

    from console.models import ConsistencyGroup
    from console.queries.telemetry import rank_tables, shared
    from ingest import models as m

    start = datetime.now(UTC) - timedelta(seconds=30)
    _history(post_batch, ranks=4, per_node=4, start=start, steps=3)
    t = start + timedelta(seconds=5)
    odd = {**_step(1, 3, t), "loss": "NaN", "grad_norm": 3.5, "overflow": True,
           "phases": {"compute": 1.0, "collective": None}}  # fmt: skip
    window = {"kind": "collective", "group": GROUP, "generation": 1, "rank": 2, "ts": iso(t),
              "entries": [{"seq": 4, "pg": "0", "op": "all_to_all", "numel": 8, "dtype": "bf16",
                           "state": "started", "started_ts": iso(t), "in_splits": [3, 5],
                           "out_splits": [4, 4]}]}  # fmt: skip
    report = {"kind": "process_groups", "group": GROUP, "generation": 1, "rank": 2,
              "ts": iso(t), "groups": [{"pg": "0", "size": 4, "desc": "world"}]}  # fmt: skip
    ended = {"kind": "process", "group": GROUP, "generation": 1, "rank": 3, "ts": iso(t),
             "event": "exited", "exit_code": 1, "signal": 9,
             "reason": "oom", "error_type": "RuntimeError"}  # fmt: skip
    response = post_batch(make_batch([odd, window, report, ended], node="node-0"))
    assert response.status_code == 202, response.content
    group = ConsistencyGroup.objects.get(name=GROUP)
    names = dict(m.StepRecord.objects.values_list("node_id", "node__name").distinct())
    now = t + timedelta(seconds=1)

    got = rank_tables.rank_records(group, node_names=names, now=now)
    since = rank_tables.rank_records_since(group, node_names=names, after={}, skip={})
    assert since is not None
    want = []
    for kind, (model, fields, _) in rank_tables.RANK_TABLES.items():
        rows = model.objects.filter(group=group, stale=False).order_by("id")
        want += rank_tables._collective_ts(shared.contract_rows(rows, kind, ["id", *fields], names))

    def norm(recs: list[dict]) -> list[tuple]:
        # NaN != NaN: compare it by name; everything else by value, type and time zone.
        def v(x: object) -> object:
            if isinstance(x, float) and math.isnan(x):
                return "nan"
            if isinstance(x, datetime):
                return (x, x.utcoffset())
            return (x, type(x).__name__)

        return sorted(
            (r["kind"], r["id"], tuple(sorted((k, repr(v(x))) for k, x in r.items()))) for r in recs
        )

    assert norm(since) == norm(want)
    assert norm(got) == norm(want)  # every row is recent and newest per rank here
    nan_step = next(r for r in got if r["kind"] == "step" and r["rank"] == 1 and r["step"] == 3)
    assert math.isnan(nan_step["loss"]) and nan_step["phases"] == {"compute": 1.0}


def test_the_binary_node_reads_give_what_the_orm_gives(post_batch):
    """Host, network and device evidence of a group's nodes, read with one array parameter
    in binary (a 2k-node group's IN lists cost ~10 ms of compiling per query): the contract's
    golden host batch, read back as the ORM's values() reads it."""
    import json
    from pathlib import Path

    from console.queries.telemetry import node_evidence, shared
    from ingest import models as m

    golden = json.loads(
        (Path(__file__).parents[1] / "agents/fixtures/contract/host_records.json").read_text()
    )
    now = datetime.now(UTC)
    records = [{**r, "ts": iso(now - timedelta(seconds=30 - i))}
               for i, r in enumerate(golden["records"])]  # fmt: skip
    response = post_batch(make_batch(records, node="node-7"))
    assert response.status_code == 202, response.content
    names = dict(m.HostEvent.objects.values_list("node_id", "node__name").distinct())
    ids = set(names)

    def orm(qs: Any, kind: str, fields: list[str]) -> list[dict]:
        return shared.contract_rows(qs, kind, fields, names)

    host = ["event", "device", "code", "pid", "comm", "severity"]
    net = ["port", "link", "event", "state", "rate_gbps", "prev_rate_gbps", "counters"]
    sample = ["port", "link", "state", "rate_gbps", "counters", "interval_s"]
    disks = ["mem_some_avg10", "mem_full_avg10", "io_full_avg10", "swap_used_bytes",
             "swap_total_bytes", "d_state", "disks"]  # fmt: skip
    want = (
        orm(m.HostEvent.objects.filter(node_id__in=ids).order_by("id"), "host_event", host)
        + orm(m.NetEvent.objects.filter(node_id__in=ids).order_by("id"), "net_event", net)
        + orm(m.NetSample.objects.filter(node_id__in=ids).order_by("node_id", "port"),
              "net_sample", sample)
        + orm(m.HostSample.objects.filter(node_id__in=ids), "host_sample", disks)
    )  # fmt: skip
    got = node_evidence.host_records(ids, node_names=names, now=now)
    assert got == want and len(got) == 11
    assert [sorted((k, type(v).__name__) for k, v in r.items()) for r in got] == [
        sorted((k, type(v).__name__) for k, v in r.items()) for r in want
    ]
    events = ["gpu", "event", "code", "detail", "recovery_action"]
    want_events = orm(m.DeviceEvent.objects.filter(node_id__in=ids), "device_event", events)
    assert node_evidence.device_events(ids, node_names=names, now=now) == want_events
    assert len(want_events) == 1


def test_a_slow_pass_logs_where_its_load_went(post_batch, monkeypatch, caplog):
    """The slow-pass WARNING splits the snapshot's time into its parts (a full read's
    collection, writers' wait, read and apply; the evidence and the build), for an
    operator whose 16k-rank pass took 47 s instead of 6."""
    import logging

    start = datetime.now(UTC) - timedelta(seconds=30)
    _history(post_batch, ranks=4, per_node=4, start=start, steps=5)
    monkeypatch.setattr(pipeline, "SLOW_PASS_S", 0.0)
    with caplog.at_level(logging.WARNING, logger="console.pipeline"):
        pipeline.diagnose(group_name=GROUP, now=start + timedelta(seconds=6))
        pipeline.diagnose(group_name=GROUP, now=start + timedelta(seconds=7))
    full, incremental = (r.getMessage() for r in caplog.records if "slow pass" in r.message)
    for part in ("gc", "writers", "read", "apply", "evidence", "build"):
        assert f"{part} " in full.split("[")[1], full
    assert "full read" in full and "incremental read" in incremental
    assert "gc " not in incremental.split("[")[1], incremental
    # An incremental read says which of its parts took the time (a 16k pass read 98k rows
    # in 10 s while its neighbours read 33-65k in under 3).
    assert "; read: " not in full, full
    assert "recheck s " in incremental.split("; read: ")[1], incremental
    assert "new s " in incremental.split("; read: ")[1], incremental


def test_a_pass_with_nothing_new_hands_the_live_state_the_same_record_dicts(post_batch):
    """The evidence reads make new dicts every pass; those equal to last pass's are handed
    on as last pass's very dicts, so the live state keeps its non-rank build (and the
    engine its per-GPU values), and the snapshot is still a full read's."""
    start = datetime.now(UTC) - timedelta(seconds=30)
    _history(post_batch, ranks=8, per_node=4, start=start, steps=10)
    ckpt = {"kind": "checkpoint", "group": GROUP, "generation": 1, "checkpoint_id": "c1",
            "phase": "committed", "step": 5, "ts": iso(start + timedelta(seconds=6))}  # fmt: skip
    assert post_batch(make_batch([ckpt], node="node-0", sent_at=start)).status_code == 202
    now = start + timedelta(seconds=11)
    snapshots.load(group_name=GROUP, now=now)
    entry = snapshots._states[GROUP]
    first, built = list(entry.records), entry.live._base
    later = now + timedelta(seconds=1)
    again = snapshots.load(group_name=GROUP, now=later)
    kept = snapshots._states[GROUP].records
    assert any(r["kind"] == "checkpoint" for r in first)  # read again: a new dict
    assert first and len(kept) == len(first)
    assert all(a is b for a, b in zip(first, kept, strict=True))
    assert built is not None and entry.live._base is not None
    assert entry.live._base.snap.devices is built.snap.devices  # not built again
    assert again == snapshots.load(group_name=GROUP, now=later, incremental=False)
    # A record that changed is not replaced: its GPU's new sample reaches the snapshot.
    t = later + timedelta(seconds=1)
    sample = {"kind": "device_sample", "ts": iso(t), "gpu": "GPU-node-0-0", "index": 0,
              "temp_c": 91.0, "throttle_reasons": ["sw_thermal_slowdown"]}  # fmt: skip
    assert post_batch(make_batch([sample], node="node-0", sent_at=t)).status_code == 202
    last = t + timedelta(seconds=1)
    third = snapshots.load(group_name=GROUP, now=last)
    assert third == snapshots.load(group_name=GROUP, now=last, incremental=False)
    assert any(d.sample and d.sample.temp_c == 91.0 for d in third.devices)
