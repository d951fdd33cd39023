"""Faultline survives its own faults: kill, stop and skew its parts under load.

Each test breaks one part of a real `faultline up` (its own data dir, loopback only) while a
real agent or a direct client pushes, puts it back, and checks what users depend on: every
record stored exactly once, honest 503s with Retry-After while the database is away, ingest
that keeps storing without Redis, one incident however often diagnosis is cut short.
docs/reliability.md lists the figures and the command that reproduces each.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from faultline.testing.service import ADMIN, BIN, Service, start_service, stop_service, wait_for
from tests.conftest import make_batch
from tests.system.chaos import harness as h

pytestmark = pytest.mark.slow

ARTIFACTS = Path("test-artifacts")
LOGIN_FAILURES = 5  # FAULTLINE_LOGIN_FAILURE_LIMIT's default


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A service of our own: these tests break it, others must not share it."""
    service = start_service(tmp_path_factory.mktemp("chaos"))
    service.extra_procs = []  # restarted Valkey, dry-run agents
    yield service
    try:
        stop_service(service)
    finally:
        for proc in service.extra_procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        ARTIFACTS.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):
            (ARTIFACTS / "chaos-up.log").write_bytes(service.log.read_bytes())


def _agent(svc: Service, node: str, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    proc = svc.start_agent(node, "--interval", "0.25", *extra)
    state = svc.data_dir / "agents" / node
    h.wait_agent_socket(state)
    return proc, state


def _agent_row(svc: Service, node: str) -> dict[str, Any]:
    rows = [a for a in svc.api("/api/v1/agents/")["results"] if a["node"] == node]
    assert len(rows) == 1, rows
    return rows[0]


def _reported_drops(svc: Service, node: str) -> bool:
    """The agent's row says it dropped records; False while it has no row yet (its first
    batch, a 1.5 MiB backlog, may not have landed)."""
    rows = [a for a in svc.api("/api/v1/agents/")["results"] if a["node"] == node]
    return bool(rows) and rows[0]["dropped"] > 0


def _in_background(fn: Any, *args: Any) -> threading.Thread:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller's _join
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.errors = errors
    thread.start()
    return thread


def _join(thread: threading.Thread, timeout: float = 60) -> None:
    thread.join(timeout)
    assert not thread.is_alive(), "workload thread did not finish"
    if thread.errors:
        raise thread.errors[0]


def _assert_exactly_once(svc: Service, group: str, sent: list[int], node: str) -> None:
    wait_for(lambda: len(h.steps_stored(svc, group)) >= len(sent), 60, f"{group} to drain")
    time.sleep(1)  # a late duplicate, if any, would land now
    assert h.steps_stored(svc, group) == sorted(sent)
    dupes = h.sql(
        svc,
        "SELECT count(*) - count(DISTINCT (s.gpu, s.ts)) FROM ingest_devicesample s "
        "JOIN console_node n ON n.id = s.node_id WHERE n.name = %s",
        (node,),
    )[0][0]
    assert dupes == 0


def _nan_batch(node: str, agent_id: str, group: str, step: int) -> dict[str, Any]:
    records = [
        {"kind": "step", "group": group, "generation": 0, "rank": r, "step": step,
         "tokens": 1024, "loss": "NaN" if r == 0 else 2.0}
        for r in range(2)
    ]  # fmt: skip
    return make_batch(records, node=node, agent_id=agent_id)


def _incidents(svc: Service, group: str) -> list[tuple[str, str]]:
    return [
        (r[0], r[1])
        for r in h.sql(
            svc,
            "SELECT i.kind, i.state FROM console_incident i JOIN console_consistencygroup g "
            "ON g.id = i.group_id WHERE g.name = %s ORDER BY i.id",
            (group,),
        )
    ]


# 1 ------------------------------------------------------------------------------------


def test_it_stores_every_record_once_when_the_web_process_is_killed_mid_stream(svc):
    node, group = "node-web-kill", "g-web-kill"
    agent, state = _agent(svc, node)
    trainer = h.Trainer(state / "reporter.sock", group)
    work = _in_background(trainer.run, range(600), 0.01)
    time.sleep(1.5)
    web = h.role_pids(svc)["web"]
    workers = [c.pid for c in h.psutil.Process(web[0]).children()]
    h.kill(workers)  # every gunicorn worker, mid-request for some
    time.sleep(1.5)
    h.kill(web)  # then the master: the supervisor must bring HTTP back
    wait_for(lambda: h.role_pids(svc)["web"] not in ([], web), 20, "a new gunicorn master")
    h.wait_ready(svc)
    _join(work)
    _assert_exactly_once(svc, group, trainer.sent, node)
    assert h.stop_agent(agent) == 0
    row = _agent_row(svc, node)
    assert row["gaps"] == 0  # no batch the agent built went missing
    assert not list((state / "spool" / "inflight").glob("*.json"))
    retries = (state / "agent.log").read_text().count("retried in")
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "chaos-web-kill.json").write_text(
        json.dumps({"steps": len(trainer.sent), "batches": row["batches"],
                    "agent_retries": retries, "duplicates_acked": row.get("duplicates")})
    )  # fmt: skip


# 2 ------------------------------------------------------------------------------------


def test_it_answers_503_with_retry_after_while_postgres_is_down_and_loses_nothing(svc):
    node, group = "node-pg-down", "g-pg-down"
    agent, state = _agent(svc, node)
    token = svc.token("node-pg-probe")
    trainer = h.Trainer(state / "reporter.sock", group)
    trainer.run(range(100), every=0.005)
    socket_dir = h.stop_postgres(svc)
    try:
        statuses = []
        for n in range(3):
            batch = make_batch(
                [{"kind": "heartbeat", "uptime_s": n, "spool_depth": 0, "dropped": 0}],
                node="node-pg-probe",
                agent_id="agent-pg-probe-1",
            )
            resp = h.post_batch(svc, token, batch)
            statuses.append((resp.status, resp.headers.get("Retry-After")))
        trainer.run(range(100, 250), every=0.01)  # the agent spools these
        t0 = time.monotonic()
        ready = h.get(svc, "/readyz")
        ready_s = time.monotonic() - t0
    finally:
        h.start_postgres(svc, socket_dir)
    assert statuses == [(503, "5")] * 3
    assert (ready.status, ready.body["ready"], ready.body["checks"]["database"]) == (
        503,
        False,
        False,
    )
    assert ready_s < 5, ready_s  # inside a probe's timeout, not the pool's 10 s
    t0 = time.monotonic()
    h.wait_ready(svc)
    # Once ready, no request draws a pooled connection the restart broke (each web process
    # kept idle ones across it): every batch is stored, none answered 503.
    after = svc.token("node-pg-after")
    codes = [
        h.post_batch(svc, after, make_batch([{"kind": "heartbeat", "uptime_s": float(i)}],
                                            node="node-pg-after", agent_id="agent-pg-after",
                                            seq=i + 1)).status
        for i in range(24)
    ]  # fmt: skip
    assert codes == [202] * 24, codes
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "chaos-postgres.json").write_text(
        json.dumps({"ingest_while_down": statuses, "readyz_while_down_s": round(ready_s, 2),
                    "ready_again_after_start_s": round(time.monotonic() - t0, 2),
                    "steps": len(trainer.sent)})
    )  # fmt: skip
    _assert_exactly_once(svc, group, trainer.sent, node)
    assert h.stop_agent(agent) == 0
    # The probe's batches never reached the database: not half of one, nothing.
    assert h.sql(svc, "SELECT count(*) FROM ingest_batchreceipt WHERE agent_id = %s",
                 ("agent-pg-probe-1",))[0][0] == 0  # fmt: skip


# 3 ------------------------------------------------------------------------------------


def test_it_keeps_storing_without_redis_and_diagnoses_when_it_returns(svc):
    node, group = "node-redis-down", "g-redis-down"
    token = svc.token(node)
    with h.valkey_outage(svc):
        answers = []
        for step in range(3):
            t0 = time.monotonic()
            resp = h.post_batch(svc, token, _nan_batch(node, "agent-redis-down", group, step))
            answers.append((resp.status, time.monotonic() - t0))
        ready = h.get(svc, "/readyz").body
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "chaos-redis.json").write_text(
        json.dumps({"ingest_while_down": [(code, round(s, 3)) for code, s in answers]})
    )
    assert [a[0] for a in answers] == [202, 202, 202]
    assert max(a[1] for a in answers) < 3.0, answers  # cache/broker timeouts stay short
    assert ready["checks"]["broker"] is False
    assert h.steps_stored(svc, group) == [0, 0, 1, 1, 2, 2]
    h.wait_ready(svc)
    # Nothing was scheduled while Redis was away: the beat's sweep must find the group.
    wait_for(lambda: _incidents(svc, group), 45, "the sweep to diagnose after Redis returns")
    time.sleep(3)  # several more sweeps run; none may open a second incident
    assert _incidents(svc, group) == [("nan_loss", "open")]


def _api_post(svc: Service, path: str, data: dict[str, Any]) -> Any:
    import base64
    import urllib.request

    request = urllib.request.Request(
        svc.url + path, data=json.dumps(data).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": "Basic "
                 + base64.b64encode(f"{ADMIN[0]}:{ADMIN[1]}".encode()).decode()},
    )  # fmt: skip
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as r:
        return json.loads(r.read())


class _Receiver:
    """A webhook endpoint that fails the first `fail` posts with 503, then accepts."""

    def __init__(self, fail: int) -> None:
        import http.server

        receiver = self
        self.fail, self.posts = fail, []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status = 503 if len(receiver.posts) < receiver.fail else 200
                receiver.posts.append((status, body))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def accepted(self) -> list[dict[str, Any]]:
        return [body for status, body in self.posts if status == 200]


def _page_group_to(svc: Service, receiver: _Receiver, group: str, name: str) -> None:
    """A webhook channel to `receiver` and a policy paging it at once for `group`."""
    _api_post(svc, "/api/v1/notification-channels/",
              {"name": f"{name}-hook", "kind": "webhook", "url": receiver.url,
               "secret": f"{name}-hmac-key"})  # fmt: skip
    _api_post(svc, "/api/v1/escalation-policies/",
              {"name": f"{name}-pages", "position": 1, "labels": {"group": group},
               "steps": [{"delay_s": 0, "channels": [f"{name}-hook"]}]})  # fmt: skip


def test_it_retries_a_failing_notification_without_paging_twice(svc):
    node, group = "node-notify", "g-notify"
    receiver = _Receiver(fail=2)
    try:
        _page_group_to(svc, receiver, group, "chaos")
        token = svc.token(node)
        assert h.post_batch(svc, token, _nan_batch(node, "agent-notify", group, 1)).status == 202
        wait_for(receiver.accepted, 60, "the page to get through after two 503s")
        time.sleep(12)  # another escalation sweep (10 s) and any redelivery would land now
    finally:
        receiver.server.shutdown()
    statuses = [status for status, _ in receiver.posts]
    assert statuses == [503, 503, 200], statuses
    assert len({body.get("dedup_key") for body in receiver.accepted()}) == 1


# 4 ------------------------------------------------------------------------------------


def test_it_opens_one_incident_when_the_celery_worker_is_killed_mid_task(svc):
    node, group = "node-celery-kill", "g-celery-kill"
    token = svc.token(node)
    killed = 0
    for step in range(6):
        batch = _nan_batch(node, "agent-celery-kill", group, step)
        assert h.post_batch(svc, token, batch).status == 202
        time.sleep(0.15)  # inside the 200 ms debounce + run: often mid-task
        pool = h.find(svc, "celery", "worker")
        children = [c.pid for p in pool for c in p.children()]
        h.kill(children)
        killed += len(children)
    old = h.role_pids(svc)["worker"]
    h.kill(old)  # and the whole worker: the supervisor restarts it
    wait_for(lambda: h.role_pids(svc)["worker"] not in ([], old), 20, "a new Celery worker")

    # From the new workers' pools: how long the supervisor took is the wait above, and under
    # load a Django process start took 15.4 s (and 17.6 s once in CI) of what the wait from
    # the first new pid measured. A prefork pool is forked once Django and Celery are up.
    def all_up() -> bool:
        pids = h.role_pids(svc)["worker"]
        return len(pids) == len(old) and not {*pids} & {*old} and all(map(_has_pool, pids))

    wait_for(all_up, 60, "every new worker's pool")
    t0 = time.monotonic()
    wait_for(lambda: _incidents(svc, group), 45, "diagnosis after the worker was killed")
    recovered_s = time.monotonic() - t0
    for step in range(6, 9):  # redelivered and fresh runs converge on the same incident
        batch = _nan_batch(node, "agent-celery-kill", group, step)
        assert h.post_batch(svc, token, batch).status == 202
    time.sleep(3)
    assert killed >= 1
    assert _incidents(svc, group) == [("nan_loss", "open")]
    # A task lost with its worker must not silence the group for long (the debounce key).
    assert recovered_s < 15, recovered_s
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "chaos-celery-kill.json").write_text(
        json.dumps({"pool_processes_killed": killed, "incident_after_worker_kill_s": recovered_s})
    )


def _has_pool(pid: int) -> bool:
    """A prefork worker's pool is up (the notify worker's thread pool forks nothing)."""
    try:
        proc = psutil.Process(pid)
        return "--pool threads" in " ".join(proc.cmdline()) or bool(proc.children())
    except psutil.Error:
        return False


def _stop_inside_a_pass(svc: Service, group: str, incident_id: int, trigger: Any) -> list[Any]:
    """Stop every process of the ordinary worker while its pass over `group` is inside its
    write transaction, holding what a pass holds there (the group row, the incident), on
    purpose and not by chance: a connection of the test's own locks the group's open
    incident, `trigger` schedules a pass, the pass blocks on that lock after taking the
    group's, the worker is stopped (SIGSTOP) and the test's lock let go: the pass's
    backend takes it and then sits idle in its transaction, its client frozen."""
    import psycopg

    stuck = h.find(svc, "celery", "worker", "--queues celery ")
    lane = h.find(svc, "celery", "worker", "--queues diagnose-urgent ")
    sweeper = h.find(svc, "celery", "worker", "--queues housekeeping ")
    assert stuck and lane and sweeper and not {*stuck} & {*lane, *sweeper}
    with psycopg.connect(h.runtime(svc)["DATABASE_URL"], connect_timeout=5) as holder:
        holder.execute(
            "SELECT 1 FROM console_incident WHERE id = %s FOR NO KEY UPDATE", (incident_id,)
        )
        me = holder.info.backend_pid
        trigger()

        def the_pass_waits_on_us() -> list[int]:
            return [
                pid
                for (pid,) in h.sql(
                    svc,
                    "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
                    " AND query ILIKE %s",
                    (me, "%console_incident%"),
                )
            ]

        backend = wait_for(the_pass_waits_on_us, 30, "a pass over the group to block")[0]
        h.kill([p.pid for p in stuck], signal.SIGSTOP)
        holder.rollback()  # the pass's backend now takes the incident and goes idle

    def idle_in_its_transaction() -> bool:
        rows = h.sql(svc, "SELECT state FROM pg_stat_activity WHERE pid = %s", (backend,))
        return rows == [("idle in transaction",)]

    wait_for(idle_in_its_transaction, 10, "the stopped pass idle inside its transaction")
    held = h.sql(
        svc,
        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
        " WHERE l.pid = %s AND c.relname = 'console_consistencygroup'",
        (backend,),
    )[0][0]
    assert held, "the stopped pass holds no lock on the group"
    stuck.append(backend)  # for the caller: the backend the server must end
    return stuck


def test_an_established_groups_xid_is_diagnosed_while_the_ordinary_worker_is_stuck(svc):
    """The urgent lane has a worker of its own: with every process of the ordinary worker
    stopped (SIGSTOP: a frozen or saturated worker) *inside* a pass over the same group,
    holding its rows, an established group's Xid still becomes its incident within 2 s.
    No pass, sweep or page waits on the stopped pass's locks: a batch of the group's steps
    is stored at once, the escalation sweep (housekeeping worker) schedules the page, the
    notify worker delivers it, the silent-node sweep marks a quiet node down. Postgres ends
    the frozen transaction after FAULTLINE_DB_IDLE_IN_TRANSACTION_S, and the ordinary
    worker, resumed, diagnoses the group again."""
    import redis

    node, group, gpu = "node-urgent-lane", "g-urgent-lane", "GPU-urgent-lane-0"
    quiet = "node-urgent-lane-quiet"  # its agent dies while the ordinary worker is stuck
    receiver = _Receiver(fail=0)
    _page_group_to(svc, receiver, group, "lane")
    token = svc.token(node)
    start = [
        {"kind": "transition", "group": group, "generation": 1, "to_state": "running"},
        {"kind": "process", "group": group, "generation": 1, "rank": 0, "event": "started",
         "gpu": gpu},
        {"kind": "device_sample", "gpu": gpu, "index": 0, "temp_c": 50.0},
    ]  # fmt: skip
    assert h.post_batch(svc, token, make_batch(start, node=node)).status == 202

    def step(n: int, loss: float | str = 2.0) -> list[dict[str, Any]]:
        return [{"kind": "step", "group": group, "generation": 1, "rank": 0, "step": n,
                 "tokens": 1024, "loss": loss}]  # fmt: skip

    # An open incident every pass of the group takes (and the test's lock will stop one).
    assert h.post_batch(svc, token, make_batch(step(1, "NaN"), node=node)).status == 202
    wait_for(lambda: ("nan_loss", "open") in _incidents(svc, group), 30, "the NaN's incident")
    (nan_incident,) = h.sql(
        svc,
        "SELECT i.id FROM console_incident i JOIN console_consistencygroup g"
        " ON g.id = i.group_id WHERE g.name = %s AND i.kind = 'nan_loss'",
        (group,),
    )[0]
    sample = [{"kind": "device_sample", "gpu": f"GPU-{quiet}-0", "index": 0, "temp_c": 50.0}]
    assert h.post_batch(svc, svc.token(quiet), make_batch(sample, node=quiet)).status == 202
    # Established: as if created longer ago than FAULTLINE_DIAGNOSIS_YOUNG_GROUP_S.
    client = redis.Redis.from_url(h.runtime(svc)["REDIS_URL"])
    client.delete(f"faultline:1:diag-young:{group}")

    def trigger() -> None:
        assert h.post_batch(svc, token, make_batch(step(2), node=node)).status == 202

    *stuck, backend = _stop_inside_a_pass(svc, group, nan_incident, trigger)
    try:
        t0 = time.monotonic()
        # The group's own batches do not wait on the stopped pass (its row lock).
        assert h.post_batch(svc, token, make_batch(step(3), node=node), timeout=5).status == 202
        assert time.monotonic() - t0 < 2, time.monotonic() - t0
        xid = [{"kind": "device_event", "gpu": gpu, "event": "xid", "code": 79}]
        t0 = time.monotonic()
        assert h.post_batch(svc, token, make_batch(xid, node=node)).status == 202
        wait_for(lambda: ("xid", "open") in _incidents(svc, group), 20, "the Xid's incident")
        took_s = time.monotonic() - t0
        assert took_s < 2, f"the Xid's incident took {took_s:.2f} s behind a stopped pass"
        (xid_incident,) = h.sql(
            svc,
            "SELECT i.id FROM console_incident i JOIN console_consistencygroup g"
            " ON g.id = i.group_id WHERE g.name = %s AND i.kind = 'xid'",
            (group,),
        )[0]

        def scheduled() -> bool:
            rows = h.sql(
                svc,
                "SELECT e.sent FROM console_incidentescalation e WHERE e.incident_id = %s",
                (xid_incident,),
            )
            return any(sent for (sent,) in rows)

        wait_for(scheduled, 30, "the page scheduled while the ordinary worker is stuck")
        paged_s = time.monotonic() - t0

        def xid_paged() -> bool:
            return any(body["incident"] == str(xid_incident) for body in receiver.accepted())

        wait_for(xid_paged, 30, "the page delivered while the ordinary worker is stuck")
        delivered_s = time.monotonic() - t0

        def quiet_down() -> bool:
            rows = h.sql(
                svc,
                "SELECT n.health, count(i.id) FROM console_node n LEFT JOIN console_incident i"
                " ON i.node_id = n.id AND i.kind = 'node_silent' AND i.state = 'open'"
                " WHERE n.name = %s GROUP BY n.health",
                (quiet,),
            )
            return rows == [("down", 1)]

        # Silent after NODE_SILENT_AFTER (10 s) from its one batch, then the next sweep.
        wait_for(quiet_down, 30, "the quiet node marked down while the ordinary worker is stuck")
        quiet_s = time.monotonic() - t0

        # The server ends the frozen client's transaction (its locks with it).
        def ended() -> bool:
            return not h.sql(svc, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,))

        wait_for(ended, 60, "Postgres to end the stopped pass's idle transaction")
        ended_s = time.monotonic() - t0
    finally:
        h.kill([p.pid for p in stuck], signal.SIGCONT)
        receiver.server.shutdown()
    # Resumed, the ordinary worker judges the group again (its stale connection replaced).
    before = h.sql(
        svc, "SELECT summary->>'diagnosed_at' FROM console_consistencygroup WHERE name = %s",
        (group,),
    )[0][0]  # fmt: skip
    trigger()
    wait_for(
        lambda: h.sql(
            svc, "SELECT summary->>'diagnosed_at' FROM console_consistencygroup WHERE name = %s",
            (group,),
        )[0][0] != before,
        60, "a pass over the group after the worker resumed",
    )  # fmt: skip
    pages = [body["incident"] for status, body in receiver.posts]
    assert all(status == 200 for status, _ in receiver.posts)
    assert sorted(pages) == sorted(set(pages)) and str(xid_incident) in pages  # once each
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "chaos-urgent-lane.json").write_text(
        json.dumps(
            {
                "xid_incident_s": took_s,
                "page_scheduled_s": paged_s,
                "page_delivered_s": delivered_s,
                "quiet_node_down_s": quiet_s,
                "stuck_transaction_ended_s": ended_s,
            }
        )
    )


# 5 ------------------------------------------------------------------------------------


def test_it_drops_samples_first_never_events_when_the_spool_is_full(svc):
    from agents.fake_nvml import FakeNvml
    from agents.spool import Spool
    from agents.wire import record

    node, group = "node-spool-full", "g-spool-full"
    state = svc.data_dir / "agents" / node
    # Prefill 1.5 MiB into a spool the agent will cap at 1 MiB (32 KiB segments, as its own).
    spool = Spool(state, max_bytes=8 * 1024 * 1024, segment_bytes=32 * 1024)
    gpus = FakeNvml(node, 8)
    events = 0
    while spool.bytes < 1536 * 1024:
        for i in range(8):
            spool.append(gpus.sample(i))
        if spool.bytes > 200 * 1024 * (events + 1):  # a few events spread over the backlog
            spool.append(record("step", group=group, generation=0, rank=0, step=events,
                                tokens=1, loss=1.0))  # fmt: skip
            events += 1
    spool.close()
    config = state / "agent.toml"
    config.write_text("spool_max_mb = 1\n")
    agent = svc.start_agent(node, "--interval", "0.25", "--config", str(config))
    wait_for(lambda: _reported_drops(svc, node), 30, "drops reported in heartbeats")
    wait_for(lambda: len(h.steps_stored(svc, group)) == events, 30, "every event")
    assert h.stop_agent(agent) == 0
    cursors = {
        lane: json.loads((state / "spool" / lane / "cursor.json").read_text())
        for lane in ("events", "samples")
    }
    assert cursors["events"]["dropped"] == 0
    assert cursors["samples"]["dropped"] > 0
    assert h.steps_stored(svc, group) == list(range(events))
    assert _agent_row(svc, node)["dropped"] == cursors["samples"]["dropped"]


# 6 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("skew_s", [600, -600])
def test_it_shows_clock_skew_keeps_order_and_raises_no_hang_from_skew_alone(svc, skew_s):
    from agents.wire import iso_ts

    node = f"node-skew-{'ahead' if skew_s > 0 else 'behind'}"
    group = f"g-{node}"
    state = svc.data_dir / "agents" / node
    state.mkdir(parents=True, exist_ok=True)
    # The node's clock is off: the agent process and the workload both see it.
    code = (
        f"import time, sys; _t = time.time; time.time = lambda: _t() + {skew_s}; "
        "from agents.cli import main; sys.exit(main())"
    )
    agent = subprocess.Popen(
        [sys.executable, "-c", code, "run", "--server", svc.url, "--token", svc.token(node),
         "--node", node, "--fake-gpus", "2", "--interval", "0.25", "--state-dir", str(state)],
        stdout=subprocess.DEVNULL, stderr=open(state / "agent.log", "wb"),  # noqa: SIM115
    )  # fmt: skip
    svc.agents.append(agent)
    trainer = h.Trainer(h.wait_agent_socket(state), group)
    # A healthy group keeps stepping (10 steps/s) through the whole look: a loop that
    # stopped would be a real stall once its silence outlasts the hang floor (4 s), and
    # under CI load delivering the 40th step plus the look can take longer than that.
    done = threading.Event()

    def train() -> None:
        n = 0
        while not done.is_set():
            trainer.step(n, ts=iso_ts(time.time() + skew_s))
            n += 1
            time.sleep(0.1)

    loop = threading.Thread(target=train, daemon=True)
    loop.start()
    try:
        wait_for(lambda: len(h.steps_stored(svc, group)) >= 40, 30, "skewed steps")
        time.sleep(3)  # let diagnosis and sweeps look at it
        kinds = {k for k, _ in _incidents(svc, group)}
    finally:
        done.set()
        loop.join(15)
    assert not kinds & {"rank_hang", "group_stall", "agent_silent", "node_down"}, kinds
    assert h.stop_agent(agent) == 0
    row = _agent_row(svc, node)
    assert abs(row["clock_skew_ms"] - skew_s * 1000) < 5000, row
    rows = h.sql(
        svc,
        "SELECT s.step, extract(epoch FROM now() - s.ts) FROM ingest_steprecord s "
        "JOIN console_consistencygroup g ON g.id = s.group_id WHERE g.name = %s ORDER BY s.ts",
        (group,),
    )
    assert len(rows) >= 40
    assert [r[0] for r in rows] == list(range(len(rows)))  # time order is step order
    assert all(-5 < float(r[1]) < 120 for r in rows)  # placed on the service's clock


# 7 ------------------------------------------------------------------------------------


def _loop(reporter: Any, steps: int) -> list[float]:
    """A training loop: ~200 µs of work and one reporter call per step."""
    times = []
    for n in range(steps):
        t0 = time.perf_counter()
        acc = 0
        for i in range(4000):
            acc += i * i
        reporter.step(n, tokens=1024, duration_ms=0.2, loss=1.0)
        times.append(time.perf_counter() - t0)
    return times


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def test_it_keeps_the_training_loop_fast_with_the_telemetry_backend_down(svc, tmp_path):
    from agents.reporter import Reporter

    down = Reporter(socket_path=str(tmp_path / "nobody.sock"), group="g-bench", rank=0)
    t0 = time.perf_counter()
    longest = 0.0
    for n in range(20_000):
        t = time.perf_counter()
        down.step(n, tokens=1024, duration_ms=0.2, loss=1.0)
        longest = max(longest, time.perf_counter() - t)
    per_call_us = (time.perf_counter() - t0) / 20_000 * 1e6
    assert down.dropped == 20_000  # counted, never raised

    state = tmp_path / "agent"
    agent = subprocess.Popen(
        [str(BIN / "faultline-agent"), "run", "--dry-run", "--node", "node-bench",
         "--state-dir", str(state), "--interval", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    svc.extra_procs.append(agent)
    up = Reporter(socket_path=str(h.wait_agent_socket(state)), group="g-bench", rank=0)
    # Interleave rounds so machine noise hits both conditions alike, and compare each
    # round with its neighbour: one noisy round moves one pair, not the verdict (pooled
    # medians failed once at 0.356 against 0.311 ms on a busy CI box).
    with_down, with_up, excess = [], [], []
    for _ in range(9):
        d, u = _loop(down, 400), _loop(up, 400)
        with_down += d
        with_up += u
        excess.append(_median(d) * 1e3 - (_median(u) * 1e3 * 1.05 + 0.02))
    h.stop_agent(agent)
    down_ms, up_ms = _median(with_down) * 1e3, _median(with_up) * 1e3
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "chaos-reporter.json").write_text(
        json.dumps({"per_call_us_backend_down": round(per_call_us, 2),
                    "step_ms_backend_down": round(down_ms, 4),
                    "step_ms_agent_listening": round(up_ms, 4),
                    "longest_call_ms_backend_down": round(longest * 1e3, 3)})
    )  # fmt: skip
    # Never blocks: a blocking send would wait on the missing agent for good. The mean cost
    # is reported, not bounded (an absolute 20 us failed at 22 us on a busy CI box); the
    # comparison below is the same run's baseline.
    # A blocking send would hang for good; the bound only has to tell that from a call
    # preempted on a loaded 2-core box (60 ms seen in CI beside a drill).
    assert longest < 0.5, longest
    # No slower with the agent gone: in the typical round, the down loop's median step is
    # within 5 % + 20 us of the listening one's (a blocking send would be many times it).
    assert _median(excess) <= 0, (down_ms, up_ms, excess)


# 9 ------------------------------------------------------------------------------------


def _login(svc: Service, username: str, password: str) -> int:
    import http.cookiejar
    import re
    import urllib.parse
    import urllib.request

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPCookieProcessor(jar)
    )
    page = opener.open(svc.url + "/login/", timeout=10).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token, "login form has no CSRF token"
    body = urllib.parse.urlencode(
        {"username": username, "password": password, "csrfmiddlewaretoken": token.group(1)}
    ).encode()
    request = urllib.request.Request(
        svc.url + "/login/", data=body, headers={"Referer": svc.url + "/login/"}
    )
    try:
        with opener.open(request, timeout=10) as r:
            # A good login redirects to "/"; a bad one re-renders the form (200).
            return 302 if r.url.rstrip("/") == svc.url.rstrip("/") else r.status
    except h.urllib.error.HTTPError as exc:
        return exc.code


def test_it_throttles_password_guessing_on_the_login_form(svc):
    svc.cli("user", "create", "guessme", "--role", "viewer", "--password", "pw-guessme-123")
    assert _login(svc, "guessme", "pw-guessme-123") == 302
    codes = [_login(svc, "guessme", f"wrong-{n}") for n in range(LOGIN_FAILURES + 2)]
    assert codes[:LOGIN_FAILURES] == [200] * LOGIN_FAILURES
    assert codes[-2:] == [429, 429]
    # Even the right password waits out the window: the guesser cannot tell it was right.
    assert _login(svc, "guessme", "pw-guessme-123") == 429
    assert _login(svc, "admin", "admin-pass-for-tests") == 302  # other users unaffected


def test_it_rejects_a_login_post_without_a_csrf_token(svc):
    import urllib.parse
    import urllib.request

    body = urllib.parse.urlencode({"username": "x", "password": "y"}).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(h.urllib.error.HTTPError) as err:
        opener.open(urllib.request.Request(svc.url + "/login/", data=body), timeout=10)
    assert err.value.code == 403


def test_it_sends_httponly_samesite_session_cookies_and_a_csp_without_inline_scripts(svc):
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(svc.url + "/login/", timeout=10) as r:
        csp = r.headers["Content-Security-Policy"]
        cookies = r.headers.get_all("Set-Cookie") or []
    script_src = next(p for p in csp.split(";") if p.strip().startswith("script-src"))
    assert "'unsafe-inline'" not in script_src and "'unsafe-eval'" not in script_src
    csrf = next(c for c in cookies if c.startswith("csrftoken="))
    assert "SameSite=Lax" in csrf
    session_cookie = svc.login()[1]
    assert "HttpOnly" in session_cookie and "SameSite=Lax" in session_cookie


def test_it_is_clean_under_the_bandit_rules_of_ruff():
    # --select S overrides the config's ignores; repeat the project's documented ones
    # (S101 pytest asserts, S603/S607 argv lists without a shell; see pyproject.toml).
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [str(BIN / "ruff"), "check", "--select", "S", "--output-format", "concise",
         "--ignore", "S101,S603,S607", "faultline", "console", "ingest", "agents"],
        cwd=root, capture_output=True, text=True, timeout=120, env={**os.environ},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:]
