"""Detection at fleet scale: one training group of 1k-16k ranks on a real `faultline up`.

`bench/detect.py --ranks N` (N >= 1024, or `--scale`) comes here. A 16,384-rank job at a
1 s step is 2,048 nodes posting 2,048 batches a second; this 2-vCPU box serves ~100-150
(docs/performance.md, Ingest), so a fleet of real agents that size cannot be simulated
here. What the bench does instead, and says so in its output:

- Every node is a real identity: it gets a token and posts its job start over real HTTP
  (the transition from the leader, each rank's `process started`, its 8 GPUs' samples), so
  ingest creates the nodes, GPUs and ranks as it does for a fleet.
- The first `--http-nodes` nodes (default 16: 128 ranks) keep posting over HTTP every step
  (heartbeat, their ranks' steps, their GPUs' samples): ingest schedules diagnosis from
  their batches as it does from any batch. Every trial's fault is on one of these nodes and
  reaches the service over HTTP (the Xid, the throttled GPU's samples) or by a rank of
  theirs going quiet.
- The other nodes' per-step rows (their ranks' steps, their liveness, their GPUs' fresh
  samples) are written by the bench straight into Postgres in one transaction per step
  (COPY for the steps: what ingest stores for them), standing in for the web tier a fleet
  that size runs on cores of its own. `--no-device-refresh` leaves their samples as
  they were at start (the GPU-sample cache then never misses: the optimistic case).

The Celery worker, urgent lane, beat, websockets and Postgres are the service's own, as
`faultline up` runs them; the browser's websocket is a real logged-in client.

Trials run one after another on the one group (a 16k-rank group is all this box can hold).
Each ends with the job restarting into a new generation (a transition over HTTP, every
rank's `process started` of the new generation), as after remediation, and the next trial
starts after a warm-up. Kinds:

- explicit: an Xid 79 on a GPU (over HTTP); its rank stops at once, every other rank one
  step later (blocked in the next collective). Timed to the `xid` incident on the socket.
- silent: one rank stops reporting; the others stop one step later. Timed to the first
  `rank_hang` / `group_stall` incident. Goal: <= max(3 x median step, 5 s) + 1 s.
- straggler: one GPU thermal-throttles (its samples say `hw_thermal_slowdown`) and its
  rank's busy time doubles; in a synchronous job everyone's step lengthens, the others
  waiting in collectives. Counted in steps to the `thermal_throttle` (or `straggler`)
  incident. Goal: <= 10 steps.

It also reads the worker's diagnosis passes from /metrics (`faultline_diagnosis_duration_
seconds`: count and sum) and the worker processes' CPU from /proc over the steady phase.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.detect import SAMPLE, Watcher, in_service, iso, pct, post_batch  # noqa: E402
from faultline.testing.service import Service, start_service, stop_service  # noqa: E402
from ingest.copytext import json as cjson  # noqa: E402
from ingest.copytext import num, when  # noqa: E402

PER_NODE = 8
METRICS_TOKEN = "bench-scale-metrics-token-0123456789"  # noqa: S105 - a throwaway service
# COPY columns, in ingest.store.tables.COLUMNS order (that module needs Django set up).
STEP_COPY = (
    "COPY ingest_steprecord (ts, node_id, group_id, generation, stale, rank, step, tokens,"
    " data_cursor, duration_ms, phases, loss, grad_norm, loss_scale, overflow) FROM STDIN"
)
PROCESS_COPY = (
    "COPY ingest_processrecord (ts, node_id, group_id, generation, stale, rank, event, pid,"
    " gpu, exit_code, signal, reason, error_type) FROM STDIN"
)


@dataclass
class ScaleFleet:
    service: Service
    ranks: int
    step_s: float
    http_nodes: int
    device_refresh: bool = True
    group: str = ""
    nodes: list[str] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)
    seq: dict[str, int] = field(default_factory=dict)
    generation: int = 1
    step: int = 0
    stopped: set[int] = field(default_factory=set)  # ranks that no longer step
    dead: set[int] = field(default_factory=set)  # ranks on a failed GPU: left out of restarts
    stop_all_at: int | None = None  # the step from which nobody steps (the job hung)
    slow: dict[int, float] = field(default_factory=dict)  # rank -> busy time factor
    throttled: set[str] = field(default_factory=set)  # GPUs whose samples show a slowdown
    ticks: list[float] = field(default_factory=list)  # relay seconds per tick
    late: int = 0  # ticks that took longer than a step

    def __post_init__(self) -> None:
        self.group = f"scale-{self.ranks}"
        count = (self.ranks + PER_NODE - 1) // PER_NODE
        self.nodes = [f"s{self.ranks}-n{i:05d}" for i in range(count)]
        self.http_nodes = min(self.http_nodes, count)
        self.seq = dict.fromkeys(self.nodes, 0)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.stepping = threading.Lock()  # a tick and a restart never interleave
        self.error: BaseException | None = None
        self.pool = ThreadPoolExecutor(8)
        self.db: Any = None
        self.node_id: dict[str, int] = {}
        self.group_id = 0

    # -- identities and HTTP -------------------------------------------------------------
    def issue_tokens(self) -> None:
        self.tokens = json.loads(
            in_service(
                self.service,
                "from ingest.auth import issue_token\n"
                "print(json.dumps({n: issue_token(node_name=n) for n in sys.argv[2:]}))",
                *self.nodes,
            )
        )

    def gpu(self, rank: int) -> tuple[str, str]:
        node = self.nodes[rank // PER_NODE]
        return node, f"GPU-{node}-{rank % PER_NODE}"

    def post(self, node: str, records: list[dict[str, Any]]) -> None:
        with self.lock:
            self.seq[node] += 1
            seq = self.seq[node]
        post_batch(self.service, self.tokens[node], node, seq, records, timeout=30, retries=4)

    def _samples(self, node_index: int, ts: str) -> list[dict[str, Any]]:
        node = self.nodes[node_index]
        out = []
        for local in range(PER_NODE):
            gpu = f"GPU-{node}-{local}"
            hot = gpu in self.throttled
            out.append(
                {
                    "kind": "device_sample",
                    "gpu": gpu,
                    "index": local,
                    "ts": ts,
                    **SAMPLE,
                    "temp_c": 92.0 if hot else SAMPLE["temp_c"],
                    "sm_clock_mhz": 990.0 if hot else SAMPLE["sm_clock_mhz"],
                    "throttle_reasons": ["hw_thermal_slowdown"] if hot else [],
                }
            )
        return out

    def start(self) -> None:
        """Every node's job start over HTTP; then the ids the relay writes with."""
        now = iso(datetime.now(UTC))
        posts = []
        for i, node in enumerate(self.nodes):
            records: list[dict[str, Any]] = []
            for local in range(PER_NODE):
                rank = i * PER_NODE + local
                if rank < self.ranks:
                    records.append(
                        {
                            "kind": "process",
                            "group": self.group,
                            "generation": 1,
                            "rank": rank,
                            "event": "started",
                            "pid": 1000 + local,
                            "gpu": f"GPU-{node}-{local}",
                            "ts": now,
                        }
                    )
            if i == 0:
                # After its ranks, as a launcher announces the job (faultline.demo): the
                # group may have been created by a peer's batch, and a transition from a
                # node that has placed none of its ranks is refused as unauthorized.
                records.append(
                    {
                        "kind": "transition",
                        "group": self.group,
                        "generation": 1,
                        "to_state": "running",
                        "world_size": self.ranks,
                        "ts": now,
                    }
                )
            records += self._samples(i, now)
            posts.append(self.pool.submit(self.post, node, records))
        for p in posts:
            p.result()
        import psycopg

        url = json.loads((self.service.data_dir / "runtime.json").read_text())["DATABASE_URL"]
        self.db = psycopg.connect(url, autocommit=True)
        rows = self.db.execute(
            "SELECT name, id FROM console_node WHERE name = ANY(%s)", [self.nodes]
        ).fetchall()
        self.node_id = dict(rows)
        self.group_id = self.db.execute(
            "SELECT id FROM console_consistencygroup WHERE name = %s", [self.group]
        ).fetchone()[0]

    def establish(self) -> None:
        """Clear the group's young mark, as if it were older than the young-group window."""
        in_service(
            self.service,
            "from django.core.cache import cache\ncache.delete(f'diag-young:{sys.argv[2]}')\n"
            "print('ok')",
            self.group,
        )

    # -- one step of the job ---------------------------------------------------------------
    def _phases(self, rank: int) -> tuple[float, dict[str, float]]:
        """(duration ms, phases) of `rank`'s step: a slow rank's busy time is longer and,
        the job being synchronous, everyone's step is as long as the slowest one's."""
        base = self.step_s * 1000.0
        busy = base * 0.7
        slowest = max(self.slow.values(), default=1.0)
        duration = base + busy * (slowest - 1.0)
        mine = busy * self.slow.get(rank, 1.0)
        compute = mine * 0.9
        phases = {
            "compute": compute,
            "input": mine - compute,
            "collective": duration - mine,
            "checkpoint": 0.0,
            "optimizer": 0.0,
        }
        return duration, phases

    def _stepping(self, rank: int) -> bool:
        return (
            rank not in self.stopped
            and rank not in self.dead
            and (self.stop_all_at is None or self.step < self.stop_all_at)
        )

    def tick(self) -> None:
        now_dt = datetime.now(UTC)
        now, step, gen = iso(now_dt), self.step, self.generation
        posts = []
        for i in range(self.http_nodes):
            node = self.nodes[i]
            records: list[dict[str, Any]] = [{"kind": "heartbeat", "ts": now}]
            for local in range(PER_NODE):
                rank = i * PER_NODE + local
                if rank >= self.ranks or not self._stepping(rank):
                    continue
                duration, phases = self._phases(rank)
                records.append(
                    {
                        "kind": "step",
                        "group": self.group,
                        "generation": gen,
                        "rank": rank,
                        "step": step,
                        "tokens": 4096,
                        "duration_ms": duration,
                        "phases": phases,
                        "loss": 2.0,
                        "ts": now,
                    }
                )
            records += self._samples(i, now)
            posts.append(self.pool.submit(self.post, node, records))
        t0 = time.monotonic()
        self._relay(now_dt, step, gen)
        self.ticks.append(time.monotonic() - t0)
        for p in posts:
            p.result()
        self.step += 1

    def _relay(self, now: datetime, step: int, gen: int) -> None:
        """The other nodes' rows of this step, as ingest would have stored them."""
        ts = when(now)
        first = self.http_nodes * PER_NODE
        lines = []
        for rank in range(first, self.ranks):
            if not self._stepping(rank):
                continue
            duration, phases = self._phases(rank)
            node_id = self.node_id[self.nodes[rank // PER_NODE]]
            lines.append(
                f"{ts}\t{node_id}\t{self.group_id}\t{gen}\tf\t{rank}\t{step}\t4096\t\\N\t"
                f"{num(duration)}\t{cjson(phases)}\t2.0\t\\N\t\\N\t\\N\n"
            )
        relay_ids = [self.node_id[n] for n in self.nodes[self.http_nodes :]]
        with self.db.transaction():
            if lines:
                with self.db.cursor().copy(STEP_COPY) as copy:
                    copy.write("".join(lines))
            if relay_ids:
                self.db.execute(
                    "UPDATE console_node SET last_seen = %s WHERE id = ANY(%s)", [now, relay_ids]
                )
                if self.device_refresh:
                    # A fresh sample per GPU per step: its row (and so the diagnosis
                    # worker's per-GPU cache key) changes every step, as in a live fleet.
                    self.db.execute(
                        "UPDATE console_device SET last_seen = %s, last_sample = last_sample"
                        " || jsonb_build_object('ts', %s::text, 'temp_c', 60 + (%s::int %% 5))"
                        " WHERE node_id = ANY(%s)",
                        [now, iso(now), step, relay_ids],
                    )

    def restart(self) -> None:
        """The job restarts into a new generation (after remediation), without the ranks
        whose GPU failed: their node's Xid stays in its history, but no rank of the new
        generation runs on that GPU."""
        with self.stepping:
            self._restart()

    def _restart(self) -> None:
        self.generation += 1
        self.stopped.clear()
        self.slow.clear()
        self.throttled.clear()
        self.stop_all_at = None
        now = datetime.now(UTC)
        self.post(
            self.nodes[0],
            [
                {
                    "kind": "transition",
                    "group": self.group,
                    "generation": self.generation,
                    "to_state": "running",
                    "world_size": self.ranks,
                    "ts": iso(now),
                }
            ],
        )
        ts = when(now)
        lines = []
        for rank in range(self.ranks):
            if rank in self.dead:
                continue
            node, gpu = self.gpu(rank)
            lines.append(
                f"{ts}\t{self.node_id[node]}\t{self.group_id}\t{self.generation}\tf\t{rank}\t"
                f"started\t{1000 + rank % PER_NODE}\t{gpu}\t\\N\t\\N\t\\N\t\\N\n"
            )
        with self.db.transaction(), self.db.cursor().copy(PROCESS_COPY) as copy:
            copy.write("".join(lines))

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.error = exc
            raise

    def _run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            with self.stepping:
                self.tick()
            spent = time.monotonic() - started
            if spent > self.step_s:
                self.late += 1
            self.stop.wait(max(0.0, self.step_s - spent))


class Pager:
    """The page's far end: a webhook receiver, and a watch (every 50 ms, its own
    connection) on when each of the group's incidents had its first page scheduled (the
    escalation sweep's `sent` list). An explicit trial is then also timed Xid -> page
    received, and scheduled -> received: the wait on the queue of the worker that sends."""

    def __init__(self, service: Service, group: str) -> None:
        import http.server

        import psycopg

        pager = self
        self.group, self.lock, self.stop = group, threading.Lock(), threading.Event()
        self.posts: list[tuple[float, dict[str, Any]]] = []
        self.scheduled: dict[int, float] = {}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with pager.lock:
                    pager.posts.append((time.monotonic(), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        url = json.loads((service.data_dir / "runtime.json").read_text())["DATABASE_URL"]
        self.db = psycopg.connect(url, autocommit=True)
        in_service(service, PAGE_SETUP, self.url, group)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self.stop.wait(0.05):
            rows = self.db.execute(
                "SELECT e.incident_id FROM console_incidentescalation e"
                " JOIN console_incident i ON i.id = e.incident_id"
                " JOIN console_consistencygroup g ON g.id = i.group_id"
                " WHERE g.name = %s AND e.sent <> '[]'::jsonb",
                [self.group],
            ).fetchall()
            now = time.monotonic()
            with self.lock:
                for (pk,) in rows:
                    self.scheduled.setdefault(pk, now)

    def wait_page(self, gpu: str, t0: float, timeout: float) -> tuple[float, float] | None:
        """(Xid -> page received, scheduled -> received) of the first trigger page after
        t0 whose subject names `gpu`; None if none came within `timeout`."""
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for at, body in self.posts:
                    if (
                        at >= t0
                        and body.get("event") == "trigger"
                        and gpu in str(body.get("subject"))
                    ):
                        scheduled = self.scheduled.get(int(body["incident"]), at)
                        return at - t0, at - min(scheduled, at)
            time.sleep(0.05)
        return None

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()


# A webhook channel to the bench's receiver and a policy that pages it at once for the
# group (argv: url, group), as an operator would set them up.
PAGE_SETUP = """\
from django.contrib.auth import get_user_model
from django.utils import timezone
from console import actions
admin = get_user_model().objects.filter(is_superuser=True).order_by("id").first()
admin = admin or get_user_model().objects.get(username="admin")
actions.save_channel(actor=admin, now=timezone.now(), name="bench-hook", kind="webhook",
                     url=sys.argv[2], secret="bench-hmac-key")
actions.save_escalation_policy(actor=admin, now=timezone.now(), name="bench-pages",
                               position=1, labels={"group": sys.argv[3]},
                               steps=[{"delay_s": 0, "channels": ["bench-hook"]}])
print("ok")"""


def _scrape(service: Service) -> str:
    """The service's /metrics text, every process's samples."""
    request = urllib.request.Request(
        service.url + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(response.read().decode())


def _metrics(service: Service) -> tuple[float, float]:
    """(count, sum) of faultline_diagnosis_duration_seconds over every process."""
    text = _scrape(service)
    count = total = 0.0
    for line in text.splitlines():
        if line.startswith("faultline_diagnosis_duration_seconds_count"):
            count += float(line.split()[-1])
        elif line.startswith("faultline_diagnosis_duration_seconds_sum"):
            total += float(line.split()[-1])
    return count, total


def _threshold(summary: str) -> str:
    """'threshold N s' out of a rank_hang/group_stall summary, or the summary's end."""
    found = re.search(r"threshold [0-9.]+ ?s", summary)
    return found.group(0) if found else summary[-60:]


def _checks(service: Service) -> dict[str, float]:
    """faultline_diagnosis_checks_total by outcome (ran, moved), over every process."""
    out: dict[str, float] = {}
    for line in _scrape(service).splitlines():
        if line.startswith("faultline_diagnosis_checks_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = out.get(outcome, 0.0) + float(line.split()[-1])
    return out


def _task_runs(service: Service) -> dict[tuple[str, str], float]:
    """(task, what) -> total over every process, from the scrape: `ran` (every final
    state), `expired` (dropped unrun past its expiry), `seconds` (run time)."""
    text = _scrape(service)
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("faultline_celery_tasks_total{"):
            what = "expired" if 'state="EXPIRED"' in line else "ran"
        elif line.startswith("faultline_celery_task_duration_seconds_sum{"):
            what = "seconds"
        else:
            continue
        task = line.split('task="', 1)[1].split('"', 1)[0]
        out[task, what] = out.get((task, what), 0.0) + float(line.split()[-1])
    return out


def _beat_report(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float], seconds: float
) -> str:
    """Each beat task's runs against the runs its period asks for, those dropped past
    their expiry, and its mean run time: on a saturated worker a sweep that waits past its
    expiry is dropped (on the default queue the node sweep ran 16 times of ~480 in a 16k
    run). Fewer runs than asked and none expired: beat itself sent late."""
    from faultline.celery import BEAT_SCHEDULE

    def delta(task: str, what: str) -> float:
        return after.get((task, what), 0.0) - before.get((task, what), 0.0)

    parts = []
    for entry in BEAT_SCHEDULE.values():
        task, period = entry["task"], float(entry["schedule"])
        if period > seconds:
            continue
        ran, expired = delta(task, "ran"), delta(task, "expired")
        mean_ms = 1000 * delta(task, "seconds") / max(ran, 1.0)
        parts.append(
            f"{task} {ran:.0f} of ~{seconds / period:.0f} ({expired:.0f} expired, {mean_ms:.0f} ms)"
        )
    return ", ".join(parts)


def _worker_cpu() -> float:
    """CPU seconds of the Celery worker processes (ordinary and urgent lane, pools too)."""
    return sum(cpu for cpu, _ in _workers().values())


def _workers() -> dict[int, tuple[float, int]]:
    """pid -> (CPU seconds, RSS MiB) of each Celery worker process (pool children too)."""
    tick = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    out: dict[int, tuple[float, int]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"celery" not in cmd or b" worker" not in cmd:
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(pid)] = (
            (int(fields[11]) + int(fields[12])) / tick,
            int(fields[21]) * page // 2**20,
        )
    return out


def run_scale(args: Any) -> int:
    ranks, step_s = args.ranks, args.step_s
    trials = args.trials
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.1f}", flush=True)
    data = Path(tempfile.mkdtemp(prefix="faultline-detect-scale-"))
    # The bench's webhook receiver listens on 127.0.0.1 (channels reach only public
    # addresses unless this is set).
    env = {"FAULTLINE_METRICS_TOKEN": METRICS_TOKEN, "FAULTLINE_NOTIFY_ALLOW_PRIVATE": "1"}
    if args.worker_memory_mb:
        env["FAULTLINE_WORKER_MAX_MEMORY_MB"] = str(args.worker_memory_mb)
    if args.no_checks:  # the baseline: silence judged at the sweep's ticks only
        env["FAULTLINE_DIAGNOSIS_CHECKS"] = "0"
    service = start_service(data, env=env)
    fleet = ScaleFleet(service, ranks, step_s, args.http_nodes, not args.no_device_refresh)
    results: dict[str, list[float]] = {
        "explicit": [],
        "silent": [],
        "straggler_steps": [],
        "page": [],
        "page_wait": [],
    }
    pager: Pager | None = None
    passes: dict[str, float] = {}
    hung_in: dict[int, str] = {}  # generation -> its silent trial's right rank_hang
    try:
        t0 = time.monotonic()
        fleet.issue_tokens()
        fleet.start()
        fleet.establish()
        pager = Pager(service, fleet.group)
        print(
            f"[scale] {ranks} ranks on {len(fleet.nodes)} nodes x {PER_NODE} GPUs, step "
            f"{step_s:g} s: {fleet.http_nodes} nodes post over HTTP every step, the other "
            f"{len(fleet.nodes) - fleet.http_nodes} nodes' steps"
            f"{', liveness and GPU samples' if fleet.device_refresh else ' and liveness'} are "
            f"written straight into Postgres by the bench (set-up {time.monotonic() - t0:.0f} s)",
            flush=True,
        )
        watcher = Watcher(service, service.login()[0])
        pump = threading.Thread(target=fleet.run, daemon=True)
        pump.start()
        beat0, beat_t0 = _task_runs(service), time.monotonic()
        warm = max(12.0, 12 * step_s)
        time.sleep(warm)
        # The first pass of a big group is a full read (seconds at 16k ranks): measure the
        # steady state once the worker has finished a few passes.
        deadline, base = time.monotonic() + 180, _metrics(service)[0]
        while _metrics(service)[0] < base + 3 and time.monotonic() < deadline:
            time.sleep(1.0)
        # The steady phase: passes and the worker's CPU while every rank steps.
        c0, s0, cpu0, w0 = *_metrics(service), _worker_cpu(), time.monotonic()
        time.sleep(max(10.0, 10 * step_s))
        c1, s1, cpu1, w1 = *_metrics(service), _worker_cpu(), time.monotonic()
        n = max(c1 - c0, 1.0)
        passes = {
            "passes": c1 - c0,
            "mean_s": (s1 - s0) / n,
            "per_s": (c1 - c0) / (w1 - w0),
            "worker_cpu_per_s": (cpu1 - cpu0) / (w1 - w0),
        }
        print(
            f"[scale] steady: {passes['passes']:.0f} diagnosis passes in {w1 - w0:.0f} s, mean "
            f"{passes['mean_s'] * 1000:.0f} ms a pass; workers' CPU "
            f"{passes['worker_cpu_per_s']:.2f} s per s; worker processes' RSS "
            f"{sorted(rss for _, rss in _workers().values())} MiB; relay tick p50 "
            f"{statistics.median(fleet.ticks) * 1000:.0f} ms; load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        chosen = set(args.scale_trials.split(","))
        if chosen - {"explicit", "silent", "straggler"} or not chosen:
            raise SystemExit(f"--scale-trials: explicit, silent, straggler; not {chosen}")
        kinds = [k for k in ("explicit", "silent", "straggler") if k in chosen]
        plan = [kind for kind in kinds for _ in range(trials)]
        for i, kind in enumerate(plan):
            if fleet.error is not None:
                raise RuntimeError("the fleet's pump stopped") from fleet.error
            rank = (37 * i + 5) % (fleet.http_nodes * PER_NODE)
            node, gpu = fleet.gpu(rank)
            gen = fleet.generation
            if kind == "explicit":
                t0 = time.monotonic()
                fleet.post(
                    node,
                    [
                        {
                            "kind": "device_event",
                            "gpu": gpu,
                            "event": "xid",
                            "code": 79,
                            "ts": iso(datetime.now(UTC)),
                        }
                    ],
                )
                fleet.dead.add(rank)
                fleet.stop_all_at = fleet.step + 1
                want = {"xid"}
                hit = watcher.wait_for(fleet.group, gen, want, t0, timeout=120)
                results["explicit"].append(hit[0] if hit else float("inf"))
                # The escalation sweep (every 10 s) schedules the page; a worker sends it.
                page = pager.wait_page(gpu, t0, timeout=40) if hit else None
                results["page"].append(page[0] if page else float("inf"))
                results["page_wait"].append(page[1] if page else float("inf"))
            elif kind == "silent":
                t0 = time.monotonic()
                fleet.stopped.add(rank)
                fleet.stop_all_at = fleet.step + 1
                want = {"rank_hang", "group_stall"}
                hung = {"rank_hang": f"rank:{fleet.group}/{rank}"}  # not another rank
                hit = watcher.wait_for(fleet.group, gen, want, t0, 120, subjects=hung)
                results["silent"].append(hit[0] if hit else float("inf"))
            else:
                # Every other straggler trial has the GPU say why (thermal throttle, named
                # from its samples); the others are a rank slow with no device signal,
                # which only the straggler rule can name (undetermined: the honest answer).
                hot = (i % 2) == 0
                t0 = time.monotonic()
                first = fleet.step
                if hot:
                    fleet.throttled.add(gpu)
                fleet.slow[rank] = 2.0
                want = {"thermal_throttle"} if hot else {"straggler"}
                hit = watcher.wait_for(fleet.group, gen, want, t0, timeout=max(60.0, 80 * step_s))
                steps = (fleet.step - first) if hit else float("inf")
                results["straggler_steps"].append(steps)
            # A rank_hang of a rank that did not stop is a false root cause.
            right = f"rank_hang rank:{fleet.group}/{rank}"
            wrong = [
                a
                for a in watcher.arrived(fleet.group, gen)
                if a.startswith("rank_hang ") and not (kind == "silent" and a == right)
            ]
            if kind == "silent":
                hung_in[gen] = right
            print(
                f"[scale] trial {i + 1}/{len(plan)} {kind}"
                + (" (throttled GPU)" if kind == "straggler" and (i % 2) == 0 else "")
                + f" on rank {rank} ({gpu}), generation "
                f"{gen}: "
                + (
                    f"{hit[1]} after {hit[0]:.2f} s"
                    if hit
                    else f"none of {want} within the wait; this generation's incidents: "
                    f"{watcher.arrived(fleet.group, gen) or 'none'}"
                )
                + (f" = {results['straggler_steps'][-1]} steps" if kind == "straggler" else "")
                + (
                    f"; paged after {results['page'][-1]:.2f} s (scheduled -> received "
                    f"{results['page_wait'][-1]:.2f} s)"
                    if kind == "explicit" and hit
                    else ""
                )
                # The threshold the engine used (the group's step jitter can raise it above
                # the 4 s floor): what a silent trial can be judged against.
                + (
                    f" ({_threshold(watcher.summary(fleet.group, gen, hit[1]))})"
                    if kind == "silent" and hit
                    else ""
                )
                + (f"; {len(wrong)} other ranks called hung" if wrong else "")
                + f"; load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            fleet.restart()
            time.sleep(warm)
        fleet.stop.set()
        pump.join(30)
        took = time.monotonic() - beat_t0
        print(
            f"[scale] beat tasks run in {took:.0f} s: "
            f"{_beat_report(beat0, _task_runs(service), took)}",
            flush=True,
        )
        checks = _checks(service)
        print(
            f"[scale] passes queued for a hang threshold's moment (console.check_group): "
            f"{checks.get('ran', 0):.0f} ran, {checks.get('moved', 0):.0f} found it moved",
            flush=True,
        )
    finally:
        fleet.stop.set()
        if pager is not None:
            pager.close()
        stop_service(service)
    # Counted over the whole run (some arrive after their trial): rank_hang incidents of
    # ranks that did not stop are false root causes.
    false_hangs = sum(
        1
        for (g, gen, kind, subject) in list(watcher.seen)
        if g == fleet.group and kind == "rank_hang" and hung_in.get(gen) != f"{kind} {subject}"
    )
    median_step = step_s * 1.0
    goal_silent = max(3 * median_step, 5.0) + 1.0
    ex, si, st = results["explicit"], results["silent"], results["straggler_steps"]

    def p(values: list[float], q: float) -> str:
        return f"{pct(values, q):.2f}" if values else "-"

    most = f"{max(st)}" if st else "-"
    print(
        f"[scale] {ranks} ranks: Xid -> incident on the websocket p50 {p(ex, 50)} s "
        f"p99 {p(ex, 99)} s (goal p99 <= 1 s); silent hang p50 {p(si, 50)} s p99 "
        f"{p(si, 99)} s (goal <= {goal_silent:.0f} s); straggler named after "
        f"{most} steps at most (goal <= 10); ranks wrongly called hung {false_hangs}; "
        f"Xid -> page received p50 {p(results['page'], 50)} s p99 {p(results['page'], 99)} s"
        f" (page scheduled -> received p50 {p(results['page_wait'], 50)} s p99 "
        f"{p(results['page_wait'], 99)} s); relay ticks late {fleet.late} of "
        f"{len(fleet.ticks)}; the service's log: {service.log}"
    )
    print(
        f"scale_ranks {ranks} explicit_p99_s {p(ex, 99)} silent_p99_s {p(si, 99)} "
        f"straggler_steps_max {most} false_hangs {false_hangs} "
        f"pass_mean_ms {passes.get('mean_s', 0) * 1000:.0f} "
        f"worker_cpu_per_s {passes.get('worker_cpu_per_s', 0):.2f} "
        f"page_p50_s {p(results['page'], 50)} page_p99_s {p(results['page'], 99)} "
        f"page_wait_p50_s {p(results['page_wait'], 50)} "
        f"page_wait_p99_s {p(results['page_wait'], 99)}"
    )
    return 0
