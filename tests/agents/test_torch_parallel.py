"""A real gloo job with TP, DP, MoE, FSDP, coalesced and pipeline calls, judged by the engine.

Six CPU ranks run faultline.drill.parallel_job; the reporter's records (caught by a real
listener, validated against the contract) go through `build_snapshot` and `diagnose`:
the healthy job must raise nothing, and a job whose rank 4 calls its TP all_reduce in
int32 (same bytes: gloo completes it) must be named on rank 4, pg of its TP group.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agents.listener import Listener
from console.diagnosis import build_snapshot, diagnose

from .conftest import validate

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
WORLD = 6


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(short_dir: Path, *extra: str, wait_s: float = 150) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    lis = Listener(got.append, socket_path=short_dir / "r.sock")
    lis.start()
    port = _port()
    procs = []
    try:
        for rank in range(WORLD):
            env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(WORLD),
                   "FAULTLINE_REPORTER_SOCKET": lis.socket_path}  # fmt: skip
            cmd = [sys.executable, "-m", "faultline.drill.parallel_job", "--group", "par",
                   "--generation", "1", "--tp", "3", *extra]  # fmt: skip
            procs.append(
                subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
            )
        for proc in procs:
            _, err = proc.communicate(timeout=wait_s)
            assert proc.returncode == 0, err
        time.sleep(0.3)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        lis.stop()
    validate(got)
    return got


def _judge(got: list[dict[str, Any]]):
    """Diagnose the records as of the job's last step (its clean exits left out: the
    launcher would have marked the group completed by then)."""
    now = datetime.now(UTC)
    recs = []
    for r in got:
        if r["kind"] == "process" and r["event"] == "exited":
            continue
        rec = dict(r, ts=datetime.fromisoformat(r["ts"]))
        if rec["kind"] == "collective":
            rec["entries"] = [
                {**e, "started_ts": datetime.fromisoformat(e["started_ts"])}
                if e.get("started_ts") else e
                for e in rec["entries"]
            ]  # fmt: skip
        recs.append(rec)
    snap = build_snapshot(group="par", generation=1, state="running", records=recs,
                          nodes={}, contract_findings=[], now=now)  # fmt: skip
    return snap, diagnose(snap, now + timedelta(seconds=1))


@pytest.mark.torch
@pytest.mark.slow
def test_it_judges_a_healthy_tp_dp_pp_job_healthy(short_dir: Path) -> None:
    # 12 steps, not 4: on a loaded CI box one rank descheduled once in 4 steps of a few ms
    # made its mean step over 1.25x the median (a straggler, and before the stragglers
    # rule asked a phase to explain it, an `input_stall` root cause of "0 ms vs median
    # 0 ms"). Checked under three busy loops on the two cores: 2 of 3 runs clean, one
    # an undetermined straggler.
    got = _run(short_dir, "--steps", "12")
    groups = {r["rank"]: r["groups"] for r in got if r["kind"] == "process_groups"}
    assert sorted(groups) == list(range(WORLD))
    tp_of_4 = next(g for g in groups[4] if g.get("desc") == "tp")
    assert tp_of_4["ranks"] == [3, 4, 5]
    snap, d = _judge(got)
    windows = {r.rank: r.collective for r in snap.ranks}
    ops = {e.op for w in windows.values() for e in w.entries}
    assert {"all_reduce", "all_gather_into_tensor", "all_to_all_single", "isend",
            "irecv", "reduce_scatter_tensor"} <= ops  # fmt: skip
    a2a = next(e for e in windows[1].entries if e.op == "all_to_all_single")
    assert a2a.in_splits == (16, 24, 32) and a2a.out_splits == (12, 24, 36)
    coalesced = [e for e in windows[0].entries if e.coalesced is not None and e.op == "all_reduce"]
    assert len(coalesced) >= 2 and coalesced[0].seq == coalesced[1].seq
    assert [f.kind for f in d.findings if f.kind.startswith("collective")] == []
    # No root cause on a healthy job. Six CPU ranks share this box's two cores with
    # whatever else runs: a rank the host really slowed may be an undetermined straggler
    # (the engine says it suspects host contention), never anything it blames.
    judged = [f for f in d.findings if f.role != "symptom" and f.kind != "group_stall"]
    assert [f for f in judged if (f.kind, f.role) != ("straggler", "undetermined")] == []


@pytest.mark.torch
@pytest.mark.slow
def test_it_names_the_rank_that_desynced_its_tp_group(short_dir: Path) -> None:
    got = _run(short_dir, "--fault", "dtype", "--fault-rank", "4", "--fault-step", "2")
    _, d = _judge(got)
    (m,) = [f for f in d.findings if f.kind == "collective_mismatch"]
    assert (m.subject, m.role) == ("rank:par/4", "root_cause")
    assert "dtype" in m.evidence["differs_in"] and m.evidence["rank_call"]["dtype"] == "int32"
    # Two TP-group calls per step (the TP collective, the all_to_all): step 2's first is seq 3.
    assert m.evidence["seq"] == 3
    assert m.evidence["pg_desc"] == "tp" and m.evidence["majority_ranks"] == 2
