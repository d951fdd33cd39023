"""Benchmark: diagnosis time for a 4,096-rank group with the headline fault.

Builds contract-shaped records for 4,096 ranks (512 nodes x 8 GPUs, 16 recent steps
and a 13-entry collective window per rank, Xid 79 on one GPU, every other rank blocked
in all_reduce), then times `build_snapshot` (the baseline: merely turning records into
a snapshot) and `diagnose` in the same run, and prints both and their ratio.

    python bench/diagnosis.py [--ranks 4096] [--runs 15]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from console.diagnosis import build_snapshot, diagnose

GROUP = "bench"
T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=5)


def records(ranks: int, steps: int = 16, bad: int = 133) -> list[dict[str, Any]]:
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
                    "ts": T0 - timedelta(seconds=steps - i),
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
        if rk != bad:
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    recs = records(args.ranks)
    nodes = {f"node-{n + 1:03d}": NOW for n in range((args.ranks + 7) // 8)}
    build_ms: list[float] = []
    diag_ms: list[float] = []
    result = None
    for _ in range(args.runs):
        t0 = time.perf_counter()
        snap = build_snapshot(
            group=GROUP,
            generation=1,
            state="running",
            records=recs,
            nodes=nodes,
            contract_findings=[],
            now=NOW,
        )
        t1 = time.perf_counter()
        result = diagnose(snap, NOW)
        t2 = time.perf_counter()
        build_ms.append((t1 - t0) * 1000)
        diag_ms.append((t2 - t1) * 1000)
    assert result is not None
    roots = result.root_causes
    print(
        f"records {len(recs)} findings {len(result.findings)} root_causes {len(roots)}"
        f" ({roots[0].summary if roots else '-'})"
    )
    print(
        f"ranks {args.ranks} build_snapshot_ms p50 {_pct(build_ms, 50):.1f} "
        f"p99 {_pct(build_ms, 99):.1f} (baseline)"
    )
    print(f"ranks {args.ranks} diagnose_ms p50 {_pct(diag_ms, 50):.1f} p99 {_pct(diag_ms, 99):.1f}")
    print(
        f"ratio diagnose/build_snapshot p50 "
        f"{statistics.median(diag_ms) / statistics.median(build_ms):.2f}"
    )


if __name__ == "__main__":
    main()
