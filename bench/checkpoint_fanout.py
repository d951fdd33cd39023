"""Benchmark what a fleet's agents do with one checkpoint on a shared filesystem.

`--nodes` agents' checkpoint watchers (each with its own state dir, as on its own node)
watch one root holding a torch DCP checkpoint of `--mb` MiB being written and committed.
The job runs on `--job-nodes` of them, rank 0 on the first. The baseline is the root
configured unshared (every node reports and hashes it, as before `shared`); the measured
path is `shared = true`. Both run in the same process, one after the other, and the bench
prints records sent (each one locks the group's row at ingest), bytes hashed (reads of the
shared storage) and files stat'ed per scan round, with the ratios.

    python bench/checkpoint_fanout.py [--nodes 128] [--job-nodes 32] [--mb 16]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import agents.checkpoints as ck  # noqa: E402 -- after the path setup above

SHARDS = 16


def _run(nodes: int, job_nodes: int, mb: int, shared: bool, work: Path) -> dict[str, float]:
    root = work / "fs"
    ckpt = root / "step_000100"
    ckpt.mkdir(parents=True)
    (ckpt / "faultline.json").write_text(json.dumps({"group": "llama", "generation": 3}))
    sent: list[dict[str, Any]] = []
    hashed = [0]

    class Counting(ck.CheckpointWatcher):
        def _hash(self, path: Path) -> str:
            hashed[0] += path.stat().st_size
            return super()._hash(path)

    watchers = []
    for i in range(nodes):
        w = Counting([ck.RootConfig(root, shared=shared)], sent.append, state_dir=work / f"n{i}")
        if i < job_nodes:
            for local in range(8):
                w.saw("llama", 3, i * 8 + local)
        watchers.append(w)
    stats = [0]
    real_files = ck._files

    def files(directory: Path) -> dict[str, tuple[int, int]]:
        out = real_files(directory)
        stats[0] += len(out)
        return out

    ck._files = files  # type: ignore[assignment] -- counts the files each scan lists
    shard = os.urandom(mb * 1024 * 1024 // SHARDS)
    t0 = time.perf_counter()
    try:
        for i in range(SHARDS):
            (ckpt / f"__{i}_0.distcp").write_bytes(shard)
        rounds = 0
        for step in ("staging", "written", "committed"):
            if step == "written":
                (ckpt / ".metadata").write_bytes(b"meta")
            for w in watchers:
                w.scan()
                w.drain_verification()
            rounds += 1
    finally:
        ck._files = real_files
    return {
        "records": len(sent),
        "hashed_mib": hashed[0] / 2**20,
        "stats_per_round": stats[0] / rounds,
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--job-nodes", type=int, default=32)
    parser.add_argument("--mb", type=int, default=16)
    args = parser.parse_args()
    ck.SETTLE_S = 0.0  # the job has run for a while: its other nodes follow
    out = {}
    for shared in (False, True):
        work = Path(tempfile.mkdtemp(prefix="fl-ckpt-fanout-"))
        try:
            out[shared] = _run(args.nodes, args.job_nodes, args.mb, shared, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    base, new = out[False], out[True]
    print(
        f"{args.nodes} agents on one root, the job on {args.job_nodes} of them, one "
        f"{args.mb} MiB checkpoint in {SHARDS} shards written and committed"
    )
    for key, label in (
        ("records", "records sent"),
        ("hashed_mib", "MiB hashed"),
        ("stats_per_round", "files stat'ed a scan round"),
        ("seconds", "seconds (this box)"),
    ):
        ratio = new[key] / base[key] if base[key] else float("nan")
        print(
            f"  {label:28s} unshared {base[key]:10.1f}  shared {new[key]:10.1f}  ratio {ratio:.4f}"
        )


if __name__ == "__main__":
    main()
