"""An upgrade from the previous release, done as docs/operations.md ("Releases and upgrades")
tells an operator to, while agents keep pushing: nothing they sent is lost or stored twice.

The previous release is a `git worktree` of its tag (v0.1.0; the tag's commit where the
clone has no tags). Its service runs from that checkout on this virtual environment (the
two releases pin the same runtime dependencies) and its agent, stdlib only, with the
checkout on PYTHONPATH. The steps, in the documented order:

1. the previous release's service and agent; this release's agent beside it for a while
   (a node upgraded too early: that service refuses its batches, the reason for the order);
2. the service upgraded in place on the same data directory: stopped, and this release's
   `faultline up` migrates the live database (the previous release's schema) before it
   listens, while the previous release's agent keeps pushing;
3. the agents upgraded node by node: the previous release's agent replaced by this one on
   the same state directory (same identity, same spool, its seq continued).

The agents push through a front (`Front`): the load balancer an operator keeps in front of
the service, which answers 503 with Retry-After while no service is behind it and records
every batch each agent sent and the answer it got. docs/reliability.md has the figures.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import http.server
import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from faultline.testing.service import (
    Service,
    faultline_command,
    service_env,
    start_service,
    stop_service,
    wait_for,
)
from tests.system.chaos import harness as h

pytestmark = pytest.mark.slow

ARTIFACTS = Path("test-artifacts")
REPO = Path(__file__).resolve().parents[2]
PREVIOUS_TAG = "v0.1.0"
PREVIOUS_COMMIT = "ee86161"  # what the tag points at, for clones fetched without tags
# The last migrations the previous release shipped: its database is at this state.
PREVIOUS_MIGRATIONS = {"console": "0012_group_creator", "ingest": "0010_checkpoint_data_cursor"}
GPUS = 8
FULL_BATCH = 1000  # records: the agents' max_batch_records, the same in both releases


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A checkout of the previous release, removed afterwards."""
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout: the previous release cannot be checked out")
    for ref in (PREVIOUS_TAG, PREVIOUS_COMMIT):
        if _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode == 0:
            break
    else:
        pytest.skip(f"neither tag {PREVIOUS_TAG} nor commit {PREVIOUS_COMMIT} is in this clone "
                    "(a shallow clone? fetch with --tags or more depth)")  # fmt: skip
    where = tmp_path_factory.mktemp("release") / PREVIOUS_TAG
    made = _git("worktree", "add", "--detach", str(where), ref)
    assert made.returncode == 0, made.stderr
    try:
        yield where
    finally:
        _git("worktree", "remove", "--force", str(where))
        _git("worktree", "prune")


@dataclass(frozen=True)
class Sent:
    agent_id: str
    node: str
    seq: int
    records: int
    status: int
    by: str  # "service", or "front" while no service was behind it


class Front(http.server.ThreadingHTTPServer):
    """The load balancer in front of the service: forwards to whichever service is behind it
    (`backend`, a port), answers 503 with Retry-After: 1 while none is, as a balancer with no
    ready backend does, and records every ingest batch and its answer."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _FrontHandler)
        self.backend: int | None = None
        self.sent: list[Sent] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def of(self, node: str) -> list[Sent]:
        with self.lock:
            return [s for s in self.sent if s.node == node]


class _FrontHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # the agents keep their connection alive
    server: Front

    def log_message(self, *args: Any) -> None:
        pass  # the test reads what it needs from `Front.sent`

    def do_GET(self) -> None:
        self._forward(b"")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, by = self._forward(body)
        if self.path.startswith("/api/v1/ingest"):
            batch = json.loads(gzip.decompress(body))
            agent, seq, records = batch["agent"], batch["seq"], len(batch["records"])
            with self.server.lock:
                self.server.sent.append(Sent(agent["id"], agent["node"], seq, records, status, by))

    def _forward(self, body: bytes) -> tuple[int, str]:
        port = self.server.backend
        if port is not None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
            except (OSError, http.client.HTTPException):
                pass  # the service went away mid-request: as no service
            else:
                self._answer(resp.status, payload, resp.getheader("Content-Type"),
                             resp.getheader("Retry-After"))  # fmt: skip
                return resp.status, "service"
            finally:
                conn.close()
        self._answer(503, b'{"error": "no service"}', "application/json", "1")
        return 503, "front"

    def _answer(self, status: int, payload: bytes, ctype: str | None, retry: str | None) -> None:
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        if retry:
            self.send_header("Retry-After", retry)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def front() -> Iterator[Front]:
    server = Front()
    yield server
    server.shutdown()
    server.server_close()


def _migrations(svc: Service) -> dict[str, str]:
    rows = h.sql(svc, "SELECT app, max(name) FROM django_migrations "
                      "WHERE app IN ('ingest', 'console') GROUP BY app")  # fmt: skip
    return dict(rows)


def _devices(svc: Service, node: str) -> int:
    body = svc.api(f"/api/v1/devices/?node={node}")  # 404 (an error to wait_for) until it has
    return len(body["results"] if isinstance(body, dict) else body)


def _refused(front: Front, node: str) -> int:
    return sum(1 for s in front.of(node) if (s.status, s.by) == (400, "service"))


def _drained(front: Front, node: str, after_seq: int) -> bool:
    return any(s.seq > after_seq and s.status in (200, 202) and s.records < FULL_BATCH
               for s in front.of(node))  # fmt: skip


def _acked(front: Front, node: str) -> int:
    return sum(1 for s in front.of(node) if s.status in (200, 202))


def test_an_upgrade_from_the_previous_release_loses_and_duplicates_nothing(
    previous_release: Path, front: Front, tmp_path: Path
) -> None:
    data = tmp_path / "faultline"
    t_start = time.monotonic()
    # 1 -- the previous release, its agent and (a node upgraded early) this one.
    old = start_service(data, release=previous_release)
    svc: Service = old
    figures: dict[str, Any] = {"previous_release_ready_s": round(time.monotonic() - t_start, 1)}
    try:
        assert _migrations(old) == PREVIOUS_MIGRATIONS
        front.backend = old.port
        old_agent = old.start_agent("node-prev", "--interval", "0.25", release=previous_release,
                                    server=front.url)  # fmt: skip
        # This release's agent sends fields the previous service's contract check refuses
        # (400, dead-lettered by the agent: lost to the service). The reason agents are
        # upgraded after the service, never before.
        early = old.start_agent("node-early", "--interval", "0.25", server=front.url)
        wait_for(lambda: _refused(front, "node-early") >= 3, 30, "this agent's batches refused")
        assert h.stop_agent(early) == 0
        old.agents.remove(early)
        early_sent = front.of("node-early")
        # (A batch without a device sample, a lone heartbeat, would pass: not an error.)
        assert {s.status for s in early_sent} <= {400, 200, 202}, early_sent
        log = (data / "agents" / "node-early" / "agent.log").read_text()
        assert "is not part of contract v1" in log, log[-2000:]
        figures["this_agent_on_previous_service"] = sorted({s.status for s in early_sent})
        wait_for(lambda: _devices(old, "node-prev") == GPUS, 60, f"GPUs on {PREVIOUS_TAG}")
        wait_for(lambda: _acked(front, "node-prev") >= 3, 30, "a few batches stored")

        # 2 -- the service: stopped, upgraded, started; it migrates before it listens. The
        # agents keep pushing throughout and the front answers 503 meanwhile.
        agents, old.agents = old.agents, []
        t0 = time.monotonic()
        front.backend = None
        stop_service(old)
        shutil.copy(old.log, tmp_path / "up-previous.log")  # the next start rewrites up.log
        # As root, the previous release's stop could not reach its data directory once
        # another pytest session had made /tmp/pytest-of-root private again (since fixed:
        # faultline/embedded.py `_traversable_again`), and returned while its Postgres was
        # still shutting down, so the next start found it "stopping" and gave up. An
        # operator's restart waits for the old Postgres the same way.
        wait_for(lambda: _postgres_gone(data), 60, "the previous release's Postgres to stop")
        figures["previous_service_stopped_s"] = round(time.monotonic() - t0, 1)
        new = start_service(data)
        svc = new
        new.agents = agents
        front.backend = new.port
        figures["service_upgrade_s"] = round(time.monotonic() - t0, 1)
        # `faultline up`'s own "ready in": embedded servers, migrations, first admin.
        figures["bootstrap_with_migrations_s"] = float(re.findall(
            r"faultline: ready in ([0-9.]+)s", new.log.read_text())[-1])  # fmt: skip
        assert _migrations(new) != PREVIOUS_MIGRATIONS
        assert _migrations(new) == _migrations_of_this_checkout()
        outage = [s for s in front.of("node-prev") if s.by == "front"]
        t1 = time.monotonic()
        # Drained: a batch built after the restart held less than a full batch, so the
        # spool had no more than that left.
        last = max(s.seq for s in front.of("node-prev"))
        wait_for(lambda: _drained(front, "node-prev", last), 60, "the old agent's backlog")
        figures["drain_after_ready_s"] = round(time.monotonic() - t1, 1)

        # 3 -- the agents, node by node: the previous release's replaced by this one on the
        # same state directory (its identity, its spool, its seq).
        assert h.stop_agent(old_agent) == 0
        new.agents.remove(old_agent)
        before = _acked(front, "node-prev")
        upgraded = new.start_agent("node-prev", "--interval", "0.25", server=front.url)
        wait_for(lambda: _acked(front, "node-prev") >= before + 3, 30, "the new agent's batches")
        assert h.stop_agent(upgraded) == 0  # SIGTERM: flushes what it spooled
        new.agents.clear()
        # One identity across the agent's upgrade: the service sees one agent whose seq
        # goes on, not a new agent beside a silent one.
        assert len({s.agent_id for s in front.of("node-prev")}) == 1

        for node in ("node-prev",):
            state = data / "agents" / node
            assert not list((state / "spool" / "inflight").glob("*.json")), node  # drained
            _assert_every_batch_stored_once(new, front, node)
            assert _devices(new, node) == GPUS
            errors = [line for line in (state / "agent.log").read_text().splitlines()
                      if "ingest answered HTTP" in line and "HTTP 503" not in line]  # fmt: skip
            assert errors == [], errors
            row = next(a for a in new.api("/api/v1/agents/")["results"] if a["node"] == node)
            assert row["gaps"] == 0, row
        prev = front.of("node-prev")
        answers = sorted({(s.status, s.by) for s in prev})
        assert set(answers) <= {(200, "service"), (202, "service"), (503, "service"),
                                (503, "front")}, answers  # fmt: skip
        figures.update(
            batches=len({(s.agent_id, s.seq) for s in prev}),
            records=_stored(new, front, "node-prev")[1],
            answers={
                f"{st} {by}": sum(1 for s in prev if (s.status, s.by) == (st, by))
                for st, by in answers
            },
            answered_by_front_during_restart=len(outage),
            lost=0,
            duplicates=0,
        )
        assert stop_service(new) == 0
        t2 = time.monotonic()
        _migrate_back_and_forth(data)
        figures["migrations_back_and_forth_s"] = round(time.monotonic() - t2, 1)
        figures["module_s"] = round(time.monotonic() - t_start, 1)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "upgrade.json").write_text(json.dumps(figures, indent=1))
    finally:
        if svc.proc.poll() is None:
            with contextlib.suppress(Exception):
                stop_service(svc)
        ARTIFACTS.mkdir(exist_ok=True)
        for name, path in (("previous", tmp_path / "up-previous.log"), ("up", data / "up.log")):
            with contextlib.suppress(OSError):
                (ARTIFACTS / f"upgrade-{name}.log").write_bytes(path.read_bytes())


def _migrate_back_and_forth(data: Path) -> None:
    """This release's migrations undone down to the previous release's state, then applied
    again, on the upgraded database with its rows (the service stopped: nothing reads the
    schema half-way). A release must be able to go back."""
    undo = "; ".join(
        f"c('migrate', '{app}', '{name}')" for app, name in PREVIOUS_MIGRATIONS.items()
    )
    show = "c('showmigrations', 'console', 'ingest')"
    script = (f"from django.core.management import call_command as c; {undo}; {show}; "
              f"print('-- forward'); c('migrate'); {show}")  # fmt: skip
    out = subprocess.run(
        [*faultline_command(), "manage", "shell", "-c", script],
        env=service_env(data), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    back, forward = out.stdout.split("-- forward")
    newer = sum(1 for app in PREVIOUS_MIGRATIONS for _ in _newer_migrations(app))
    assert back.count("[ ]") == newer > 0, back
    assert forward.count("[ ]") == 0, forward


def _newer_migrations(app: str) -> list[str]:
    return sorted(p.stem for p in (REPO / app / "migrations").glob("0*.py")
                  if p.stem > PREVIOUS_MIGRATIONS[app])  # fmt: skip


def _postgres_gone(data: Path) -> bool:
    try:
        pid = int((data / "pg" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return True
    return not psutil.pid_exists(pid)


def _migrations_of_this_checkout() -> dict[str, str]:
    return {app: max(p.stem for p in (REPO / app / "migrations").glob("0*.py"))
            for app in ("ingest", "console")}  # fmt: skip


def _stored(svc: Service, front: Front, node: str) -> tuple[dict[tuple[str, int], int], int]:
    """What the service's receipts hold for the agents of `node`: {(agent, seq): records}."""
    ids = sorted({s.agent_id for s in front.of(node)})
    rows = h.sql(svc, "SELECT agent_id, seq, records FROM ingest_batchreceipt "
                      "WHERE agent_id = ANY(%s)", (ids,))  # fmt: skip
    stored = {(a, seq): n for a, seq, n in rows}
    return stored, sum(stored.values())


def _assert_every_batch_stored_once(svc: Service, front: Front, node: str) -> None:
    sent = {(s.agent_id, s.seq): s.records for s in front.of(node)}
    stored, _ = _stored(svc, front, node)
    assert stored == sent  # every batch once, with the records the agent put in it
    for agent_id in {a for a, _ in sent}:
        seqs = sorted(seq for a, seq in sent if a == agent_id)
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs  # no seq skipped
    dupes = h.sql(svc, "SELECT count(*) - count(DISTINCT (s.gpu, s.ts)) "
                       "FROM ingest_devicesample s JOIN console_node n ON n.id = s.node_id "
                       "WHERE n.name = %s", (node,))  # fmt: skip
    assert dupes[0][0] == 0
