"""A plain torchrun training script that knows nothing of Faultline (the zero-glue drill).

Owns a small gloo job as a user writes it: `init_process_group`, an all_reduce a step, a
pause, `destroy_process_group`. It imports nothing from Faultline: whatever Faultline
learns about it comes from `python -m agents.torchrun` and agents.launch. Its faults
come from its own flags, keyed on the generation torchrun gives it (its restart count):
`--raise-at GEN:RANK:STEP` raises a ValueError right after that step's all_reduce,
`--kill-at GEN:RANK:STEP` SIGKILLs the rank there (a crash nothing in the process can
report). Both fire while the other ranks wait in the pause, so the faulted rank is the
first to fail.

    python -m agents.torchrun --nproc-per-node 4 --max-restarts 2 \\
        -m faultline.drill.elastic_job --raise-at 0:2:2 --kill-at 1:1:2
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from datetime import timedelta


def _at(spec: str | None) -> tuple[int, int, int] | None:
    if not spec:
        return None
    gen, rank, step = (int(x) for x in spec.split(":"))
    return gen, rank, step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faultline.drill.elastic_job")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--pause-s", type=float, default=1.0)
    parser.add_argument("--raise-at", help="GEN:RANK:STEP")
    parser.add_argument("--kill-at", help="GEN:RANK:STEP")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    here = (int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), rank)
    raise_at, kill_at = _at(args.raise_at), _at(args.kill_at)
    x = torch.ones(1024)
    for step in range(1, args.steps + 1):
        dist.all_reduce(x)
        if raise_at == (*here, step):
            raise ValueError(f"rank {rank} found a malformed batch at step {step}")
        if kill_at == (*here, step):
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(args.pause_s)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
