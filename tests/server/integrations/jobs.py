"""Runs a framework job (hf_job, lightning_job) as two DDP/gloo processes whose reports a
real listener catches, and hands them to the real service: ingest, then a diagnosis pass.

No configuration is written for the job: the launcher's variables (RANK or LOCAL_RANK,
WORLD_SIZE, MASTER_*) and FAULTLINE_GROUP, as a user's launcher would set them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from agents.listener import Listener
from agents.protocol import decode_batch
from console import pipeline
from tests.conftest import make_batch

ROOT = Path(__file__).resolve().parents[3]
WORLD = 2
WAIT_S = 240


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(
    module: str,
    short_dir: Path,
    out: Path,
    *,
    group: str,
    launcher: Callable[[int], dict[str, str]],
    args: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """Both ranks to the end; every record they reported, in arrival order."""
    got: list[dict[str, Any]] = []
    lis = Listener(got.append, socket_path=short_dir / "r.sock")
    lis.start()
    port = _port()
    procs = []
    # Each rank's stderr goes to a file, not a pipe: a rank that filled its pipe while the
    # test waited on the other blocked on write, and the other in its next allreduce.
    errs = [out.parent / f"rank{rank}.stderr" for rank in range(WORLD)]
    try:
        for rank in range(WORLD):
            env = {
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "WORLD_SIZE": str(WORLD),
                "OMP_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1",  # nothing comes from a model hub
                "FAULTLINE_REPORTER_SOCKET": lis.socket_path,
                "FAULTLINE_GROUP": group,
                **launcher(rank),
            }
            cmd = [sys.executable, "-c", _BOOT, module, "--out", str(out), *args]
            with errs[rank].open("w") as err:
                procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=err))
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.1)
        if any(p.poll() is None for p in procs):
            for proc in procs:  # every thread's stack, to stderr (_BOOT), before the kill
                if proc.poll() is None:
                    proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            raise AssertionError(f"the job ran past {WAIT_S} s:\n{_tails(errs)}")
        for proc in procs:
            assert proc.returncode == 0, _tails(errs)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(
            r["kind"] == "process" and r["event"] == "exited" and r["rank"] == 0 for r in got
        ):
            time.sleep(0.05)  # rank 0's exit is its last datagram
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        lis.stop()
    return got


# Runs the job's module as `python -m` would, with faulthandler on SIGUSR1: a job that
# hangs shows where each of its threads waits.
_BOOT = (
    "import faulthandler, runpy, signal, sys; "
    "faulthandler.register(signal.SIGUSR1, all_threads=True); "
    "sys.argv = sys.argv[1:]; "
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


def _tails(errs: list[Path]) -> str:
    return "\n".join(
        f"--- rank {k} stderr (last 4000 characters):\n"
        + (e.read_text(errors="replace")[-4000:] if e.exists() else "(none)")
        for k, e in enumerate(errs)
    )


def judge(post_batch: Callable[..., Any], records: list[dict[str, Any]], group: str) -> datetime:
    """Ingest `records` as node-1's agent (checked against the contract first) and run one
    diagnosis pass as of just after the newest; returns that moment."""
    batch = make_batch([dict(r) for r in records], node="node-1")
    decode_batch(json.dumps(batch).encode())  # the contract, strictly
    response = post_batch(batch)
    assert response.status_code == 202, response.content
    newest = max(datetime.fromisoformat(r["ts"].replace("Z", "+00:00")) for r in records)
    now = newest + timedelta(seconds=2)
    pipeline.diagnose(group_name=group, now=now)
    return now
