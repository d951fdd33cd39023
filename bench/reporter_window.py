"""Benchmark the per-step cost of reporting a rank's collective window; prints a ratio.

Each "step" appends one completed entry to a 256-entry window (as a 1-collective-per-step
trainer does) and reports the window: the baseline copies and encodes every entry
(`Reporter.collective`, the pre-issue-23 path), the measured path encodes only new or
changed entries (`agents.torch.Recorder._fragments` + `Reporter.collective_encoded`). Both
send to a Unix datagram socket drained by a thread, interleaved, in the same run. No torch.

    python bench/reporter_window.py [--steps 3000] [--window 256]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.reporter import Reporter, iso_ts  # noqa: E402 -- after the path setup above
from agents.torch import Recorder  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--window", type=int, default=256)
    args = parser.parse_args()
    path = os.path.join(tempfile.mkdtemp(prefix="fl-bench-"), "r.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(path)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    threading.Thread(target=lambda: [srv.recv(1 << 17) for _ in iter(int, 1)], daemon=True).start()
    rep = Reporter(socket_path=path, group="bench", generation=1, rank=0)
    rec = Recorder(rep, window=args.window)
    full: list[float] = []
    cached: list[float] = []
    for step in range(args.steps):
        rec.entries.append(
            {
                "seq": step,
                "pg": "default",
                "op": "all_reduce",
                "state": "completed",
                "started_ts": iso_ts(),
                "numel": 2113,
                "dtype": "float32",
                "step_id": f"g1:s{step}",
            }
        )
        began = time.perf_counter()
        rep.collective([dict(e) for e in rec.entries])
        mid = time.perf_counter()
        rep.collective_encoded(rec._fragments())
        end = time.perf_counter()
        if step >= args.window:  # a full window
            full.append((mid - began) * 1e6)
            cached.append((end - mid) * 1e6)
    base, mine = statistics.median(full), statistics.median(cached)
    print(f"window {args.window} entries, {len(full)} steps; sent={rep.sent} dropped={rep.dropped}")
    print(f"  copy + encode every entry (baseline) {base:8.1f} us/step median")
    print(f"  encode new/changed entries only      {mine:8.1f} us/step median")
    print(f"  ratio {mine / base:.2f}")


if __name__ == "__main__":
    main()
