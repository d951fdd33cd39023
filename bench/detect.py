"""Detection latency: fault injected over HTTP -> incident seen on the live websocket.

Starts a real `faultline up` (embedded Postgres + Valkey, gunicorn, uvicorn, Celery worker and
beat) on free ports, keeps a training group of --ranks ranks stepping at --step-s, then per
trial injects either an explicit fault (an Xid 79 device event) or a silent hang (one rank
stops reporting) and times the moment the browser's websocket receives the incident.
Also times one full pipeline pass (DB load + engine + incident writes) for a large group.

    python bench/detect.py --quick        # ~1 minute, prints a last summary line
    python bench/detect.py --quick --flood-groups 1000 --explicit-only
                                          # the same Xid trials while another node's
                                          # token posts steps of 1,000 invented groups
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from faultline.testing.service import Service, start_service, stop_service  # noqa: E402

PER_NODE = 8


def iso(ts: datetime) -> str:
    return ts.isoformat().replace("+00:00", "Z")


class Fleet:
    """Simulated nodes posting batches over HTTP, one agent identity (and seq) per node."""

    def __init__(self, service: Service, ranks: int, step_s: float) -> None:
        self.service, self.ranks, self.step_s = service, ranks, step_s
        self.nodes = [f"bench-node-{i}" for i in range((ranks + PER_NODE - 1) // PER_NODE)]
        self.tokens = {n: service.token(n) for n in self.nodes}
        self.seq = dict.fromkeys(self.nodes, 0)
        self.silent: set[tuple[str, int]] = set()
        self.groups: dict[str, int] = {}  # group -> step counter
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def post(self, node: str, records: list[dict]) -> None:
        with self.lock:
            self.seq[node] += 1
            seq = self.seq[node]
        now = datetime.now(UTC)
        body = {
            "agent": {"id": f"bench-{node}", "node": node, "version": "bench"},
            "seq": seq,
            "sent_at": iso(now),
            "records": records,
        }
        request = urllib.request.Request(
            self.service.url + "/api/v1/ingest",
            data=json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {self.tokens[node]}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 202, response.status

    def gpu(self, rank: int) -> tuple[str, str]:
        node = self.nodes[rank // PER_NODE]
        return node, f"GPU-{node}-{rank % PER_NODE}"

    def start_group(self, group: str) -> None:
        now = datetime.now(UTC)
        for node_index, node in enumerate(self.nodes):
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
                _, gpu = self.gpu(rank)
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
        for node_index, node in enumerate(self.nodes):
            records = [{"kind": "heartbeat", "ts": iso(now)}]
            for group, step in list(self.groups.items()):
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
            self.post(node, records)
        for group in self.groups:
            self.groups[group] += 1

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            self.tick()
            self.stop.wait(max(0.0, self.step_s - (time.monotonic() - started)))


def flood(service: Service, groups: int, stop: threading.Event, sent: list[int]) -> None:
    """Another node's token posting steps of `groups` invented groups back to back."""
    node, token, seq = "flood-node", service.token("flood-node"), 0
    while not stop.is_set():
        seq += 1
        now = iso(datetime.now(UTC))
        records = [
            {"kind": "step", "group": f"flood-{g:05d}", "generation": 1, "rank": 0,
             "step": seq, "tokens": 1, "duration_ms": 1000.0, "ts": now}
            for g in range(groups)
        ]  # fmt: skip
        body = {"agent": {"id": "flood-agent", "node": node, "version": "bench"},
                "seq": seq, "sent_at": now, "records": records}  # fmt: skip
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
    """A browser-like websocket on the fleet topic, recording when incidents arrive."""

    def __init__(self, service: Service, cookie: str) -> None:
        self.url = f"ws://127.0.0.1:{service.ws_port}/ws/live/fleet/"
        self.headers = {"Cookie": cookie, "Origin": service.url}
        self.seen: dict[tuple[str, str], float] = {}
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
                        key = (event["data"]["group"], event["data"]["kind"])
                        self.seen.setdefault(key, time.monotonic())
            except websockets.ConnectionClosed:
                return  # the service is shutting down at the end of the run

    def wait(self, group: str, kinds: set[str], since: float, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hits = [t for (g, k), t in self.seen.items() if g == group and k in kinds]
            if hits:
                return min(hits) - since
            time.sleep(0.01)
        return None


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def pipeline_time(ranks: int, steps: int) -> tuple[float, float]:
    """One diagnosis pass for a `ranks`-rank group straight on the database (in-process)."""
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
    from console import pipeline
    from console.models import ConsistencyGroup, Node, Rank
    from ingest.models import StepRecord

    group = ConsistencyGroup.objects.create(
        name="big", kind="training", state="running", generation=1
    )
    nodes = Node.objects.bulk_create(
        [Node(name=f"n{i}") for i in range((ranks + PER_NODE - 1) // PER_NODE)]
    )
    Rank.objects.bulk_create(
        [Rank(group=group, rank=r, node=nodes[r // PER_NODE], generation=1) for r in range(ranks)]
    )
    now = datetime.now(UTC)
    rows = [
        StepRecord(
            ts=now - timedelta(seconds=steps - s),
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
        for r in range(ranks)
        for s in range(steps)
    ]
    StepRecord.objects.bulk_create(rows, batch_size=20_000)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        pipeline.diagnose(group_name="big", now=now)
        times.append(time.perf_counter() - t0)
    from django.db import connections

    connections.close_all()
    emb.stop(force=True)
    return min(times), statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--step-s", type=float, default=1.0)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--big-ranks", type=int, default=4096)
    parser.add_argument("--flood-groups", type=int, default=0)
    parser.add_argument("--explicit-only", action="store_true")
    args = parser.parse_args()
    flood_sent = [0, 0]
    trials = 3 if args.quick else args.trials

    data = Path(tempfile.mkdtemp(prefix="faultline-detect-"))
    service = start_service(data)
    fleet = Fleet(service, args.ranks, args.step_s)
    try:
        watcher = Watcher(service, service.login()[0])
        groups = [f"explicit-{i}" for i in range(trials)] + [f"silent-{i}" for i in range(trials)]
        for group in groups:
            fleet.start_group(group)
        pump = threading.Thread(target=fleet.run, daemon=True)
        pump.start()
        if args.flood_groups:
            threading.Thread(
                target=flood, args=(service, args.flood_groups, fleet.stop, flood_sent),
                daemon=True,
            ).start()  # fmt: skip
        time.sleep(max(6.0, 8 * args.step_s))  # step-time history for the hang threshold

        explicit: list[float] = []
        for i in range(trials):
            group = f"explicit-{i}"
            rank = (7 * i + 3) % args.ranks
            if args.explicit_only:  # one node per trial: no trial sees another's incident
                rank = (i * PER_NODE + 3) % args.ranks
            node, gpu = fleet.gpu(rank)
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
    finally:
        fleet.stop.set()
        stop_service(service)

    goal_silent = max(3 * args.step_s, 5.0)
    if args.flood_groups:
        print(f"flood: {args.flood_groups} invented groups a batch, "
              f"{flood_sent[0]} batches accepted, {flood_sent[1]} refused")  # fmt: skip
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
    big = 512 if args.quick else args.big_ranks
    best, med = pipeline_time(big, 20)
    print(
        f"pipeline pass (DB load + engine + incidents) at {big} ranks x 20 steps: "
        f"best {best * 1000:.0f} ms, median {med * 1000:.0f} ms"
    )
    print(
        f"explicit_p99_s {pct(explicit, 99):.2f} silent_p99_s {pct(silent, 99):.2f} "
        f"pipeline_ms_{big} {med * 1000:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
