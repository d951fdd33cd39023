"""Benchmark: diagnosis time for a 4,096-rank group with the headline fault.

Builds contract-shaped records for 4,096 ranks (512 nodes x 8 GPUs, 16 recent steps
and a 13-entry collective window per rank, Xid 79 on one GPU, every other rank blocked
in all_reduce), then times `build_snapshot` (the baseline: merely turning records into
a snapshot) and `diagnose` in the same run, and prints both and their ratio.

It then times live passes (`LiveGroup`, as the worker runs them): one after every rank
stepped once more (every node's heartbeat moves with it), and one with nothing new half a
second later (an Xid's or a sweep's pass). Two baselines come from the same run: the
parse floor (`_step` over the tick's records alone, the least any pass that keeps steps
as records must do) and, with `--against OTHER_TREE`, the same passes on another
checkout's code, in child processes alternated round by round with this tree's.

    python bench/diagnosis.py [--ranks 4096] [--runs 15]
    python bench/diagnosis.py --ranks 16384 --runs 5 --full-runs 0 --healthy --against /tmp/old
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# `--root=TREE` imports that checkout's code (the --against child runs this way).
sys.path.insert(
    0,
    next(
        (a.split("=", 1)[1] for a in sys.argv if a.startswith("--root=")),
        str(Path(__file__).resolve().parents[1]),
    ),
)

try:
    from console import collector
except ImportError:  # a tree from before console.collector, run with --no-collector
    collector = None  # type: ignore[assignment]  # the module, absent from an old tree
from console.diagnosis import build_snapshot, diagnose
from console.diagnosis.live import LiveGroup
from console.diagnosis.snapshot import RANK_KINDS, _step

GROUP = "bench"
T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=5)


def records(
    ranks: int, steps: int = 16, bad: int = 133, healthy: bool = False
) -> list[dict[str, Any]]:
    """The headline fault (or, `healthy`, the same group with nothing wrong)."""
    rnd = random.Random(1)
    out: list[dict[str, Any]] = []
    for rk in range(ranks):
        node, idx = f"node-{rk // 8 + 1:03d}", rk % 8
        gpu = f"GPU-{rk // 8 + 1:04d}-{idx}"
        out.append(
            {
                "kind": "process",
                "ts": T0 - timedelta(minutes=1),
                "group": GROUP,
                "generation": 1,
                "rank": rk,
                "pid": rk,
                "gpu": gpu,
                "event": "started",
            }
        )
        out.append(
            {
                "kind": "device_sample",
                "ts": T0,
                "node": node,
                "gpu": gpu,
                "index": idx,
                "temp_c": 60.0,
                "power_w": 500.0,
                "sm_clock_mhz": 1980.0,
                "throttle_reasons": [],
                "ecc_dbe": 0,
                "nvlink_errors": 0,
            }
        )
        for i in range(steps):
            d = 1000.0 * (1 + rnd.uniform(-0.1, 0.1))
            out.append(
                {
                    "kind": "step",
                    "ts": (NOW if healthy else T0) - timedelta(seconds=steps - i),
                    "group": GROUP,
                    "generation": 1,
                    "rank": rk,
                    "step": 500 + i,
                    "tokens": 4096,
                    "duration_ms": d,
                    "loss": 2.0,
                    "grad_norm": 1.0,
                    "loss_scale": 65536.0,
                    "overflow": False,
                    "phases": {
                        "compute": d * 0.6,
                        "collective": d * 0.3,
                        "input": d * 0.05,
                        "checkpoint": 0.0,
                        "optimizer": d * 0.05,
                    },
                }
            )
        ents = [
            {
                "seq": 8800 + i,
                "pg": "0",
                "op": "all_reduce",
                "numel": 1 << 20,
                "dtype": "bfloat16",
                "state": "completed",
                "started_ts": T0 - timedelta(seconds=12 - i),
            }
            for i in range(12)
        ]
        if rk != bad and not healthy:
            ents.append({**ents[0], "seq": 8812, "state": "started", "started_ts": T0})
        out.append(
            {
                "kind": "collective",
                "ts": NOW,
                "group": GROUP,
                "generation": 1,
                "rank": rk,
                "entries": ents,
            }
        )
    if healthy:
        return out
    out.append(
        {
            "kind": "device_event",
            "ts": T0,
            "node": f"node-{bad // 8 + 1:03d}",
            "gpu": f"GPU-{bad // 8 + 1:04d}-{bad % 8}",
            "event": "xid",
            "code": 79,
        }
    )
    return out


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def tick(ranks: int, k: int) -> list[dict[str, Any]]:
    """The records of one more step of every rank (what a 1 s step sends per pass)."""
    d = 1000.0
    return [
        {
            "kind": "step",
            "ts": NOW + timedelta(seconds=k),
            "group": GROUP,
            "generation": 1,
            "rank": rk,
            "step": 600 + k,
            "tokens": 4096,
            "duration_ms": d,
            "loss": 2.0,
            "phases": {
                "compute": d * 0.6,
                "collective": d * 0.3,
                "input": d * 0.05,
                "checkpoint": 0.0,
                "optimizer": d * 0.05,
            },
        }
        for rk in range(ranks)
    ]


def run_size(
    ranks: int, runs: int, healthy: bool, paused: bool = True, full_runs: int | None = None
) -> dict[str, float]:
    """Full rebuild vs live state at one world size; medians in ms."""
    recs = records(ranks, healthy=healthy)
    rank_recs = [r for r in recs if r["kind"] in RANK_KINDS]
    other = [r for r in recs if r["kind"] not in RANK_KINDS]
    nodes = {f"node-{n + 1:03d}": NOW for n in range((ranks + 7) // 8)}
    kw: dict[str, Any] = {"state": "running", "nodes": nodes, "contract_findings": []}
    build_ms: list[float] = []
    diag_ms: list[float] = []
    full = None
    for _ in range(runs if full_runs is None else full_runs):
        t0 = time.process_time()
        snap = build_snapshot(group=GROUP, generation=1, records=recs, now=NOW, **kw)
        t1 = time.process_time()
        full = diagnose(snap, NOW)
        build_ms.append((t1 - t0) * 1000)
        diag_ms.append((time.process_time() - t1) * 1000)
    live = LiveGroup(group=GROUP, generation=1)
    live.apply(rank_recs)
    first = live.snapshot(records=other, now=NOW, **kw)
    if full is not None:  # --full-runs 0: the live passes only (tests prove the equality)
        assert first == build_snapshot(group=GROUP, generation=1, records=recs, now=NOW, **kw)
        assert diagnose(first, NOW, memo=live.memo) == full
    else:
        full = diagnose(first, NOW, memo=live.memo)
    # What the worker does (console.pipeline): a rebuild releases and collects once, every
    # live pass runs with the collector paused and freezes what it kept (console.collector).
    pause = collector.paused if paused and collector else contextlib.nullcontext
    if paused and collector:
        collector.release()
    # A pass after every rank stepped once more, and a pass that only an Xid triggered.
    step_ms: list[float] = []
    step_diag_ms: list[float] = []
    xid_ms: list[float] = []
    xid_diag_ms: list[float] = []
    cold_ms: list[float] = []
    floor_ms: list[float] = []
    result = None
    for k in range(1, runs + 1):
        batch = tick(ranks, k)
        now = NOW + timedelta(seconds=k)
        # Baseline: parsing the tick's step records alone, the least a pass that keeps
        # steps as records must do (measured first, on the same batch).
        t0 = time.process_time()
        [_step(r) for r in batch]
        floor_ms.append((time.process_time() - t0) * 1000)
        # Every node delivered the step: its heartbeat moves with it (a fresh dict, as the
        # worker reads it each pass).
        kw = {**kw, "nodes": dict.fromkeys(nodes, now)}
        t0 = time.process_time()
        with pause():
            live.apply(batch)
            snap = live.snapshot(records=other, now=now, **kw)
            t1 = time.process_time()
            diagnose(snap, now, memo=live.memo)
        t2 = time.process_time()  # the pause's young collection counts as the engine's
        step_ms.append((t1 - t0) * 1000)
        step_diag_ms.append((t2 - t1) * 1000)
        now += timedelta(milliseconds=500)
        kw = {**kw, "nodes": dict(kw["nodes"])}  # nothing delivered since
        t0 = time.process_time()
        with pause():
            live.apply([])
            snap = live.snapshot(records=other, now=now, **kw)
            t1 = time.process_time()
            result = diagnose(snap, now, memo=live.memo)
        t2 = time.process_time()
        xid_ms.append((t1 - t0) * 1000)
        xid_diag_ms.append((t2 - t1) * 1000)
        # Baseline: the same idle snapshot parsing every GPU's sample again (no memo) and
        # building every GPU's state again; the memos are put back afterwards, so the next
        # pass finds the GPUs' states of this one (as the worker's next pass would).
        memos = [m for m in (live.samples, getattr(live, "devices", None)) if m is not None]
        kept = [dict(m) for m in memos]  # a tree from before the devices memo has one
        for m in memos:
            m.clear()
        if hasattr(live, "_base"):
            live._base = None  # the non-rank part kept whole since 2026-12-07: not kept
        t0 = time.process_time()
        with pause():
            live.snapshot(records=other, now=now + timedelta(milliseconds=1), **kw)
        cold_ms.append((time.process_time() - t0) * 1000)
        for m, k in zip(memos, kept, strict=True):
            m.clear()
            m.update(k)
        assert live.touched == 0
    assert result is not None
    roots = result.root_causes
    print(
        f"ranks {ranks}: records {len(recs)} findings {len(full.findings)} root_causes "
        f"{len(roots)} ({roots[0].summary if roots else '-'})"
    )
    out = {
        "full_build": statistics.median(build_ms or [float("nan")]),
        "full_diag": statistics.median(diag_ms or [float("nan")]),
        "step_build": statistics.median(step_ms),
        "step_diag": statistics.median(step_diag_ms),
        "xid_build": statistics.median(xid_ms),
        "xid_diag": statistics.median(xid_diag_ms),
        "xid_cold": statistics.median(cold_ms),
        "floor": statistics.median(floor_ms),
    }
    print(
        f"ranks {ranks} full rebuild: build_snapshot p50 {out['full_build']:.1f} ms "
        f"p99 {_pct(build_ms or [0.0], 99):.1f} (baseline), diagnose p50 "
        f"{out['full_diag']:.1f} ms p99 {_pct(diag_ms or [0.0], 99):.1f}"
    )
    print(
        f"ranks {ranks} live, every rank stepped: apply+snapshot p50 {out['step_build']:.1f} ms "
        f"({ranks} records), diagnose p50 {out['step_diag']:.1f} ms; parsing the tick's "
        f"records alone {out['floor']:.1f} ms (baseline; the pass is "
        f"{(out['step_build'] + out['step_diag']) / out['floor']:.1f} of it)"
    )
    print(
        f"ranks {ranks} live, nothing per-rank changed: snapshot p50 {out['xid_build']:.1f} ms, "
        f"diagnose p50 {out['xid_diag']:.1f} ms; the same snapshot parsing every GPU's sample "
        f"again {out['xid_cold']:.1f} ms (baseline; ratio {out['xid_build'] / out['xid_cold']:.2f})"
    )
    return out


# ms of one core at 16,384 ranks: a pass, and a hang check behind it, fit beside a 1 s step
GOALS_16K = {"stepped": 300.0, "idle": 50.0}


def _child(tree: str, args: argparse.Namespace) -> dict[int, dict[str, float]]:
    """This bench run on `tree`'s code in a child process: its figures by world size."""
    cmd = [sys.executable, __file__, f"--root={tree}", "--json", "--ranks", args.ranks]
    cmd += ["--runs", str(args.runs), "--full-runs", str(args.full_runs or 0)]
    cmd += ["--healthy"] if args.healthy else []
    cmd += ["--no-collector"] if args.no_collector else []
    env = {**os.environ, "PYTHONPATH": tree}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=tree)
    got: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return {int(n): o for n, o in got.items()}


def _passes(o: dict[str, float]) -> tuple[float, float]:
    return o["step_build"] + o["step_diag"], o["xid_build"] + o["xid_diag"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="4096", help="world sizes, comma-separated")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--healthy", action="store_true", help="no fault: the steady-state pass")
    ap.add_argument(
        "--no-collector",
        action="store_true",
        help="live passes without the worker's collector policy (console.collector)",
    )
    ap.add_argument(
        "--full-runs", type=int, default=None, help="full rebuilds timed (default: --runs)"
    )
    ap.add_argument(
        "--against",
        default=None,
        help="another checkout: both trees' live passes in child processes, alternated",
    )
    ap.add_argument("--rounds", type=int, default=2, help="alternations with --against")
    ap.add_argument("--root", default=None, help=argparse.SUPPRESS)  # read at import
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a child's output
    args = ap.parse_args()
    sizes = [int(x) for x in str(args.ranks).split(",")]
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at start", flush=True)
    if args.against:
        here = str(Path(__file__).resolve().parents[1])
        mine: list[dict[int, dict[str, float]]] = []
        theirs: list[dict[int, dict[str, float]]] = []
        for _ in range(args.rounds):
            mine.append(_child(here, args))
            theirs.append(_child(str(Path(args.against).resolve()), args))
        print(f"load average {os.getloadavg()[0]:.2f} (1 min) at end")
        print("ranks   this tree: stepped / idle ms   other tree: stepped / idle ms   ratio")
        for n in sizes:
            a = [_passes(m[n]) for m in mine]
            b = [_passes(t[n]) for t in theirs]
            sa, ia = statistics.median(x for x, _ in a), statistics.median(y for _, y in a)
            sb, ib = statistics.median(x for x, _ in b), statistics.median(y for _, y in b)
            print(
                f"{n:>6}   {sa:>10.1f} / {ia:>6.1f}   {sb:>22.1f} / {ib:>6.1f}   "
                f"{sa / sb:.2f} (stepped) {ia / ib:.2f} (idle)"
            )
            _goals(n, sa, ia)
        return
    paused = not args.no_collector
    got = {n: run_size(n, args.runs, args.healthy, paused, args.full_runs) for n in sizes}
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at end")
    if args.json:
        print(json.dumps({str(n): o for n, o in got.items()}))
        return
    print("ranks   full pass ms   live pass ms (stepped)   live pass ms (idle)   ratio live/full")
    for n, o in got.items():
        full = o["full_build"] + o["full_diag"]
        step, idle = _passes(o)
        print(
            f"{n:>6}   {full:>12.1f}   {step:>22.1f}   {idle:>19.1f}   "
            f"{step / full:.2f} (stepped) {idle / full:.2f} (idle)"
        )
        _goals(n, step, idle)
    if len(sizes) > 1:
        a, b = got[sizes[0]], got[sizes[-1]]
        grow = sizes[-1] / sizes[0]
        for label, keys in (
            ("full", ("full_build", "full_diag")),
            ("live stepped", ("step_build", "step_diag")),
            ("live idle", ("xid_build", "xid_diag")),
        ):
            ratio = sum(b[k] for k in keys) / max(sum(a[k] for k in keys), 1e-9)
            print(f"growth {sizes[0]}->{sizes[-1]} ranks (x{grow:.0f}): {label} pass x{ratio:.1f}")


def _goals(ranks: int, stepped: float, idle: float) -> None:
    if ranks != 16384:
        return
    for label, value in (("stepped", stepped), ("idle", idle)):
        goal = GOALS_16K[label]
        verdict = "met" if value <= goal else "NOT met"
        print(f"goal: 16k-rank {label} pass <= {goal:.0f} ms: {value:.1f} ms, {verdict}")


if __name__ == "__main__":
    main()
