"""One rank of a real TP x DP x PP-shaped PyTorch job (gloo on CPU) for collective drills.

Owns a training-shaped loop over real process groups: tensor-parallel subgroups
(`new_subgroups`), data-parallel groups (`new_group`), per step a TP collective whose op
differs between TP groups, an all_to_all with uneven splits (MoE dispatch) in the TP
group, FSDP-style all_gather_into_tensor / reduce_scatter_tensor and a coalesced
all_reduce in the DP group, and a pipeline exchange with `batch_isend_irecv` between the
two halves of the world. Every call goes through `agents.torch`, so the agent's records
are what the console judges. `--fault dtype` makes `--fault-rank` call its TP collective
in int32 at `--fault-step` (same bytes, so gloo completes it: silent corruption, which
only the call record shows); `--fault stall` makes that rank stop before its TP
collective (a rank that never entered). It must not talk to the service: everything goes
through the reporter to the agent. World size must be a multiple of `--tp` (>= 2 groups).

    RANK=0 WORLD_SIZE=6 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
        python -m faultline.drill.parallel_job --group par --generation 1 --tp 3
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from datetime import timedelta

from agents import reporter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faultline.drill.parallel_job")
    parser.add_argument("--group", required=True)
    parser.add_argument("--generation", type=int, required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tp", type=int, default=3)
    parser.add_argument("--fault", default="", help="dtype | stall (in --fault-rank)")
    parser.add_argument("--fault-rank", type=int, default=-1)
    parser.add_argument("--fault-step", type=int, default=-1)
    parser.add_argument("--stall-s", type=float, default=30.0)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args(argv)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    reporter.init(group=args.group, generation=args.generation, rank=rank)
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch
    import torch.distributed as dist

    from agents import torch as fl_torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    fl_torch.install()
    tp_size = args.tp
    tp_group, _ = dist.new_subgroups(group_size=tp_size, group_desc="tp")
    dp_groups = [
        dist.new_group(list(range(i, world, tp_size)), group_desc="dp") for i in range(tp_size)
    ]
    dp_group = dp_groups[rank % tp_size]
    tp_index = rank // tp_size  # which TP group: the "pipeline stage" too
    dp_size = world // tp_size
    peer = (rank + tp_size) % world  # the same TP position in the other stage
    for step in range(1, args.steps + 1):
        with fl_torch.phase("compute"):
            x = torch.ones(600, dtype=torch.float32) * (rank + 1)
        faulty = rank == args.fault_rank and step == args.fault_step
        if faulty and args.fault == "stall":
            time.sleep(args.stall_s)
        # TP: the two TP groups run different collectives at the same seq (healthy).
        dtype = torch.int32 if faulty and args.fault == "dtype" else torch.float32
        if tp_index % 2 == 0:
            dist.all_reduce(x.to(dtype), group=tp_group)
        else:
            out = torch.empty(600 * tp_size, dtype=dtype)
            dist.all_gather_into_tensor(out, x.to(dtype), group=tp_group)
        # MoE dispatch: uneven splits, what i sends to j is what j expects from i.
        me = rank % tp_size
        send = [(me + 1) * (j + 2) for j in range(tp_size)]
        recv = [(i + 1) * (me + 2) for i in range(tp_size)]
        a2a_out = torch.empty(sum(recv), 4)
        dist.all_to_all_single(a2a_out, torch.ones(sum(send), 4), recv, send, group=tp_group)
        # FSDP: gather the shard, scatter the gradient.
        full = torch.empty(256 * dp_size)
        dist.all_gather_into_tensor(full, torch.ones(256), group=dp_group)
        shard = torch.empty(256)
        dist.reduce_scatter_tensor(shard, torch.ones(256 * dp_size), group=dp_group)
        # Coalesced gradient buckets.
        with dist._coalescing_manager(group=dp_group, async_ops=True) as cm:
            dist.all_reduce(torch.ones(32), group=dp_group)
            dist.all_reduce(torch.ones(64), group=dp_group)
        cm.wait()
        # Pipeline: activations one way, gradients the other, in one batch.
        ops = [
            dist.P2POp(dist.isend, torch.ones(128), peer),
            dist.P2POp(dist.irecv, torch.empty(128), peer),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        fl_torch.report_step(step, loss=float(x[0]), tokens=600)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
