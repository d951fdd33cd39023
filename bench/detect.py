"""Detection latency: fault injected over HTTP -> incident seen on the live websocket.

Starts a real `faultline up` (embedded Postgres + Valkey, gunicorn, uvicorn, Celery worker and
beat) on free ports, keeps a training group of --ranks ranks stepping at --step-s, then per
trial injects either an explicit fault (an Xid 79 device event) or a silent hang (one rank
stops reporting) and times the moment the browser's websocket receives the incident.
Also times one full pipeline pass (DB load + engine + incident writes) for a large group.

Every trial has a group of its own on nodes of its own (no trial sees another's Xid or its
incident), and the bench's groups are established (their young mark is cleared after they
start, as if they were older than FAULTLINE_DIAGNOSIS_YOUNG_GROUP_S; `--young` keeps it).
The 1-minute load average is printed before and after the trials.

    python bench/detect.py --quick        # ~1 minute, prints a last summary line
    python bench/detect.py --quick --flood-groups 1000 --explicit-only
                                          # the same Xid trials while another node's
                                          # token posts steps of 1,000 invented groups
    python bench/detect.py --ranks 16384 --trials 3
                                          # one 16k-rank group: Xid, silent hang and
                                          # straggler trials (bench/detect_scale.py says
                                          # how a fleet that size fits this box)
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from faultline.testing.service import (  # noqa: E402
    Service,
    service_env,
    start_service,
    stop_service,
)

PER_NODE = 8
# A healthy GPU's live sample (console_device.last_sample; the agent's device_sample fields).
SAMPLE: dict[str, Any] = {
    "temp_c": 60.0,
    "power_w": 500.0,
    "sm_clock_mhz": 1980.0,
    "mem_clock_mhz": 2619.0,
    "util_pct": 97.0,
    "mem_used_bytes": 60_000_000_000,
    "ecc_sbe": 0,
    "ecc_dbe": 0,
    "retired_or_remapped_pending": 0,
    "throttle_reasons": [],
    "nvlink_errors": 0,
    "pcie_replays": 0,
}


def iso(ts: datetime) -> str:
    return ts.isoformat().replace("+00:00", "Z")


def in_service(service: Service, code: str, *args: str) -> str:
    """Run `code` in one Django process against the service's database and Valkey (what
    `faultline token create` does, once for many calls); its last stdout line."""
    script = (
        "import json, sys\nfrom faultline import bootstrap\n"
        "with bootstrap.django_ready(sys.argv[1]):\n"
        + "".join(f"    {line}\n" for line in code.splitlines())
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(service.data_dir), *args],
        env=service_env(service.data_dir),
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def post_batch(
    service: Service,
    token: str,
    node: str,
    seq: int,
    records: list[dict],
    *,
    timeout: float = 10.0,
    retries: int = 0,
) -> None:
    """One batch over HTTP as `node`'s agent; 202 or it raises (after `retries` more tries
    of a connection error, a loaded box's backlog)."""
    body = {
        "agent": {"id": f"bench-{node}", "node": node, "version": "bench"},
        "seq": seq,
        "sent_at": iso(datetime.now(UTC)),
        "records": records,
    }
    request = urllib.request.Request(
        service.url + "/api/v1/ingest",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    for attempt in range(retries + 1):
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                assert response.status == 202, response.status
                return
        except OSError:
            if attempt == retries:
                raise
            time.sleep(0.5 * (attempt + 1))


class Fleet:
    """Simulated nodes posting batches over HTTP, one agent identity (and seq) per node.

    Each group runs on nodes of its own (`{group}-n{i}`, PER_NODE ranks each): an Xid on
    one trial's GPU must not open another trial's incident (the trials shared nodes and
    GPUs before, so only the first trial was a measurement)."""

    def __init__(self, service: Service, ranks: int, step_s: float, groups: list[str]) -> None:
        self.service, self.ranks, self.step_s = service, ranks, step_s
        count = (ranks + PER_NODE - 1) // PER_NODE
        self.nodes_of = {g: [f"{g}-n{i}" for i in range(count)] for g in groups}
        self.nodes = [n for g in groups for n in self.nodes_of[g]]
        self.tokens: dict[str, str] = json.loads(
            in_service(
                service,
                "from ingest.auth import issue_token\n"
                "print(json.dumps({n: issue_token(node_name=n) for n in sys.argv[2:]}))",
                *self.nodes,
            )
        )
        self.seq = dict.fromkeys(self.nodes, 0)
        self.silent: set[tuple[str, int]] = set()
        self.groups: dict[str, int] = {}  # group -> step counter
        self.lock = threading.Lock()
        self.stop = threading.Event()
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(8)  # a tick posts one batch per node

    def establish(self, groups: list[str]) -> int:
        """Clear the groups' young marks (console.scheduling.young_key; Django's cache
        key, set by ingest when it created them): how many were marked."""
        return int(
            in_service(
                self.service,
                "from django.core.cache import cache\n"
                "keys = [f'diag-young:{g}' for g in sys.argv[2:]]\n"
                "found = cache.get_many(keys)\ncache.delete_many(keys)\nprint(len(found))",
                *groups,
            )
        )

    def post(self, node: str, records: list[dict]) -> None:
        with self.lock:
            self.seq[node] += 1
            seq = self.seq[node]
        post_batch(self.service, self.tokens[node], node, seq, records)

    def gpu(self, group: str, rank: int) -> tuple[str, str]:
        node = self.nodes_of[group][rank // PER_NODE]
        return node, f"GPU-{node}-{rank % PER_NODE}"

    def start_group(self, group: str) -> None:
        now = datetime.now(UTC)
        for node_index, node in enumerate(self.nodes_of[group]):
            records = (
                [
                    {
                        "kind": "transition",
                        "group": group,
                        "generation": 1,
                        "to_state": "running",
                        "ts": iso(now),
                    }
                ]
                if node_index == 0
                else []
            )
            for local in range(PER_NODE):
                rank = node_index * PER_NODE + local
                if rank >= self.ranks:
                    break
                _, gpu = self.gpu(group, rank)
                records.append(
                    {
                        "kind": "process",
                        "group": group,
                        "generation": 1,
                        "rank": rank,
                        "event": "started",
                        "gpu": gpu,
                        "ts": iso(now),
                    }
                )
                records.append(
                    {
                        "kind": "device_sample",
                        "gpu": gpu,
                        "index": local,
                        "temp_c": 60.0,
                        "ts": iso(now),
                    }
                )
            self.post(node, records)
        self.groups[group] = 0

    def tick(self) -> None:
        now = datetime.now(UTC)
        steps = dict(self.groups)
        posts = []
        for group, nodes in self.nodes_of.items():
            for node_index, node in enumerate(nodes):
                posts.append(
                    self.pool.submit(
                        self.post, node, self.records(group, node_index, steps.get(group), now)
                    )
                )
        for post in posts:
            post.result()
        for group in self.groups:
            self.groups[group] += 1

    def records(self, group: str, node_index: int, step: int | None, now: datetime) -> list[dict]:
        """One node's batch: a heartbeat, and its ranks' steps while the group runs."""
        records: list[dict] = [{"kind": "heartbeat", "ts": iso(now)}]
        if step is None:
            return records
        for local in range(PER_NODE):
            rank = node_index * PER_NODE + local
            if rank >= self.ranks or (group, rank) in self.silent:
                continue
            records.append(
                {
                    "kind": "step",
                    "group": group,
                    "generation": 1,
                    "rank": rank,
                    "step": step,
                    "tokens": 4096,
                    "duration_ms": self.step_s * 1000,
                    "phases": {
                        "compute": self.step_s * 700,
                        "collective": self.step_s * 300,
                    },
                    "loss": 2.0,
                    "ts": iso(now),
                }
            )
        return records

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            self.tick()
            self.stop.wait(max(0.0, self.step_s - (time.monotonic() - started)))


def flood(
    service: Service, groups: int, stop: threading.Event, sent: list[int], sustained: bool
) -> None:
    """Another node's token posting steps of `groups` invented groups back to back.

    `sustained`: after its first batch the flooder stays under every limit instead (the
    first 20 groups, the ones the new-group cap let it create, ten batches a second), so
    its young groups want diagnosis all the time."""
    node, token, seq = "flood-node", service.token("flood-node"), 0
    while not stop.is_set():
        seq += 1
        now = iso(datetime.now(UTC))
        if sustained and seq > 1:
            groups = min(groups, 20)
            stop.wait(0.1)
        records = [
            {
                "kind": "step",
                "group": f"flood-{g:05d}",
                "generation": 1,
                "rank": 0,
                "step": seq,
                "tokens": 1,
                "duration_ms": 1000.0,
                "ts": now,
            }
            for g in range(groups)
        ]
        body = {
            "agent": {"id": "flood-agent", "node": node, "version": "bench"},
            "seq": seq,
            "sent_at": now,
            "records": records,
        }
        request = urllib.request.Request(
            service.url + "/api/v1/ingest",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                sent[0] += response.status == 202
        except Exception:  # noqa: BLE001 - a refused flood (429) is the point; keep going
            sent[1] += 1
            stop.wait(0.2)


class Watcher:
    """A browser-like websocket on the fleet topic, recording when incidents arrive: the
    first arrival of each (group, generation, kind, subject)."""

    def __init__(self, service: Service, cookie: str) -> None:
        self.url = f"ws://127.0.0.1:{service.ws_port}/ws/live/fleet/"
        self.headers = {"Cookie": cookie, "Origin": service.url}
        self.seen: dict[tuple[str, int, str, str], float] = {}
        self.summaries: dict[tuple[str, int, str, str], str] = {}  # as it first arrived
        self.ready = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.thread.start()
        if not self.ready.wait(15):
            raise RuntimeError("websocket did not connect")

    async def _run(self) -> None:
        import websockets

        async with websockets.connect(self.url, additional_headers=self.headers) as ws:
            self.ready.set()
            try:
                async for message in ws:
                    event = json.loads(message)
                    if event["type"] == "incident.changed":
                        d = event["data"]
                        key = (d["group"], d["generation"], d["kind"], d["subject"])
                        self.seen.setdefault(key, time.monotonic())
                        self.summaries.setdefault(key, str(d.get("summary") or ""))
            except websockets.ConnectionClosed:
                return  # the service is shutting down at the end of the run

    def summary(self, group: str, generation: int, kind: str) -> str:
        """The first-arrived summary of `group`'s `generation`'s first `kind` incident."""
        firsts = sorted(
            (t, key) for key, t in list(self.seen.items()) if key[:3] == (group, generation, kind)
        )
        return self.summaries.get(firsts[0][1], "") if firsts else ""

    def wait(self, group: str, kinds: set[str], since: float, timeout: float) -> float | None:
        """Seconds from `since` to the first incident of `kinds` in `group` (any time)."""
        hit = self.wait_for(group, None, kinds, float("-inf"), timeout)
        return None if hit is None else hit[2] - since

    def wait_for(
        self,
        group: str,
        generation: int | None,
        kinds: set[str],
        since: float,
        timeout: float,
        subjects: dict[str, str] | None = None,
    ) -> tuple[float, str, float] | None:
        """(seconds from `since`, kind, arrival) of the first incident of `kinds` in `group`
        (and `generation`, unless None) that arrived at or after `since`; a kind named in
        `subjects` counts only on that subject (a rank_hang of another rank is wrong)."""
        deadline = time.monotonic() + timeout
        only = subjects or {}
        while time.monotonic() < deadline:
            hits = [
                (t, k)
                for (g, gen, k, subject), t in list(self.seen.items())
                if g == group
                and generation in (None, gen)
                and k in kinds
                and t >= since
                and only.get(k, subject) == subject
            ]
            if hits:
                t, kind = min(hits)
                return t - since, kind, t
            time.sleep(0.01)
        return None

    def arrived(self, group: str, generation: int) -> list[str]:
        """'kind subject' of every incident of `group`'s `generation` seen so far: on a
        miss, what the service named instead (or that it named nothing)."""
        return sorted(
            f"{k} {subject}"
            for (g, gen, k, subject) in list(self.seen)
            if g == group and gen == generation
        )


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _profiler(on: bool) -> cProfile.Profile | None:
    """A started profiler when `on` (the pass it wraps is slower by about half)."""
    if not on:
        return None
    prof = cProfile.Profile()
    prof.enable()
    return prof


def _report(prof: cProfile.Profile | None, mode: str) -> None:
    if prof is None:
        return
    prof.disable()
    print(f"cProfile of the last {mode} pass, the project's own functions:")
    stats = pstats.Stats(prof).sort_stats("cumulative")
    stats.print_stats(r"/(console|ingest)/", 40)
    stats.sort_stats("tottime").print_stats(30)


def pipeline_curve(
    sizes: list[int], steps: int, runs: int = 3, profile: str | None = None
) -> dict[int, dict[str, float]]:
    """Diagnosis passes for groups of each size straight on the database (in-process): a
    full rebuild (no live state), a live pass after every rank stepped once more, and a
    live pass after nothing per-rank changed (what an Xid or a sweep triggers). Medians, s."""
    import os

    from faultline.embedded import start_embedded

    data = Path(tempfile.mkdtemp(prefix="faultline-bench-"))
    emb = start_embedded(data)
    os.environ.update(
        DATABASE_URL=emb.database_url or "",
        REDIS_URL=emb.redis_url or "",
        FAULTLINE_DATA_DIR=str(data),
        DJANGO_SETTINGS_MODULE="faultline.settings",
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from console import pipeline, snapshots
    from console.models import ConsistencyGroup, Device, Node, Rank
    from ingest.models import StepRecord

    out: dict[int, dict[str, float]] = {}
    now = datetime.now(UTC)
    for ranks in sizes:
        name = f"big-{ranks}"
        group = ConsistencyGroup.objects.create(
            name=name, kind="training", state="running", generation=1
        )
        nodes = Node.objects.bulk_create(
            [
                Node(name=f"n{ranks}-{i}", last_seen=now)
                for i in range((ranks + PER_NODE - 1) // PER_NODE)
            ]
        )
        Rank.objects.bulk_create(
            [
                Rank(group=group, rank=r, node=nodes[r // PER_NODE], generation=1)
                for r in range(ranks)
            ]
        )
        # Every rank's GPU with a live sample, as ingest keeps it (console_device).
        sample = {"ts": now.isoformat(), **SAMPLE}
        Device.objects.bulk_create(
            [
                Device(
                    uuid=f"GPU-{ranks}-{r}",
                    node=nodes[r // PER_NODE],
                    index=r % PER_NODE,
                    last_sample={**sample, "index": r % PER_NODE},
                    last_seen=now,
                )
                for r in range(ranks)
            ],
            batch_size=20_000,
        )

        def step_rows(
            s: int, at: datetime, nodes: list[Node] = nodes, group: Any = group, n: int = ranks
        ) -> list[StepRecord]:
            return [
                StepRecord(
                    ts=at,
                    node=nodes[r // PER_NODE],
                    group=group,
                    generation=1,
                    rank=r,
                    step=s,
                    tokens=4096,
                    duration_ms=1000,
                    phases={"compute": 700, "collective": 300},
                    loss=2.0,
                )
                for r in range(n)
            ]

        for s in range(steps):
            StepRecord.objects.bulk_create(
                step_rows(s, now - timedelta(seconds=steps - s)), batch_size=20_000
            )

        def refresh(at: datetime, k: int, nodes: list[Node] = nodes) -> None:
            """Every GPU reports a new sample, as a live fleet's agents do every batch."""
            from django.db import connection

            with connection.cursor() as cur:
                cur.execute(
                    "UPDATE console_device SET last_seen = %s, last_sample = last_sample"
                    " || jsonb_build_object('temp_c', 60 + %s) WHERE node_id = ANY(%s)",
                    [at, k % 5, [n.pk for n in nodes]],
                )

        # Statistics, as autovacuum keeps them on a table that grows for minutes: without
        # them the planner takes the freshly bulk-loaded partition for 8 rows and reads a
        # cursor's new rows through the group's index (every row of the group, ~35 ms).
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("ANALYZE ingest_steprecord, console_device")
        modes = ("full", "stepped", "fleet", "idle", "idle_cold")
        times: dict[str, list[float]] = {m: [] for m in modes}
        cpu: dict[str, list[float]] = {m: [] for m in modes}
        rows: dict[str, int] = {}
        for k in range(runs):
            snapshots.forget(name)
            at = now + timedelta(seconds=2 * k)
            t0, c0 = time.perf_counter(), time.process_time()
            pipeline.diagnose(group_name=name, now=at)
            times["full"].append(time.perf_counter() - t0)
            cpu["full"].append(time.process_time() - c0)
            rows["full"] = snapshots.last_pass.get("rows", 0)
            StepRecord.objects.bulk_create(step_rows(steps + 2 * k, at), batch_size=20_000)
            prof = _profiler(profile == "stepped" and k == runs - 1)
            t0, c0 = time.perf_counter(), time.process_time()
            pipeline.diagnose(group_name=name, now=at + timedelta(seconds=1))
            times["stepped"].append(time.perf_counter() - t0)
            cpu["stepped"].append(time.process_time() - c0)
            _report(prof, "stepped")
            rows["stepped"] = snapshots.last_pass.get("rows", 0)
            # A pass after every rank stepped and every GPU sent a sample (a live fleet).
            at2 = at + timedelta(seconds=1.25)
            StepRecord.objects.bulk_create(step_rows(steps + 2 * k + 1, at2), batch_size=20_000)
            refresh(at2, k)
            prof = _profiler(profile == "fleet" and k == runs - 1)
            t0, c0 = time.perf_counter(), time.process_time()
            pipeline.diagnose(group_name=name, now=at2 + timedelta(milliseconds=100))
            times["fleet"].append(time.perf_counter() - t0)
            cpu["fleet"].append(time.process_time() - c0)
            _report(prof, "fleet")
            rows["fleet"] = snapshots.last_pass.get("rows", 0)
            prof = _profiler(profile == "idle" and k == runs - 1)
            t0, c0 = time.perf_counter(), time.process_time()
            pipeline.diagnose(group_name=name, now=at + timedelta(seconds=1.5))
            times["idle"].append(time.perf_counter() - t0)
            cpu["idle"].append(time.process_time() - c0)
            _report(prof, "idle")
            rows["idle"] = snapshots.last_pass.get("rows", 0)
            # The baseline: the same idle pass decoding every GPU's sample again (what every
            # pass did before the per-GPU cache, console.snapshots._device_records).
            with snapshots._lock:
                snapshots._device_cache.clear()
            t0, c0 = time.perf_counter(), time.process_time()
            pipeline.diagnose(group_name=name, now=at + timedelta(seconds=1.75))
            times["idle_cold"].append(time.perf_counter() - t0)
            cpu["idle_cold"].append(time.process_time() - c0)
        out[ranks] = {k: statistics.median(v) for k, v in times.items()}
        out[ranks].update({f"{k}_cpu": statistics.median(v) for k, v in cpu.items()})
        o = out[ranks]
        print(
            f"pipeline pass (DB load + engine + incidents) at {ranks} ranks x {steps} steps: "
            f"full rebuild {o['full'] * 1000:.0f} ms ({rows['full']} rows), "
            f"live after a step of every rank {o['stepped'] * 1000:.0f} ms "
            f"({rows['stepped']} rows), the same with every GPU's sample new "
            f"{o['fleet'] * 1000:.0f} ms (CPU {o['fleet_cpu'] * 1000:.0f}), "
            f"live idle {o['idle'] * 1000:.0f} ms "
            f"({rows['idle']} rows); ratio live/full {o['stepped'] / o['full']:.2f}"
            f" / {o['idle'] / o['full']:.2f}; worker CPU full {o['full_cpu'] * 1000:.0f}"
            f" / stepped {o['stepped_cpu'] * 1000:.0f} / idle {o['idle_cpu'] * 1000:.0f} ms",
            flush=True,
        )
        print(
            f"  {ranks} GPUs' samples: idle pass {o['idle'] * 1000:.0f} ms with the per-GPU "
            f"cache, {o['idle_cold'] * 1000:.0f} ms decoding them all (baseline): ratio "
            f"{o['idle'] / o['idle_cold']:.2f}; CPU {o['idle_cpu'] * 1000:.0f} / "
            f"{o['idle_cold_cpu'] * 1000:.0f} ms",
            flush=True,
        )
    from django.db import connections

    connections.close_all()
    emb.stop(force=True)
    if len(sizes) > 1:
        a, b = out[sizes[0]], out[sizes[-1]]
        for mode in (
            "full",
            "stepped",
            "fleet",
            "idle",
            "idle_cold",
            "full_cpu",
            "stepped_cpu",
            "fleet_cpu",
            "idle_cpu",
        ):
            print(
                f"growth {sizes[0]}->{sizes[-1]} ranks (x{sizes[-1] / sizes[0]:.0f}): "
                f"{mode} pass x{b[mode] / a[mode]:.1f}"
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--step-s", type=float, default=1.0)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument(
        "--big-ranks", default="4096", help="pipeline pass sizes, comma-separated (1024,4096,16384)"
    )
    parser.add_argument("--big-steps", type=int, default=20)
    parser.add_argument("--pipeline-only", action="store_true", help="skip the live trials")
    parser.add_argument(
        "--profile", choices=("idle", "stepped", "fleet"), help="cProfile the last such pass"
    )
    parser.add_argument("--flood-groups", type=int, default=0)
    parser.add_argument("--explicit-only", action="store_true")
    parser.add_argument(
        "--young",
        action="store_true",
        help="leave the bench's groups young (diagnosed on their nodes' young budget)",
    )
    parser.add_argument(
        "--flood-sustained",
        action="store_true",
        help="after its first batch the flood stays under the limits with its 20 groups",
    )
    parser.add_argument(
        "--scale",
        action="store_true",
        help="one big group, the bulk of its rows written by the bench (bench/detect_scale.py);"
        " the default from --ranks 1024 up",
    )
    parser.add_argument(
        "--http-nodes", type=int, default=16, help="--scale: nodes that post over HTTP every step"
    )
    parser.add_argument(
        "--no-device-refresh",
        action="store_true",
        help="--scale: the bench-written nodes' GPU samples stay as at start",
    )
    parser.add_argument(
        "--worker-memory-mb",
        type=int,
        default=0,
        help="--scale: FAULTLINE_WORKER_MAX_MEMORY_MB for the service (default: its own)",
    )
    parser.add_argument(
        "--no-checks",
        action="store_true",
        help="--scale: no pass queued for a hang threshold's moment (FAULTLINE_DIAGNOSIS_CHECKS=0)",
    )
    parser.add_argument(
        "--scale-trials",
        default="explicit,silent,straggler",
        help="--scale: which trials to run, comma-separated (each --trials times)",
    )
    args = parser.parse_args()
    if (args.scale or args.ranks >= 1024) and not args.pipeline_only:
        from bench.detect_scale import run_scale

        return run_scale(args)
    if args.pipeline_only:
        sizes = [int(x) for x in args.big_ranks.split(",")]
        pipeline_curve(sizes, args.big_steps, profile=args.profile)
        return 0
    flood_sent = [0, 0]
    trials = 3 if args.quick else args.trials

    data = Path(tempfile.mkdtemp(prefix="faultline-detect-"))
    print(f"load average (1 min) at start: {load()}", flush=True)
    service = start_service(data)
    groups = [f"explicit-{i}" for i in range(trials)]
    if not args.explicit_only:
        groups += [f"silent-{i}" for i in range(trials)]
    fleet = Fleet(service, args.ranks, args.step_s, groups)
    try:
        watcher = Watcher(service, service.login()[0])
        for group in groups:
            fleet.start_group(group)
        if not args.young:
            print(f"established: cleared {fleet.establish(groups)} of {len(groups)} young marks")
        pump = threading.Thread(target=fleet.run, daemon=True)
        pump.start()
        if args.flood_groups:
            threading.Thread(
                target=flood,
                args=(service, args.flood_groups, fleet.stop, flood_sent, args.flood_sustained),
                daemon=True,
            ).start()
        time.sleep(max(6.0, 8 * args.step_s))  # step-time history for the hang threshold
        print(f"load average (1 min) at the first trial: {load()}", flush=True)

        explicit: list[float] = []
        for i in range(trials):
            group = f"explicit-{i}"
            rank = (7 * i + 3) % args.ranks
            node, gpu = fleet.gpu(group, rank)
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
            latency = watcher.wait(group, {"xid"}, t0, timeout=60)
            explicit.append(latency if latency is not None else float("inf"))
            fleet.groups.pop(group)  # the group stops with its GPU

        silent: list[float] = []
        for i in range(0 if args.explicit_only else trials):
            group = f"silent-{i}"
            rank = (5 * i + 1) % args.ranks
            t0 = time.monotonic()
            fleet.silent.add((group, rank))
            latency = watcher.wait(group, {"rank_hang", "group_stall"}, t0, timeout=30)
            silent.append(latency if latency is not None else float("inf"))
            fleet.groups.pop(group)
        fleet.stop.set()
        pump.join(10)
        print(f"load average (1 min) after the trials: {load()}", flush=True)
    finally:
        fleet.stop.set()
        stop_service(service)

    goal_silent = max(3 * args.step_s, 5.0)
    if args.flood_groups:
        print(
            f"flood: {args.flood_groups} invented groups a batch, "
            f"{flood_sent[0]} batches accepted, {flood_sent[1]} refused"
        )
    if args.explicit_only:
        print("explicit trials (s): " + " ".join(f"{x:.2f}" for x in explicit))
        print(f"explicit_p50_s {pct(explicit, 50):.2f} explicit_p99_s {pct(explicit, 99):.2f}")
        return 0
    print(
        f"explicit fault (Xid 79) -> incident on websocket, {trials} trials, "
        f"{args.ranks} ranks: p50 {pct(explicit, 50):.2f}s p99 {pct(explicit, 99):.2f}s "
        f"(goal p99 <= 1 s)"
    )
    print(
        f"silent hang (one rank stops) -> incident on websocket: p50 {pct(silent, 50):.2f}s "
        f"p99 {pct(silent, 99):.2f}s (goal <= {goal_silent:.0f} s)"
    )
    sizes = [512] if args.quick else [int(x) for x in args.big_ranks.split(",")]
    curve = pipeline_curve(sizes, args.big_steps)
    big = sizes[-1]
    print(
        f"explicit_p99_s {pct(explicit, 99):.2f} silent_p99_s {pct(silent, 99):.2f} "
        f"pipeline_ms_{big} full {curve[big]['full'] * 1000:.0f} "
        f"live {curve[big]['stepped'] * 1000:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
