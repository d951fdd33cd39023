"""Sizing for 1k, 16k and 100k GPUs from one measured run (docs/operations.md, Sizing).

Runs bench/ingest.py's steady load (8-GPU nodes at 1 s sampling, 5 s batches, over real
HTTP to gunicorn) for `--seconds`, then reads what that load stored: rows and bytes per
table (heap + indexes + TOAST, partitions summed), rows per node-second, and web and
Postgres CPU per batch. It then times the hourly receipt prune on `--receipts` synthetic
receipts (rows/s). Measured: bytes/row, rows per node-second, CPU per batch, prune rows/s.
Projected (linear in nodes, printed as such): records/s, batches/s, rows/day, disk/day,
cores. The per-batch CPU is this machine's; a fleet's cores scale with batches/s only
while Postgres is not the bottleneck (one Postgres's ceiling is the raw COPY rate that
bench/ingest.py prints).

    python bench/sizing.py                 # ~1-2 min on 2 vCPUs
    python bench/sizing.py --seconds 20 --nodes 800 --receipts 1000000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import ingest as bench  # noqa: E402 -- after the path setup above
from faultline.embedded import start_embedded  # noqa: E402

FLEETS = (1_000, 16_384, 100_000)  # GPUs
# Tables that grow with time at a fleet at rest (the bench's device events, one every 30 s
# per node, and checkpoints, one a minute per node, are far above a healthy fleet's rate).
GROWING = (
    "ingest_devicesample",
    "ingest_steprecord",
    "ingest_collectivewindow",
    "ingest_batchreceipt",
    "ingest_deviceevent",
    "ingest_checkpointrecord",
)
GPUS_PER_NODE = 8

_SIZES = """
SELECT p.relname, CASE WHEN p.relkind = 'p'
    THEN (SELECT sum(pg_total_relation_size(t.relid)) FROM pg_partition_tree(p.oid) t)
    ELSE pg_total_relation_size(p.oid) END::bigint
FROM pg_class p
JOIN pg_namespace n ON n.oid = p.relnamespace AND n.nspname = 'public'
WHERE p.relkind IN ('r', 'p') AND NOT p.relispartition
  AND (p.relname LIKE 'ingest_%' OR p.relname LIKE 'console_%')
"""


def table_sizes() -> dict[str, tuple[int, int]]:
    """Per table: (exact rows, bytes with indexes and partitions)."""
    from django.db import connection

    out: dict[str, tuple[int, int]] = {}
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
        cur.execute(_SIZES)
        for name, size in cur.fetchall():
            cur.execute(f"SELECT count(*) FROM {name}")  # noqa: S608 - catalog names
            out[name] = (cur.fetchone()[0], size)
    return out


def time_prune(receipts: int) -> tuple[float, float]:
    """Prune `receipts` day-old synthetic receipts: (rows/s, Postgres CPU s per 1M rows)."""
    from datetime import UTC, datetime, timedelta

    from django.db import connection

    from ingest import retention

    old = datetime.now(UTC) - timedelta(days=2)
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO ingest_agentstate (agent_id, node_id, version, boot_id, batches,"
            " records, duplicates, gaps, gap_ranges, spool_depth, dropped) SELECT"
            " 'sizing-' || g, (SELECT min(id) FROM console_node), '', '', 0, 0, 0, 0,"
            " '[]', 0, 0 FROM generate_series(1, 1000) g"
        )
        cur.execute(
            "INSERT INTO ingest_batchreceipt (agent_id, seq, received_at, records) "
            "SELECT 'sizing-' || (g %% 1000 + 1), g, %s, 125 FROM generate_series(1, %s) g",
            [old, receipts],
        )
        cur.execute("VACUUM ANALYZE ingest_batchreceipt")
    pg0, t0 = bench._postgres_cpu(), time.perf_counter()
    removed = retention.prune_receipts(before=datetime.now(UTC) - timedelta(hours=24))
    seconds, pg = time.perf_counter() - t0, bench._postgres_cpu() - pg0
    return removed / seconds, pg / max(removed, 1) * 1e6


def report(
    sizes: dict[str, tuple[int, int]],
    node_seconds: float,
    r: bench.Result,
    prune: tuple[float, float],
) -> None:
    web_ms = r.server_cpu_s / max(r.batches, 1) * 1000
    pg_ms = r.postgres_cpu_s / max(r.batches, 1) * 1000
    rec_per_node_s = r.records / max(r.batches, 1) / 5
    print(
        f"\nmeasured: {r.rate:.0f} records/s, {r.batches / r.seconds:.0f} batches/s, "
        f"web {web_ms:.1f} ms/batch, Postgres {pg_ms:.1f} ms/batch, "
        f"{rec_per_node_s:.1f} records per node-second, {node_seconds:.0f} node-seconds "
        f"stored; receipt prune {prune[0]:.0f} rows/s, Postgres {prune[1]:.1f} s per 1M "
        f"rows; load average {os.getloadavg()[0]:.1f}"
    )
    print("\nper table (measured): rows per node-second, bytes per row (heap+indexes+TOAST)")
    grown = {t: v for t, v in sizes.items() if v[0] > 0 and t in GROWING}
    per_ns = {t: rows / node_seconds for t, (rows, _) in grown.items()}
    for t, (rows, size) in sorted(grown.items(), key=lambda kv: -kv[1][1]):
        print(f"  {t:34s} {per_ns[t]:9.3f} {size / rows:8.0f}  ({rows} rows, {size} B)")
    print("per table (measured, per node, not growing with time): rows per node, bytes per row")
    nodes_now = max(sizes.get("console_node", (1, 0))[0], 1)
    for t, (rows, size) in sorted(sizes.items(), key=lambda kv: -kv[1][1]):
        if rows and t not in GROWING:
            print(f"  {t:34s} {rows / nodes_now:9.3f} {size / rows:8.0f}  ({rows} rows, {size} B)")
    print("\nprojected (linear in nodes; 1 s sampling, 5 s batches):")
    print(
        "| GPUs | nodes | records/s | batches/s | web cores | Postgres cores "
        "| rows/day (steps, samples, windows, receipts) | disk/day |"
    )
    for gpus in FLEETS:
        nodes = gpus / GPUS_PER_NODE
        batches = nodes / 5
        day = {t: per_ns[t] * nodes * 86_400 for t in per_ns}
        disk = sum(day[t] * grown[t][1] / grown[t][0] for t in day)
        rows = " / ".join(
            f"{day.get(t, 0) / 1e6:,.0f} M"
            for t in ("ingest_steprecord", "ingest_devicesample", "ingest_collectivewindow")
        )
        receipts = batches * 86_400 / 1e6
        print(
            f"| {gpus:,} | {nodes:,.0f} | {nodes * rec_per_node_s:,.0f} | {batches:,.0f} | "
            f"{batches * web_ms / 1000:.1f} | {batches * pg_ms / 1000:.1f} | {rows} / "
            f"{receipts:,.0f} M | {disk / 1e9:,.0f} GB |"
        )


def load(args: argparse.Namespace, env: dict[str, str]) -> bench.Result:
    """bench/ingest.py's steady shape over HTTP, without its COPY baseline (which would
    store every row twice)."""
    from ingest.auth import issue_token

    agents = [
        bench.Agent(i, f"size-node-{i:05d}", f"size-job-{i // bench.NODES_PER_GROUP:04d}")
        for i in range(args.nodes)
    ]
    for a in agents:
        a.token = issue_token(node_name=a.node)
    per_batch = 5 * (1 + 3 * bench.GPUS)
    batches_each = 1 + max(2, int(60_000 * args.seconds / per_batch / args.nodes) + 1)
    bench.build_batches(agents, batches_each, 5)
    return bench.run_load("gunicorn", agents, env, args.seconds, args.senders)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=800, help="simulated 8-GPU nodes")
    parser.add_argument("--senders", type=int, default=8, help="concurrent connections")
    parser.add_argument("--seconds", type=float, default=10.0, help="load time")
    parser.add_argument("--receipts", type=int, default=500_000, help="receipts to prune")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="faultline-bench-sizing-"))
    embedded = None
    try:
        embedded = start_embedded(tmp)
        bench.POSTMASTER_PID = tmp / "pg" / "postmaster.pid"
        env = {
            "DATABASE_URL": embedded.database_url or "",
            "REDIS_URL": embedded.redis_url or "",
            "FAULTLINE_SECRET_KEY": secrets.token_urlsafe(40),
            "FAULTLINE_DATA_DIR": str(tmp),
            "FAULTLINE_INGEST_RATE_PER_MIN": "100000000",
            "FAULTLINE_INGEST_RECORDS_PER_MIN": "1000000000",
        }
        bench._django(env)
        result = load(args, env)
        sizes = table_sizes()
        steps = sizes.get("ingest_steprecord", (0, 0))[0]
        node_seconds = steps / GPUS_PER_NODE
        prune = time_prune(args.receipts)
        report(sizes, node_seconds, result, prune)
    finally:
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        if embedded is not None:
            embedded.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
