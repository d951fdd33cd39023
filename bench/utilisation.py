"""Benchmark: what MFU, HFU, HBM and network utilisation add to a diagnosis pass.

Builds bench/diagnosis.py's healthy group (16 recent steps per rank) with FLOPs on every
step and an H100 name on every GPU sample, then times `console.diagnosis.utilisation` in
process CPU time (min and median of --runs): a stepped pass (every rank's figure computed),
a pass whose per-rank memo hits (a sample or port changed, no rank did), and the engine's
pass in which nothing changed (reused whole).

    python bench/utilisation.py [--ranks 4096,16384] [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import diagnosis as base  # bench/diagnosis.py: the same group

from console.diagnosis import build_snapshot, engine
from console.diagnosis.config import DiagnosisConfig
from console.diagnosis.rules.base import Context
from console.diagnosis.utilisation import utilisation


def cpu_ms(fn: Callable[[], Any], runs: int) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        began = time.process_time()
        fn()
        times.append((time.process_time() - began) * 1000)
    return min(times), statistics.median(times)


def run(ranks: int, runs: int) -> None:
    records = base.records(ranks, healthy=True)
    for rec in records:
        if rec["kind"] == "step":
            rec["model_flops"] = 4e14
        elif rec["kind"] == "device_sample":
            rec["name"] = "NVIDIA H100 80GB HBM3"
    snap = build_snapshot(
        group=base.GROUP,
        generation=1,
        state="running",
        records=records,
        nodes={},
        contract_findings=[],
        now=base.NOW,
    )
    steps = {r.rank: r.current_steps for r in snap.ranks}  # as the engine indexes them
    memo: dict[int, Any] = {}

    def per_rank(name: str, r: Any, compute: Callable[[], Any]) -> Any:
        hit = memo.get(r.rank)
        if hit is not None and hit[0] is r:
            return hit[1]
        memo[r.rank] = (r, compute())
        return memo[r.rank][1]

    def stepped() -> None:
        utilisation(snap, base.NOW, steps=lambda r: steps[r.rank])

    def memo_hits() -> None:
        utilisation(snap, base.NOW, steps=lambda r: steps[r.rank], per_rank=per_rank)

    memo_hits()
    shared: dict[str, Any] = {}
    engine._utilisation(Context(snap, base.NOW, DiagnosisConfig(), shared), base.NOW)

    for label, fn in (("stepped", stepped), ("rank memo hits", memo_hits)):
        lo, mid = cpu_ms(fn, runs)
        print(f"{ranks:>6} ranks  {label:<28} min {lo:7.1f}  median {mid:7.1f} ms CPU")
    times = []
    for _ in range(runs):
        ctx = Context(snap, base.NOW, DiagnosisConfig(), shared)  # the engine's, untimed
        began = time.process_time()
        engine._utilisation(ctx, base.NOW)
        times.append((time.process_time() - began) * 1000)
    label = "nothing changed (engine)"
    print(
        f"{ranks:>6} ranks  {label:<28} min {min(times):7.2f}  median "
        f"{statistics.median(times):7.2f} ms CPU"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="4096,16384")
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    for n in str(args.ranks).split(","):
        run(int(n), args.runs)


if __name__ == "__main__":
    main()
