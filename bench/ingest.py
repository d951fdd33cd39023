"""Benchmark ingest over real HTTP against a raw single-connection COPY of the same rows.

Starts what it needs (embedded Postgres and Valkey under a temp dir unless DATABASE_URL and
REDIS_URL are given), migrates, issues one token per simulated node, and then, per shape:

1. N sender threads POST gzip batches back to back to gunicorn (2 gthread workers x 4
   threads and the keep-alive options, as `faultline up` runs it), each simulated node on
   its own kept-alive connection through the agent's own connection code
   (`agents.sender.IngestConnection`), or one connection per batch with
   --per-batch-connections; each sender stands in for its share of the simulated 8-GPU
   nodes and sends their batches in turn. Per simulated second a node sends 8 device
   samples, 8 steps, 8 collective windows and a heartbeat; now and then a device event, a
   checkpoint or a transition. A batch holds `--batch-seconds` of that.
2. With --compare-asgi, the same load against uvicorn (2 workers, the ASGI app).
3. The rows the gunicorn run stored, written again by one psycopg connection with COPY
   into the same tables: the ceiling for this machine's Postgres.

`--quick` (about a minute) runs two shapes: "steady" (800 nodes, 8 senders, 5 s =
125-record batches) and "backlog" (16 nodes draining spools in 1,000-record batches back
to back). It prints records/s,
request p50/p99, CPU per batch and the ratio to raw COPY per shape; the last line reads
`records/s N p99_ms N ratio N` for the last shape.

    python bench/ingest.py --quick [--compare-asgi]
    python bench/ingest.py --batch-seconds 4 --nodes 8 [--senders 8 --workers 2 --threads 4]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.client
import os
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402 -- after the path setup above

from agents.sender import IngestConnection  # noqa: E402
from bench import http_servers  # noqa: E402
from faultline.embedded import free_port, start_embedded  # noqa: E402

GPUS = 8
NODES_PER_GROUP = 4


# -- load ------------------------------------------------------------------------------------
@dataclass
class Agent:
    index: int
    node: str
    group: str
    token: str = ""
    batches: list[list[dict[str, Any]]] = field(default_factory=list)
    # Each batch's records as JSON, encoded at setup: the load generator shares the box's
    # two cores with the server, and a real agent runs on its own node.
    encoded: list[bytes] = field(default_factory=list)


def node_records(agent: Agent, second: int, ts: str, ts_dt: datetime) -> list[dict[str, Any]]:
    """One simulated second of one 8-GPU training node."""
    a, g0 = agent.index, (agent.index % NODES_PER_GROUP) * GPUS
    out: list[dict[str, Any]] = [
        {"kind": "heartbeat", "ts": ts, "uptime_s": float(second), "spool_depth": 0}
    ]
    started = (ts_dt - timedelta(milliseconds=40)).isoformat()
    for g in range(GPUS):
        gpu = f"GPU-{agent.node}-{g}"
        out.append(
            {
                "kind": "device_sample",
                "ts": ts,
                "gpu": gpu,
                "index": g,
                "temp_c": 55.0 + (second + g) % 20,
                "power_w": 610.0 + g,
                "util_pct": 97.0,
                "sm_clock_mhz": 1980.0 - (40.0 if (second + g) % 50 == 0 else 0.0),
                "mem_clock_mhz": 2619.0,
                "mem_used_bytes": 71_000_000_000,
                "ecc_sbe": 0,
                "ecc_dbe": 0,
                "retired_or_remapped_pending": 0,
                "nvlink_errors": 0,
                "pcie_replays": 0,
                "throttle_reasons": ["sw_power_cap"] if (second + g) % 97 == 0 else [],
            }
        )
        common = {"ts": ts, "group": agent.group, "generation": 1, "rank": g0 + g}
        out.append(
            {
                "kind": "step",
                **common,
                "step": second,
                "tokens": 8192,
                "duration_ms": 950.0 + (second * 7 + g * 13) % 60,
                "phases": {"compute": 700.0, "collective": 180.0, "input": 20.0, "optimizer": 40.0},
                "loss": 2.31,
                "grad_norm": 1.07,
                "loss_scale": 65536.0,
                "overflow": False,
            }
        )
        out.append(
            {
                "kind": "collective",
                **common,
                "entries": [
                    {
                        "seq": second * 4 + i,
                        "op": "allreduce",
                        "numel": 1 << 20,
                        "dtype": "bf16",
                        "state": "completed",
                        "started_ts": started,
                    }
                    for i in range(4)
                ],
            }
        )
    if second % 30 == 7:
        out.append(
            {
                "kind": "device_event",
                "ts": ts,
                "gpu": f"GPU-bench-{a:04d}-0",
                "event": "thermal",
                "detail": "slowdown threshold crossed",
            }
        )
    if second % 60 == 59:
        out.append(
            {
                "kind": "checkpoint",
                "ts": ts,
                "group": agent.group,
                "generation": 1,
                "checkpoint_id": f"ck-{second}",
                "phase": "committed",
                "step": second,
                "manifest": {
                    "shards": [{"path": f"shard-{i}", "bytes": 1 << 30} for i in range(8)],
                    "format": "dcp",
                },
            }
        )
    return out


def build_batches(agents: list[Agent], batches_each: int, batch_seconds: int) -> int:
    """Records end 'now' and run back in time: a node catching up on its spool."""
    seconds = batches_each * batch_seconds
    end = datetime.now(UTC).replace(microsecond=0)
    stamps = [(end - timedelta(seconds=seconds - s)) for s in range(seconds)]
    iso = [t.isoformat().replace("+00:00", "Z") for t in stamps]
    total = 0
    for agent in agents:
        first = {
            "kind": "transition",
            "ts": iso[0],
            "group": agent.group,
            "generation": 1,
            "to_state": "running",
            "restart_count": 0,
            "world_size": NODES_PER_GROUP * GPUS,
            "model_version": "m-1",
        }
        agent.batches, agent.encoded = [], []
        for b in range(batches_each):
            recs: list[dict[str, Any]] = [first] if b == 0 else []
            for s in range(b * batch_seconds, (b + 1) * batch_seconds):
                recs += node_records(agent, s, iso[s], stamps[s])
            agent.batches.append(recs)
            agent.encoded.append(msgspec.json.encode(recs))
            total += len(recs)
    return total


# -- HTTP load -------------------------------------------------------------------------------
@dataclass
class Result:
    server: str
    records: int = 0
    batches: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    sent: dict[int, int] = field(default_factory=dict)  # agent index -> batches acked
    server_cpu_s: float = 0.0  # web server process tree, user + system
    client_cpu_s: float = 0.0  # this process: the simulated agents (encode, gzip, HTTP)
    postgres_cpu_s: float = 0.0
    deadlocks: int = 0  # broken by Postgres during the load: each cost ~1 s and a retry
    ratio: float = 0.0  # to the raw COPY of the same rows, once measured

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


class _Connection(http.client.HTTPConnection):
    """http.client writes headers and body in two sends: without TCP_NODELAY, Nagle holds
    the body until the server's delayed ACK (~40 ms) on every request to a sync server."""

    def connect(self) -> None:
        super().connect()
        if NODELAY:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


NODELAY = True
WORKERS = 2  # --workers: server processes (faultline up's default is 2)
THREADS = 4  # --threads: gunicorn threads per worker
PER_BATCH = False  # --per-batch-connections: a connection per batch (the agent before keep-alive)
SERVER_ARGS: tuple[str, ...] | None = None  # --server-args; None: faultline up's


def _bench_keepalive() -> tuple[str, ...]:
    """`faultline up`'s connection options with a 600 s idle timeout instead of 30 s.

    A real node sends every <= 5 s, well inside 30 s. A simulated node here sends once per
    round of all nodes, and a round of 800 nodes on a loaded 2-core box can take longer than
    30 s: the server would close every connection before its next batch and the bench would
    measure reconnects that a fleet does not make. The timeout only has to outlast the gap
    between a node's batches, which here is the round, not the agent's interval."""
    from faultline.bootstrap import WEB_KEEPALIVE

    out = list(WEB_KEEPALIVE)
    out[out.index("--keep-alive") + 1] = "600"
    return tuple(out)


def _post(
    agent: Agent, seq: int, port: int, run_id: str, conns: dict[int, IngestConnection]
) -> tuple[bool, float]:
    """One batch, as the agent sends it: gzip, on the node's own kept-alive connection
    (`conns`, one per simulated node as in a fleet), or a new one per batch with
    --per-batch-connections (the agent before it kept connections). (acked, seconds)."""
    ident = msgspec.json.encode(
        {"id": f"bench-{run_id}-{agent.index:04d}", "node": agent.node, "version": "bench"}
    )
    headers = {
        "Authorization": f"Bearer {agent.token}",
        "Content-Type": "application/json",
        "Content-Encoding": "gzip",
    }
    if PER_BATCH:
        headers["Connection"] = "close"
    sent_at = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    body = b'{"agent":%s,"seq":%d,"sent_at":"%s","records":%s}' % (
        ident,
        seq,
        sent_at.encode(),
        agent.encoded[seq - 1],
    )
    payload = gzip.compress(body, 1)  # agents use 5; the server's inflate cost is alike
    t0 = time.perf_counter()
    if not PER_BATCH:  # the agent's own connection code: idle check, one fresh retry
        conn = conns.get(agent.index)
        if conn is None:
            conn = conns[agent.index] = IngestConnection(
                f"http://127.0.0.1:{port}/api/v1/ingest", timeout=60
            )
        try:
            status, _, _ = conn.post(payload, headers)
        except (OSError, http.client.HTTPException):
            return False, time.perf_counter() - t0
        return status == 202, time.perf_counter() - t0
    one = _Connection("127.0.0.1", port, timeout=60)
    try:
        one.request("POST", "/api/v1/ingest", payload, headers)
        response = one.getresponse()
        response.read()
    except (OSError, http.client.HTTPException):
        return False, time.perf_counter() - t0
    finally:
        one.close()
    return response.status == 202, time.perf_counter() - t0


@dataclass
class _Start:
    """Senders send every node's first batch (its job start: a transition that locks the
    group) untimed, then wait here until the clock starts."""

    ready: threading.Barrier
    go: threading.Barrier
    deadline: float = 0.0


def _send_all(
    agents: list[Agent],
    port: int,
    run_id: str,
    start: _Start,
    result: Result,
    lock: threading.Lock,
) -> None:
    """Post the agents' batches in turn (first batches of all, then second batches...): one
    thread standing in for many nodes, each node's batches spaced as in a real fleet."""
    records = errors = acked = 0
    sent = dict.fromkeys((a.index for a in agents), 0)
    latencies: list[float] = []
    conns: dict[int, IngestConnection] = {}  # a node's kept-alive connection
    for agent in agents:
        ok, _ = _post(agent, 1, port, run_id, conns)
        sent[agent.index] += ok
        errors += not ok
    start.ready.wait()
    start.go.wait()
    rounds = max(len(a.batches) for a in agents)
    turns = [(seq, a) for seq in range(2, rounds + 1) for a in agents if seq <= len(a.batches)]
    for seq, agent in turns:
        if time.monotonic() >= start.deadline:
            break
        ok, seconds = _post(agent, seq, port, run_id, conns)
        latencies.append(seconds)
        if ok:
            records += len(agent.batches[seq - 1])
            sent[agent.index] += 1
            acked += 1
        else:
            errors += 1
    for conn in conns.values():
        conn.close()
    with lock:
        result.records += records
        result.batches += acked
        result.errors += errors
        result.latencies += latencies
        result.sent.update(sent)


def run_load(
    server: str, agents: list[Agent], env: dict[str, str], seconds: float, threads: int
) -> Result:
    port = free_port()
    result = Result(server)
    lock = threading.Lock()
    run_id = secrets.token_hex(4)
    start = _Start(threading.Barrier(threads + 1), threading.Barrier(threads + 1))
    with http_servers.running(
        server, port, env, workers=WORKERS, threads=THREADS, extra=SERVER_ARGS
    ) as pid:
        senders = [
            threading.Thread(
                target=_send_all, args=(agents[i::threads], port, run_id, start, result, lock)
            )
            for i in range(threads)
        ]
        for t in senders:
            t.start()
        start.ready.wait()  # every node has started its job
        deadlocks = _deadlocks(env["DATABASE_URL"])
        cpu0 = _cpu(pid), _postgres_cpu(), time.process_time()
        start.deadline = time.monotonic() + seconds
        t0 = time.perf_counter()
        start.go.wait()
        for t in senders:
            t.join()
        result.seconds = time.perf_counter() - t0
        result.server_cpu_s = _cpu(pid) - cpu0[0]
        result.postgres_cpu_s = _postgres_cpu() - cpu0[1]
        result.client_cpu_s = time.process_time() - cpu0[2]
    # After the server stopped: its backends report their counts as they exit.
    result.deadlocks = _deadlocks(env["DATABASE_URL"]) - deadlocks
    return result


def _deadlocks(database_url: str) -> int:
    """Deadlocks Postgres has broken in the database so far. Each held its transactions for
    `deadlock_timeout` (1 s) before one was aborted and its batches stored again (group
    commit's shared transactions did this until 2026-12-05: docs/performance.md)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def _cpu(pid: int) -> float:
    """CPU seconds of a process and its children (the server's workers)."""
    import psutil

    total = 0.0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system
    return total


POSTMASTER_PID: Path | None = None  # the embedded server's; None with a given DATABASE_URL


def _postgres_cpu() -> float:
    """CPU seconds of our Postgres: the postmaster and its backends (nan if not ours).

    Exited backends take their CPU with them, so the figure is a floor; with one long-lived
    connection per worker (the pool) that loss is small.
    """
    import psutil

    if POSTMASTER_PID is None or not POSTMASTER_PID.exists():
        return float("nan")
    total = 0.0
    with contextlib.suppress(psutil.Error, ValueError, IndexError):
        root = psutil.Process(int(POSTMASTER_PID.read_text().split()[0]))
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system
    return total


# -- raw COPY baseline -----------------------------------------------------------------------
def copy_baseline(database_url: str, agents: list[Agent], sent: dict[int, int]) -> Result:
    """The same rows the HTTP run stored, by one connection: COPY per table per 50 batches."""
    import psycopg
    from psycopg.types.json import Jsonb

    from console.models import ConsistencyGroup, Node
    from ingest.store.tables import COLUMNS

    node_ids = dict(Node.objects.values_list("name", "id"))
    group_ids = dict(ConsistencyGroup.objects.values_list("name", "id"))
    chunks: list[dict[str, list[tuple[Any, ...]]]] = []
    records = 0
    for agent in agents:
        nid, gid = node_ids[agent.node], group_ids[agent.group]
        for recs in agent.batches[: sent.get(agent.index, 0)]:
            if len(chunks) % 50 == 0 or not chunks:
                chunks.append({t: [] for t in COLUMNS})
            rows = chunks[-1]
            records += len(recs)
            for r in recs:
                _baseline_row(rows, r, nid, gid, Jsonb)
    result = Result("copy", records=records, batches=len(chunks))
    with psycopg.connect(database_url) as conn:
        pg0 = _postgres_cpu()
        t0 = time.perf_counter()
        for rows in chunks:
            with conn.cursor() as cur:
                for table, table_rows in rows.items():
                    if not table_rows:
                        continue
                    sql = f"COPY ingest_{table} ({', '.join(COLUMNS[table])}) FROM STDIN"
                    with cur.copy(sql) as copy:
                        for row in table_rows:
                            copy.write_row(row)
            conn.commit()
        result.seconds = time.perf_counter() - t0
        result.postgres_cpu_s = _postgres_cpu() - pg0
    return result


def _baseline_row(
    rows: dict[str, list[tuple[Any, ...]]], r: dict[str, Any], nid: int, gid: int, jsonb: Any
) -> None:
    kind, ts = r["kind"], datetime.fromisoformat(r["ts"])
    if kind == "device_sample":
        rows["devicesample"].append(
            (
                ts,
                nid,
                r["gpu"],
                r["index"],
                r["temp_c"],
                r["power_w"],
                r["sm_clock_mhz"],
                r["mem_clock_mhz"],
                r["util_pct"],
                r["mem_used_bytes"],
                r["ecc_sbe"],
                r["ecc_dbe"],
                r["retired_or_remapped_pending"],
                jsonb(r["throttle_reasons"]),
                r["nvlink_errors"],
                r["pcie_replays"],
            )
        )
    elif kind == "step":
        rows["steprecord"].append(
            (
                ts,
                nid,
                gid,
                1,
                False,
                r["rank"],
                r["step"],
                r["tokens"],
                None,
                r["duration_ms"],
                jsonb(r["phases"]),
                r["loss"],
                r["grad_norm"],
                r["loss_scale"],
                r["overflow"],
            )
        )
    elif kind == "collective":
        rows["collectivewindow"].append((ts, nid, gid, 1, False, r["rank"], jsonb(r["entries"])))
    elif kind == "device_event":
        rows["deviceevent"].append((ts, nid, r["gpu"], r["event"], None, r["detail"], ""))
    elif kind == "checkpoint":
        rows["checkpointrecord"].append(
            (
                ts,
                nid,
                gid,
                1,
                False,
                r["checkpoint_id"],
                r["step"],
                r["phase"],
                jsonb(r["manifest"]),
                None,
                None,
                r.get("data_cursor"),
            )
        )
    elif kind == "transition":
        rows["transitionrecord"].append(
            (
                ts,
                nid,
                gid,
                1,
                False,
                None,
                r["to_state"],
                None,
                0,
                r["world_size"],
                None,
                None,
                r["model_version"],
            )
        )


# -- setup -----------------------------------------------------------------------------------
def _django(env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "faultline.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, skip_checks=True)


def _report(r: Result, copy: Result | None) -> str:
    ratio = r.rate / copy.rate if copy and copy.rate else float("nan")
    return (
        f"{r.server:9s} records/s {r.rate:9.0f}  batches/s {r.batches / r.seconds:7.1f}  "
        f"p50_ms {r.pct(0.5):6.1f}  p99_ms {r.pct(0.99):6.1f}  errors {r.errors}  "
        f"ratio {ratio:.2f}  cpu_ms/batch web {r.server_cpu_s / max(r.batches, 1) * 1000:.1f} "
        f"pg {r.postgres_cpu_s / max(r.batches, 1) * 1000:.1f} "
        f"client {r.client_cpu_s / max(r.batches, 1) * 1000:.1f}  deadlocks {r.deadlocks}"
    )


@dataclass
class Shape:
    """One load: simulated nodes, how many post at once, and what each batch holds."""

    name: str
    batch_seconds: int
    nodes: int  # simulated 8-GPU nodes, each with its own token, agent id and seq
    senders: int  # concurrent connections; each sends its nodes' batches in turn
    target: int  # records/s to build batches for


def run_shape(shape: Shape, env: dict[str, str], args: argparse.Namespace) -> Result:
    """Load gunicorn (and uvicorn with --compare-asgi) with one shape, then its COPY baseline."""
    from ingest.auth import issue_token

    t0 = time.perf_counter()
    agents = [
        Agent(
            i,
            f"bench-{shape.name}-node-{i:04d}",
            f"bench-{shape.name}-job-{i // NODES_PER_GROUP:03d}",
        )
        for i in range(shape.nodes)
    ]
    for a in agents:
        a.token = issue_token(node_name=a.node)
    per_batch = shape.batch_seconds * (1 + 3 * GPUS)
    batches_each = 1 + max(
        2, int(shape.target * args.seconds / per_batch / shape.nodes) + 1
    )  # the untimed first batch, then enough for the target rate (a faster server finishes
    # early; records/s is over the time it took)
    built = build_batches(agents, batches_each, shape.batch_seconds)
    print(
        f"[{shape.name}] setup {time.perf_counter() - t0:.1f} s: {shape.nodes} 8-GPU nodes, "
        f"{shape.senders} at a time, {per_batch} records per batch, {built} records built",
        flush=True,
    )
    results = [run_load(args.server, agents, env, args.seconds, shape.senders)]
    if args.compare_asgi:
        results.append(run_load("uvicorn", agents, env, args.seconds, shape.senders))
    copy = copy_baseline(env["DATABASE_URL"], agents, results[0].sent)
    print(
        f"{'copy':9s} records/s {copy.rate:9.0f}  ({copy.records} records, one connection; "
        f"pg cpu_ms per 1k records {copy.postgres_cpu_s / max(copy.records, 1) * 1e6:.1f})"
    )
    for r in results:
        print(_report(r, copy))
    results[0].ratio = results[0].rate / copy.rate if copy.rate else 0.0
    return results[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="about a minute: the steady and the backlog shape, unless one is given",
    )
    parser.add_argument("--compare-asgi", action="store_true", help="also load uvicorn")
    parser.add_argument(
        "--server",
        default="gunicorn",
        choices=("gunicorn", "granian"),
        help="the WSGI server under load (granian: pip install granian; not shipped)",
    )
    parser.add_argument("--nodes", type=int, help="simulated 8-GPU nodes (default 8)")
    parser.add_argument("--senders", type=int, help="concurrent connections (default: nodes)")
    parser.add_argument("--seconds", type=float, default=20.0, help="load time per server")
    parser.add_argument("--batch-seconds", type=int, help="seconds per batch (default 5)")
    parser.add_argument("--workers", type=int, default=2, help="server worker processes")
    parser.add_argument("--threads", type=int, default=4, help="gunicorn threads per worker")
    parser.add_argument("--target", type=int, default=100_000, help="records/s to build for")
    parser.add_argument(
        "--nodes-per-group", type=int, default=4, help="nodes of one training job (group)"
    )
    parser.add_argument(
        "--per-batch-connections",
        action="store_true",
        help="open a connection per batch instead of one kept-alive connection per node",
    )
    parser.add_argument(
        "--server-args",
        help="gunicorn connection options instead of faultline up's, "
        "e.g. '--keep-alive 30' (no --reuse-port); '' for gunicorn's defaults",
    )
    args = parser.parse_args()
    global WORKERS, THREADS, PER_BATCH, SERVER_ARGS
    WORKERS, THREADS = args.workers, args.threads
    PER_BATCH = args.per_batch_connections
    if args.server_args is not None:
        SERVER_ARGS = tuple(args.server_args.split())
    else:
        SERVER_ARGS = _bench_keepalive()
    global NODES_PER_GROUP  # one knob, read by the record builders
    NODES_PER_GROUP = args.nodes_per_group
    if args.quick:
        args.seconds = min(args.seconds, 8.0)
    if args.quick and args.batch_seconds is None and args.nodes is None:
        shapes = [STEADY, BACKLOG]
    else:
        nodes = args.nodes or 8
        shapes = [
            Shape(
                "custom",
                args.batch_seconds or STEADY.batch_seconds,
                nodes,
                args.senders or nodes,
                args.target,
            )
        ]

    tmp = Path(tempfile.mkdtemp(prefix="faultline-bench-ingest-"))
    embedded = None
    try:
        embedded = start_embedded(tmp)
        global POSTMASTER_PID  # read by _postgres_cpu
        if embedded.database_url:
            POSTMASTER_PID = tmp / "pg" / "postmaster.pid"
        env = {
            "DATABASE_URL": os.environ.get("DATABASE_URL") or embedded.database_url or "",
            "REDIS_URL": os.environ.get("REDIS_URL") or embedded.redis_url or "",
            "FAULTLINE_SECRET_KEY": secrets.token_urlsafe(40),
            "FAULTLINE_DATA_DIR": str(tmp),
            "FAULTLINE_INGEST_RATE_PER_MIN": "100000000",
            "FAULTLINE_INGEST_RECORDS_PER_MIN": "1000000000",
        }
        _django(env)
        results = [run_shape(shape, env, args) for shape in shapes]
        for shape, r in zip(shapes, results, strict=True):
            print(
                f"[{shape.name}] records/s {r.rate:.0f} p99_ms {r.pct(0.99):.0f} "
                f"ratio {r.ratio:.2f}"
            )
        last = results[-1]
        print(f"records/s {last.rate:.0f} p99_ms {last.pct(0.99):.0f} ratio {last.ratio:.2f}")
    finally:
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        if embedded is not None:
            embedded.stop()
        for _ in range(20):  # Postgres may still write its stats file while it exits
            shutil.rmtree(tmp, ignore_errors=True)
            if not tmp.exists():
                break
            time.sleep(0.25)


# A fleet at rest: 800 nodes sending 125-record batches (5 s, `--send-interval 5`,
# docs/operations.md), 8 at a time; a node's batches come seconds apart, as in a fleet, so
# each one is also due a live push of its node card. And the peak after an outage: 16
# nodes draining their spools in 1,000-record batches (the agent's largest) back to back.
STEADY = Shape("steady", batch_seconds=5, nodes=800, senders=8, target=60_000)
BACKLOG = Shape("backlog", batch_seconds=40, nodes=16, senders=16, target=100_000)


if __name__ == "__main__":
    main()
