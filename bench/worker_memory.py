"""Worker memory: run the Celery worker's real tasks in a loop in one process, watch USS.

The 30-minute soak saw the worker's private memory (USS) rise 16 % in the first 8 minutes
and then stay flat. This separates warm-up from a leak without a 30-minute run: it starts
embedded Postgres and Valkey in a temp dir, migrates, and has a child process ingest soak
batches (bench/soak.py's, NaN every 30 s) while this process runs what beat and ingest
make the worker run: `sweep` every iteration, `diagnose_group` for every group,
`escalation_sweep` every 10th and `rollup_telemetry` every 60th, called directly (no
broker round trip). `--backfill-min 10` stores 10 minutes of history first, so every
diagnosis snapshot has its full size from the start. At each checkpoint it prints USS
(psutil, after gc) and the heap traced by tracemalloc; at the end, the allocation sites
that grew most between the first checkpoint after warm-up and the last. A leak grows with
iterations; warm-up stops.

    python bench/worker_memory.py --backfill-min 10 --iterations 500   # full window at once
    python bench/worker_memory.py --iterations 1200   # the window fills as it runs
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import psutil  # noqa: E402


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "faultline.settings")
    import django

    django.setup()


def feed(nodes: int, rate: float, backfill_min: float, ready: Path) -> None:
    """Child process: ingest soak batches from `nodes` nodes at `rate` batches/s each.

    With a backfill, first store that many minutes of history (on their own clock), so
    diagnosis snapshots start at their full size (STEP_WINDOW is 10 minutes of steps).
    """
    setup_django()
    from datetime import UTC, datetime

    import msgspec
    from django.utils import timezone

    from agents import protocol
    from bench.soak import batch
    from console.models import Node
    from ingest.store import ingest_batch

    names = [f"soak-{i:02d}" for i in range(nodes)]
    rows = {n: Node.objects.get_or_create(name=n)[0] for n in names}
    seq = 0
    start = time.time() - backfill_min * 60
    for k in range(int(backfill_min * 60 * rate)):
        seq += 1
        at = start + k / rate
        for name in names:
            body = msgspec.json.encode(batch(name, f"agent-{name}", seq, at, int(at) % 30 == 0))
            ingest_batch(
                node=rows[name],
                batch=protocol.decode_batch(body),
                now=datetime.fromtimestamp(at, UTC),
                max_future_s=300,
            )
    ready.touch()
    while True:
        seq += 1
        started = time.monotonic()
        now = time.time()
        for name in names:
            body = msgspec.json.encode(batch(name, f"agent-{name}", seq, now, int(now) % 30 == 0))
            ingest_batch(
                node=rows[name],
                batch=protocol.decode_batch(body),
                now=timezone.now(),
                max_future_s=300,
            )
        time.sleep(max(0.0, 1 / rate - (time.monotonic() - started)))


def uss_mb() -> float:
    gc.collect()
    return psutil.Process().memory_full_info().uss / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--checkpoints", default="1,10,100,500,1000,2000,3000,4000,5000")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rate", type=float, default=2.0, help="batches/s per node")
    parser.add_argument(
        "--backfill-min", type=float, default=0.0, help="minutes of history stored first"
    )
    parser.add_argument("--feed", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--no-tracemalloc", action="store_true", help="USS without its cost")
    args = parser.parse_args(argv)
    if args.feed:
        feed(args.nodes, args.rate, args.backfill_min, args.feed)
        return 0

    from faultline.embedded import start_embedded

    # Stopping early still cleans up (a background job ignores SIGINT, so use SIGTERM).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    snapshots: dict[int, tracemalloc.Snapshot] = {}
    data_dir = Path(tempfile.mkdtemp(prefix="faultline-wmem-"))
    emb = start_embedded(data_dir)
    os.environ.update(
        DATABASE_URL=emb.database_url or "",
        REDIS_URL=emb.redis_url or "",
        FAULTLINE_DATA_DIR=str(data_dir),
    )
    feeder = None
    try:
        setup_django()
        from django.conf import settings
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        ready = data_dir / "fed"
        feeder = subprocess.Popen(
            [
                sys.executable,
                __file__,
                f"--feed={ready}",
                f"--nodes={args.nodes}",
                f"--rate={args.rate}",
                f"--backfill-min={args.backfill_min}",
            ]
        )
        from console import notify_tasks, tasks
        from console.models import ConsistencyGroup
        from ingest import tasks as ingest_tasks

        while not ready.exists() or ConsistencyGroup.objects.count() < args.nodes:
            time.sleep(0.5)
        groups = list(ConsistencyGroup.objects.values_list("name", flat=True))
        checkpoints = sorted(int(c) for c in args.checkpoints.split(","))
        print(
            f"worker_memory: DEBUG={settings.DEBUG} groups={len(groups)} "
            f"iterations={args.iterations} uss_mb_before={uss_mb():.1f}",
            flush=True,
        )
        if not args.no_tracemalloc:
            tracemalloc.start()
        started = time.monotonic()
        for i in range(1, args.iterations + 1):
            tasks.sweep_nodes()
            tasks.sweep()
            for name in groups:
                tasks.diagnose_group(name)
            if i % 10 == 0:
                notify_tasks.escalation_sweep()
            if i % 60 == 0:
                ingest_tasks.rollup_telemetry()
            if i in checkpoints:
                row = {
                    "iteration": i,
                    "elapsed_s": round(time.monotonic() - started, 1),
                    "uss_mb": round(uss_mb(), 1),
                    "query_log": len(connection.queries_log),
                }
                if tracemalloc.is_tracing():
                    snapshots[i] = tracemalloc.take_snapshot()
                    traced, _ = tracemalloc.get_traced_memory()
                    row["traced_mb"] = round(traced / 2**20, 2)
                    own = tracemalloc.get_tracemalloc_memory()
                    row["tracemalloc_own_mb"] = round(own / 2**20, 1)
                print(json.dumps(row), flush=True)
        return 0
    finally:
        if len(snapshots) >= 2:  # also when stopped early (SIGTERM)
            base = next((i for i in sorted(snapshots) if i >= 10), min(snapshots))
            last = max(snapshots)
            print(f"top allocation growth, iteration {base} -> {last}:", flush=True)
            keep = [tracemalloc.Filter(False, tracemalloc.__file__)]
            diff = (
                snapshots[last]
                .filter_traces(keep)
                .compare_to(snapshots[base].filter_traces(keep), "lineno")
            )
            for stat in diff[:12]:
                print(f"  {stat}", flush=True)
        if feeder is not None:
            feeder.terminate()
            feeder.wait(10)
        emb.stop()


if __name__ == "__main__":
    sys.exit(main())
