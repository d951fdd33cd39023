from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from agents.listener import Listener

from .conftest import validate

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]

RANK_SCRIPT = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    from agents import reporter, torch as fl_torch
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    reporter.init(group="tiny", generation=1, rank=rank, socket_path=os.environ["SOCK"])
    fl_torch.install()
    for step in range(1, 4):
        with fl_torch.phase("compute"):
            grad = torch.ones(1000, dtype=torch.float32) * (rank + 1)
        dist.all_reduce(grad)
        work = dist.broadcast(torch.zeros(10, dtype=torch.int64), src=0, async_op=True)
        work.wait()
        dist.barrier()
        fl_torch.report_step(step, loss=torch.tensor(float(grad[0])), tokens=128)
    dist.destroy_process_group()
""")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.torch
@pytest.mark.slow
def test_it_records_matching_collective_sequences_on_two_gloo_ranks(short_dir: Path) -> None:
    got: list[dict[str, Any]] = []
    lis = Listener(got.append, socket_path=short_dir / "r.sock")
    lis.start()
    port = _port()
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "SOCK": lis.socket_path,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK_SCRIPT],
                cwd=ROOT,
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        _, err = proc.communicate(timeout=110)
        assert proc.returncode == 0, err
    time.sleep(0.3)
    lis.stop()
    validate(got)
    steps = [r for r in got if r["kind"] == "step"]
    assert sorted((r["rank"], r["step"]) for r in steps) == [
        (0, 1),
        (0, 2),
        (0, 3),
        (1, 1),
        (1, 2),
        (1, 3),
    ]
    assert all(r["loss"] == 3.0 and "compute" in r["phases"] for r in steps)
    windows = {}
    for r in got:
        if r["kind"] == "collective":
            windows[r["rank"]] = r["entries"]  # the latest window per rank
    shape = [
        [(e["seq"], e["op"], e.get("numel"), e.get("dtype"), e["state"]) for e in w]
        for w in (windows[0], windows[1])
    ]
    assert shape[0] == shape[1]  # same order, count and dtype on both ranks
    assert shape[0][:3] == [
        (1, "all_reduce", 1000, "float32", "completed"),
        (2, "broadcast", 10, "int64", "completed"),
        (3, "barrier", None, None, "completed"),
    ]
    assert len(shape[0]) == 9
