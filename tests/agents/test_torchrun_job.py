"""A real torchrun job, zero glue: `python -m agents.torchrun` instead of `torchrun`.

Four gloo ranks of faultline.drill.elastic_job (a script that imports nothing of
Faultline) under TorchElastic with two restarts: generation 0's rank 2 raises, generation
1's rank 1 is SIGKILLed, generation 2 finishes. What the launcher and its workers send (a
real listener standing in for the node agent, every record checked against the contract)
must be one group, generations 0 -> 1 -> 2, the right rank named each time by torchrun and
by the diagnosis engine, and nothing blamed once generation 2 completes. The only
configuration is the launcher line; the environment names the test agent's socket, and
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 works around torch's own restart bug (docs/
integrations.md: a restarted gloo generation otherwise reads the old one's addresses).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agents.listener import Listener

from .conftest import validate
from .judging import blamed, judge, parsed

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def _torchrun(short_dir: Path, *job: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    got: list[dict[str, Any]] = []
    lis = Listener(got.append, socket_path=short_dir / "r.sock")
    lis.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.update(PYTHONPATH=str(ROOT), FAULTLINE_REPORTER_SOCKET=lis.socket_path,
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", PYTHONWARNINGS="ignore",
               OMP_NUM_THREADS="1")  # fmt: skip
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "agents.torchrun", "--nproc-per-node", "4",
             "--max-restarts", "2", "--monitor-interval", "0.1",
             "-m", "faultline.drill.elastic_job", *job],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        time.sleep(0.3)
    finally:
        lis.stop()
    validate(got)
    return proc, got


@pytest.mark.torch
@pytest.mark.slow
def test_it_follows_a_torchrun_job_through_two_restarts(short_dir: Path) -> None:
    proc, got = _torchrun(
        short_dir, "--steps", "3", "--pause-s", "1.0", "--raise-at", "0:2:2", "--kill-at", "1:1:2"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = {r["group"] for r in got}
    assert len(groups) == 1, groups
    (group,) = groups
    moves = [(r["generation"], r["to_state"]) for r in got if r["kind"] == "transition"]
    assert moves == [(0, "running"), (0, "recovering"), (1, "running"), (1, "recovering"),
                     (2, "running"), (2, "completed")]  # fmt: skip
    # torchrun's own root cause, as its ChildFailedError printed it.
    named = {r["generation"]: r for r in got if r.get("launcher_root_cause")}
    assert sorted(named) == [0, 1]
    assert (named[0]["rank"], named[0]["error_type"], named[0]["reason"]) == (
        2, "ValueError", "exception",
    )  # fmt: skip
    assert named[0]["message"] == "rank 2 found a malformed batch at step 2"
    assert (named[1]["rank"], named[1]["signal"], named[1]["reason"]) == (
        1, signal.SIGKILL, "killed",
    )  # fmt: skip
    # Workers leave their exits to the launcher: each worker exit is told once.
    exits = [(r["generation"], r["rank"]) for r in got if r.get("event") == "exited"]
    assert len(exits) == len(set(exits))
    started = {(r["generation"], r["rank"]) for r in got if r.get("event") == "started"}
    assert started == {(g, r) for g in range(3) for r in range(4)}
    # Faultline's own verdict on each generation, as of just before the next one started.
    records = parsed(got)
    restarts = [r["ts"] for r in records if r["kind"] == "transition" and
                r["to_state"] == "running" and r["generation"] > 0]  # fmt: skip
    culprits = {0: ("exception", f"rank:{group}/2"), 1: ("process_exit", f"rank:{group}/1")}
    for generation, restart in enumerate(restarts):
        found = blamed(judge(records, group, restart - timedelta(milliseconds=1)))
        assert found == {culprits[generation]}, (generation, found)
    end = records[-1]["ts"] + timedelta(seconds=30)
    assert blamed(judge(records, group, end)) == set()
