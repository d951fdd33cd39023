"""Runs a framework job (hf_job, lightning_job) as two DDP/gloo processes whose reports a
real listener catches, and hands them to the real service: ingest, then a diagnosis pass.

No configuration is written for the job: the launcher's variables (RANK or LOCAL_RANK,
WORLD_SIZE, MASTER_*) and FAULTLINE_GROUP, as a user's launcher would set them.
"""

from __future__ import annotations

import json
import os
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
            cmd = [sys.executable, "-m", module, "--out", str(out), *args]
            procs.append(
                subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
            )
        for proc in procs:
            _, err = proc.communicate(timeout=WAIT_S)
            assert proc.returncode == 0, err[-4000:]
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
