"""Two beats, one leader: kill or freeze the leader, the sweeps keep running.

A real `faultline up` runs beat A; a second beat B (as a second service instance would
run it) joins against the same Valkey and stands by. Freezing A (SIGSTOP: the supervisor
cannot restart it, only B can take over) must hand the lock to B within its TTL, B's sweep
must mark a node that went quiet meanwhile as down, A must stand by once it wakes, and
killing B (SIGKILL: no clean hand-over) must hand the lock back to A. The takeover times
go to test-artifacts/beat-failover.json (docs/operations.md cites them).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import redis

from faultline.beat import KEY, POLL_S
from faultline.testing.service import Service, service_env, start_service, stop_service, wait_for
from tests.conftest import make_batch
from tests.system.chaos import harness as h

pytestmark = pytest.mark.slow

ARTIFACTS = Path("test-artifacts")
TTL_S = 6  # FAULTLINE_BEAT_LOCK_TTL_S's default
SWEEP_S = 1.0  # the sweep's period in faultline/celery.py
_SENT = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/MainProcess\] "
                   r"Scheduler: Sending due task sweep ")  # fmt: skip


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = start_service(tmp_path_factory.mktemp("beat"))
    yield service
    stop_service(service)


def _holder(client: redis.Redis) -> str:
    value = client.get(KEY)
    return value.decode() if value else ""


def _sends(log: Path) -> list[float]:
    """Wall times (epoch s) of the sweeps beat B sent, from its own INFO log."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [
        datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()  # noqa: DTZ007 - local, like the log
        for m in _SENT.finditer(text)
    ]


def test_a_second_beat_takes_over_the_sweeps_when_the_leader_dies(svc, tmp_path):
    runtime = h.runtime(svc)
    client = redis.Redis.from_url(runtime["REDIS_URL"])
    beat_a = h.role_pids(svc)["beat"][0]
    wait_for(lambda: f":{beat_a}:" in _holder(client), 30, "beat A to lead")

    log_b = tmp_path / "beat-b.log"
    env = {**service_env(svc.data_dir), "DATABASE_URL": runtime["DATABASE_URL"],
           "REDIS_URL": runtime["REDIS_URL"]}  # fmt: skip
    beat_b = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "faultline", "beat", "--loglevel", "INFO",
         "--schedule", str(tmp_path / "schedule-b")],
        env=env, stdout=open(log_b, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
    )  # fmt: skip
    try:
        wait_for(lambda: "beat: Starting" in log_b.read_text(), 60, "beat B to start")
        time.sleep(3 * SWEEP_S)
        assert _sends(log_b) == [], "a standby must send nothing"
        assert f":{beat_a}:" in _holder(client)

        # A node reports, then goes quiet: only a sweep can notice.
        token = svc.token("quiet-node")
        batch = make_batch([{"kind": "heartbeat", "uptime_s": 1, "spool_depth": 0, "dropped": 0}],
                           node="quiet-node", agent_id="agent-quiet-0001")  # fmt: skip
        assert h.post_batch(svc, token, batch).status == 202

        os.kill(beat_a, signal.SIGSTOP)  # frozen leader: alive, so nobody restarts it
        frozen_at = time.time()
        wait_for(lambda: f":{beat_b.pid}:" in _holder(client), 3 * TTL_S, "beat B to lead")
        lock_s = time.time() - frozen_at
        wait_for(lambda: [t for t in _sends(log_b) if t >= frozen_at], 30, "B's first sweep")
        first_sweep_s = min(t for t in _sends(log_b) if t >= frozen_at) - frozen_at

        def down() -> bool:
            rows = h.sql(svc, "SELECT health FROM console_node WHERE name = %s", ("quiet-node",))
            return bool(rows) and rows[0][0] == "down"

        wait_for(down, 40, "B's sweep to mark the quiet node down")
        down_s = time.time() - frozen_at

        os.kill(beat_a, signal.SIGCONT)  # A wakes: it must find the lock gone and stand by
        wait_for(lambda: "lost the lead" in svc.log.read_text(errors="replace"), 20,
                 "beat A to stand by")  # fmt: skip
        assert f":{beat_b.pid}:" in _holder(client)

        beat_b.kill()  # the new leader dies hard: no hand-over, the TTL runs out
        killed_at = time.time()
        wait_for(lambda: f":{beat_a}:" in _holder(client), 3 * TTL_S, "beat A to lead again")
        back_s = time.time() - killed_at

        os.kill(beat_a, signal.SIGKILL)  # the supervisor restarts it: it reclaims at once
        killed_at = time.time()

        def restarted_leads() -> bool:
            pids = [p for p in h.role_pids(svc)["beat"] if p != beat_a]
            return bool(pids) and f":{pids[0]}:" in _holder(client)

        wait_for(restarted_leads, 3 * TTL_S + 30, "the restarted beat A to lead")
        restart_s = time.time() - killed_at
    finally:
        with contextlib.suppress(ProcessLookupError):  # a failure may have left A stopped
            os.kill(beat_a, signal.SIGCONT)
        if beat_b.poll() is None:
            beat_b.kill()
        beat_b.wait()

    bound = TTL_S + POLL_S + SWEEP_S + 1.5  # + scheduling slack on a loaded machine
    figures = {"lock_ttl_s": TTL_S, "takeover_lock_s": round(lock_s, 2),
               "takeover_first_sweep_s": round(first_sweep_s, 2),
               "quiet_node_down_after_freeze_s": round(down_s, 2),
               "takeback_after_kill_s": round(back_s, 2),
               "restarted_beat_leads_after_s": round(restart_s, 2), "bound_s": bound}  # fmt: skip
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "beat-failover.json").write_text(json.dumps(figures))
    assert first_sweep_s <= bound, figures
    assert back_s <= bound, figures
