"""Benchmark: the fleet page at 2,048 nodes / 16,384 GPUs, this code against another tree.

Writes the fleet `bench/console.py` writes (2,048 nodes x 8 GPUs, one 16,384-rank group
with an open incident, one step per rank) and makes it a little sick, as a real one is:
1 % of the nodes with a GPU at warning or critical, a few quarantined, cordoned, out of
service or flagged for replacement. Then it times GET / (the page) and
GET /api/v1/pages/fleet/ (its JSON twin, which every open fleet page refetches on an
incident change) with the Django test client, in a fresh process per tree, alternating
the trees round by round so both see the same load:

    python bench/fleet_page.py --against /tmp/old [--rounds 3] [--runs 20]

For each tree and round: p50 and p95 of the page's server time (goal: both <= 300 ms),
the page data's share (`console.api.pages.fleet_data`, queries included), the SQL time
(the sum of the page's queries, as Django measures them), the rest (template, middleware)
as page minus data, the web process's and Postgres's CPU per request, and the body size
raw and gzipped. `--against` is any checkout of this repository (e.g.
`git worktree add /tmp/old <commit>`); without it only this tree runs. The database is a
throwaway embedded one unless DATABASE_URL/REDIS_URL are set. Connections are pooled, as
the service runs (FAULTLINE_DB_POOL defaults on).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_ROOT = Path(os.environ.get("FLEET_BENCH_TREE") or _HERE.parent).resolve()
# Run as a script, this file's folder comes first on sys.path and its name would shadow
# the `console` app: put the tree under test there instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_ROOT))

NODES, GPUS = 2048, 8


def _sicken(nodes: int) -> dict[str, int]:
    """Make 1 % of the nodes sick in the ways the page shows; deterministic."""
    from bench.console import T0
    from console.models import Device, Node

    names = [f"bench-{i:04d}" for i in range(nodes)]
    Node.objects.filter(name__in=names).update(
        health="ok",
        quarantined=False,
        cordoned=False,
        lifecycle="healthy",
        lifecycle_reason="",
        lifecycle_since=None,
        taken_out_by="",
        replace_flagged=False,
    )
    sample = {"temp_c": 61.0, "power_w": 540.0, "util_pct": 97.0, "throttle_reasons": []}
    Device.objects.filter(node__name__in=names).update(health="ok", last_sample=sample)
    step = max(nodes // 20, 1)  # ~1 % of the fleet in each sickness below, spread out
    warn = names[3 :: step * 2]
    crit = names[7 :: step * 2]
    Device.objects.filter(node__name__in=warn, index=1).update(health="warning")
    Device.objects.filter(node__name__in=crit, index=5).update(
        health="critical",
        last_sample={},  # a GPU that stopped reporting its sample
    )
    out = names[11 :: step * 4]
    Node.objects.filter(name__in=out).update(
        lifecycle="out_of_service",
        lifecycle_reason='Xid 79: fell off the bus <& "gone">',
        lifecycle_since=T0,
        taken_out_by="faultline",
    )
    quarantined, cordoned = names[13 :: step * 8], names[17 :: step * 8]
    Node.objects.filter(name__in=quarantined).update(quarantined=True)
    Node.objects.filter(name__in=cordoned).update(cordoned=True)
    Node.objects.filter(name__in=out[::2]).update(replace_flagged=True)
    return {
        "warning": len(warn),
        "critical": len(crit),
        "out_of_service": len(out),
        "quarantined": len(quarantined),
        "cordoned": len(cordoned),
    }


def _pg_cpu_s(pid: int) -> float:
    """CPU seconds of the postmaster and every backend it has reaped or still runs."""
    tick = os.sysconf("SC_CLK_TCK")

    def stat(p: int) -> list[str]:
        text = Path(f"/proc/{p}/stat").read_text()
        return text[text.rindex(")") + 2 :].split()

    master = stat(pid)  # fields from state (3rd) on: utime 14th -> index 11
    total = sum(int(v) for v in master[11:15])  # utime, stime, cutime, cstime
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = stat(int(entry.name))
            except (OSError, ValueError):
                continue
            if int(fields[1]) == pid:
                total += int(fields[11]) + int(fields[12])
    return total / tick


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def child(runs: int) -> dict[str, Any]:
    """Time this tree's fleet page and its JSON twin; one JSON line on stdout."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from console.api import pages

    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(User.objects.get(username="bench"))
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        backend = cur.fetchone()[0]
    postmaster = int(Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1])
    out: dict[str, Any] = {}
    for label, url in [("page", "/"), ("json", "/api/v1/pages/fleet/")]:
        for _ in range(3):  # warm: templates compiled, pool filled, caches hot
            client.get(url)
        wall, sql, cpu = [], [], []
        pg0, size = _pg_cpu_s(postmaster), 0
        body = b""
        for _ in range(runs):
            with CaptureQueriesContext(connection) as queries:
                started, cpu0 = time.perf_counter(), time.process_time()
                response = client.get(url)
                wall.append((time.perf_counter() - started) * 1000)
                cpu.append((time.process_time() - cpu0) * 1000)
            assert response.status_code == 200, (url, response.status_code)
            sql.append(sum(float(q["time"]) for q in queries.captured_queries) * 1000)
            body = response.content
            size = len(body)
        pg_ms = (_pg_cpu_s(postmaster) - pg0) * 1000 / runs
        out[label] = {
            "p50": statistics.median(wall),
            "p95": _pct(wall, 0.95),
            "sql": statistics.median(sql),
            "cpu": statistics.median(cpu),
            "pg_cpu": pg_ms,
            "bytes": size,
            "gzip": len(gzip.compress(body, 6)),
        }
    data_ms = []
    for _ in range(runs):
        started = time.perf_counter()
        pages.fleet_data()
        data_ms.append((time.perf_counter() - started) * 1000)
    out["page"]["data"] = statistics.median(data_ms)
    return out


def _run_child(tree: Path, runs: int) -> dict[str, Any]:
    env = {**os.environ, "FLEET_BENCH_TREE": str(tree), "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", "--runs", str(runs)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: child failed\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _print(tree: str, rnd: int, r: dict[str, Any]) -> None:
    p, j = r["page"], r["json"]
    print(
        f"{tree:<6} {rnd:>5} {p['p50']:7.1f} {p['p95']:7.1f} {p['data']:7.1f} {p['sql']:7.1f} "
        f"{p['p50'] - p['data']:7.1f} {p['cpu']:7.1f} {p['pg_cpu']:7.1f} "
        f"{p['bytes'] / 1024:7.1f} {p['gzip'] / 1024:6.1f} | {j['p50']:7.1f} {j['p95']:7.1f} "
        f"{j['cpu']:6.1f} {j['pg_cpu']:6.1f} {j['bytes'] / 1024:7.1f}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another checkout to time first")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-build", action="store_true", help="reuse the bench fleet")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "faultline.settings")
    if args.child:
        import django

        django.setup()
        print(json.dumps(child(args.runs)))
        return
    from bench.console import _setup, build  # the same fleet as the console bench

    os.environ.setdefault("FAULTLINE_DB_POOL", "1")
    embedded = _setup()
    try:
        from django.contrib.auth.models import User

        from console.actions import create_user

        if not args.no_build:
            started = time.perf_counter()
            build(args.nodes * GPUS, 1)
            sick = _sicken(args.nodes)
            print(
                f"built {args.nodes} nodes x {GPUS} GPUs in "
                f"{time.perf_counter() - started:.1f} s; sick nodes: {sick}"
            )
        if not User.objects.filter(username="bench").exists():
            create_user(actor="bench", username="bench", role="viewer", password="bench-pass-123")  # noqa: S106
        trees = [("this", _ROOT)] + ([("old", args.against.resolve())] if args.against else [])
        print(f"trees: {', '.join(f'{n}={t}' for n, t in trees)}; {args.runs} requests each")
        print(
            "                ------------------ page GET / (ms, KiB) ----------------"
            "---- | ------- JSON twin --------"
        )
        print(
            "tree   round     p50     p95    data     sql    rest     cpu  pg cpu"
            "    size   gzip |     p50     p95    cpu pg cpu    size"
        )
        results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
        for rnd in range(1, args.rounds + 1):
            order = trees if rnd % 2 else trees[::-1]
            for name, tree in order:
                r = _run_child(tree, args.runs)
                results[name].append(r)
                _print(name, rnd, r)
        if args.against:
            for key in ("p50", "p95"):
                ratios = [
                    new["page"][key] / old["page"][key]
                    for new, old in zip(results["this"], results["old"], strict=True)
                ]
                print(f"page {key} this/old per round: " + ", ".join(f"{x:.2f}" for x in ratios))
    finally:
        if embedded is not None:
            embedded.stop()


if __name__ == "__main__":
    main()
