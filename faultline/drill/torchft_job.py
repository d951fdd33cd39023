"""A plain TorchFT training script (one replica group) that knows nothing of Faultline.

Owns a replica group's loop as TorchFT's own examples write it: a `Manager` over a gloo
`ProcessGroupGloo`, torchft's `DistributedDataParallel` and `OptimizerWrapper` around a
tiny linear model, one step per `optimizer.step()`. Whatever Faultline learns comes from
`python -m agents.torchrun` (agents.launch arms agents.integrations.torchft when the script
imports torchft). `--kill-at GEN:N` SIGKILLs this replica group's rank 0 in generation
GEN (torchrun's restart count) after the N-th step it committed together with
`--replicas` replica groups: the replica drops out, torchrun restarts it, it heals from a
peer and rejoins. `--rejoin-delay-s S`: a restarted replica group starts S seconds late (a
slow node, a long data-loader start), so its peers train on without it first.
`--warmup-s S`: a restarted replica group's first step takes S seconds more once in its
quorum (a compile, cold caches), which its peers wait out in that quorum's first
allreduce. It trains until `--stop-file` exists (or `--max-steps`), so a peer can
see the whole drop and rejoin.

    TORCHFT_LIGHTHOUSE=http://localhost:29510 python -m agents.torchrun --nproc-per-node 1 \\
        --max-restarts 1 -m faultline.drill.torchft_job --replica-id 1 --kill-at 0:3
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from datetime import timedelta
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faultline.drill.torchft_job")
    parser.add_argument("--replica-id", required=True)
    parser.add_argument("--pause-s", type=float, default=0.2)
    parser.add_argument("--max-steps", type=int, default=10_000)
    parser.add_argument("--stop-file", type=Path)
    parser.add_argument("--kill-at", help="GEN:N")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--warmup-s", type=float, default=0.0)
    parser.add_argument("--rejoin-delay-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if generation > 0:
        time.sleep(args.rejoin_delay_s)

    import torch
    from torch import nn, optim
    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo
    from torchft.optim import OptimizerWrapper

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    inner = optim.SGD(model.parameters(), lr=0.01)

    def load_state_dict(state: dict) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"rg{args.replica_id}",
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=60),
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = OptimizerWrapper(manager, inner)
    kill = tuple(int(x) for x in args.kill_at.split(":")) if args.kill_at else None
    together = 0  # steps committed with every replica group participating
    warmup = args.warmup_s if generation > 0 else 0.0
    while manager.current_step() < args.max_steps:
        if args.stop_file is not None and args.stop_file.exists():
            break
        optimizer.zero_grad()  # starts the quorum
        if warmup:
            # Once in the quorum (as a compile in the first forward would be): its peers
            # wait for this step in the quorum's first allreduce.
            manager.wait_quorum()
            time.sleep(warmup)
            warmup = 0.0
        loss = ddp(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        together += manager.num_participants() >= args.replicas
        if kill == (generation, together) and os.environ.get("RANK") == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(args.pause_s)
    manager.shutdown(wait=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
