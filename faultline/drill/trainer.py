"""One rank of the drill's real PyTorch job: gloo on CPU, a small MLP, real DCP checkpoints.

Owns the training loop a drill runs and breaks: gradients are averaged with
`torch.distributed.all_reduce` (wrapped by `agents.torch`, so the console sees every
collective), steps are reported with phases, and every `--ckpt-every` steps all ranks save
with `torch.distributed.checkpoint` into `<ckpt-root>/<group>-step_NNNNNN` (faultline.json
first, COMMITTED marker last) for the node agent's watcher. Faults that must happen inside
the rank (OOM, NaN loss, a slow input phase) are triggered by `--fault` at `--fault-step`;
faults from outside (SIGKILL, SIGSTOP, corrupting a shard) are the runner's job. Each step
writes `<status-dir>/rank<r>.json` so the runner can measure lost and repeated work.
It must not talk to the service: everything goes through the reporter to the agent.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

from agents import reporter


def _write_status(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _fault_mark(args: argparse.Namespace, rank: int, step: int) -> None:
    """When the fault fired (first time only): the runner's t0 for detection time."""
    mark = args.status_dir / "fault.json"
    if not mark.exists():
        _write_status(mark, {"rank": rank, "step": step, "ts": time.time()})


def _calibrate(ms: float, work: tuple[Any, Any], torch: Any, dist: Any) -> int:
    """Matmuls that take about `ms` of this box's core, the world's largest estimate (every
    rank must do the same work: a fixed count was too little compute on a fast box for a
    halved rank to be a straggler, too much on a slow one)."""
    z, rounds = work[0], 16
    t0 = time.perf_counter()
    for _ in range(rounds):
        z = torch.tanh(z @ work[1])
    per_s = max(1e-6, (time.perf_counter() - t0) / rounds)
    n = torch.tensor([max(1, math.ceil(ms / 1000.0 / per_s))])
    if dist.get_world_size() > 1:
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
    return int(n[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faultline.drill.trainer")
    parser.add_argument("--group", required=True)
    parser.add_argument("--generation", type=int, required=True)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--ckpt-root", type=Path, required=True)
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--ckpt-until", type=int, default=0, help="no checkpoints after step N")
    parser.add_argument("--resume", type=Path, default=None, help="DCP checkpoint to load")
    parser.add_argument("--status-dir", type=Path, required=True)
    parser.add_argument(
        "--fault", default="", help="what breaks in this rank (see faultline.drill.runner.MATRIX)"
    )
    parser.add_argument("--fault-rank", type=int, default=-1)
    parser.add_argument("--fault-step", type=int, default=-1)
    parser.add_argument("--step-sleep", type=float, default=0.15)
    parser.add_argument(
        "--compute-work", type=int, default=0, help="256x256 matmuls per step's compute phase"
    )
    parser.add_argument(
        "--compute-ms",
        type=float,
        default=0.0,
        help="size --compute-work to about this many ms of this box's core (the world agrees)",
    )
    parser.add_argument("--probe-every", type=int, default=5, help="fixed-batch probe period")
    args = parser.parse_args(argv)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    reporter.init(group=args.group, generation=args.generation, rank=rank)
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from agents import torch as fl_torch

    torch.manual_seed(1234)
    torch.set_num_threads(1)  # two cores, several ranks: no intra-op thread fights
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    fl_torch.install()
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # The correctness probe: one fixed batch, the same on every rank, no gradients. Data
    # parallel ranks hold the same weights, so their answers must agree.
    probe_x = torch.randn(16, 64, generator=torch.Generator().manual_seed(99))
    probe_y = probe_x.sum(dim=1, keepdim=True) * 0.1

    def fixed_batch_loss() -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(probe_x), probe_y))

    work = None
    if args.compute_work or args.compute_ms:
        wg = torch.Generator().manual_seed(7)
        work = (torch.randn(256, 256, generator=wg), torch.randn(256, 256, generator=wg) / 16)
    if work is not None and args.compute_ms:
        args.compute_work = _calibrate(args.compute_ms, work, torch, dist)
        print(f"rank {rank}: {args.compute_work} matmuls a step (~{args.compute_ms:g} ms)")
    reporter.get().set_probe(fixed_batch_loss, every=args.probe_every, name="fixed_batch_loss")
    start = 0
    if args.resume is not None:
        state: dict[str, Any] = {"model": model.state_dict(), "step": torch.tensor(0)}
        dcp.load(state, checkpoint_id=str(args.resume))
        model.load_state_dict(state["model"])
        start = int(state["step"])
    status = args.status_dir / f"rank{rank}.json"
    # One line per step: what the runner checks the invariants and the observer cost with.
    steps_log = open(args.status_dir / f"rank{rank}.steps", "a")  # noqa: SIM115
    last_end = time.monotonic()
    faulty = rank == args.fault_rank
    batch_tokens = 32 * 64
    for step in range(start + 1, args.steps + 1):
        here = faulty and step == args.fault_step
        with fl_torch.phase("input"):
            gen = torch.Generator().manual_seed(step * 1000 + rank)
            x = torch.randn(32, 64, generator=gen)
            y = x.sum(dim=1, keepdim=True) * 0.1
            time.sleep(args.step_sleep)  # stands in for reading a real data shard
            if here and args.fault == "read_timeout":
                _fault_mark(args, rank, step)
                time.sleep(600)  # a read that never returns (a hung filesystem, say)
            if here and args.fault == "bad_sample":
                _fault_mark(args, rank, step)
                x = x[:, :63]  # a malformed record: the model cannot take it
            if here and args.fault == "clean_exit":
                _fault_mark(args, rank, step)
                sys.exit(0)  # a worker that decides it is done, mid-run
            if faulty and args.fault == "slow" and step >= args.fault_step:
                _fault_mark(args, rank, step)
                time.sleep(args.step_sleep * 4)  # a slow data loader on this rank only
        with fl_torch.phase("compute"):
            if faulty and args.fault == "nan" and step >= args.fault_step:
                _fault_mark(args, rank, step)
                x = x * float("nan")  # a poisoned sample
            if faulty and args.fault == "corrupt_weights" and step == args.fault_step:
                _fault_mark(args, rank, step)
                with torch.no_grad():  # a silent bit-rot of this rank's weights: no error
                    next(model.parameters()).add_(0.05)
            if here and args.fault == "long_kernel":
                _fault_mark(args, rank, step)
                time.sleep(600)  # a kernel that runs for minutes: the rank lives, blocked
            if work is not None:
                # Real arithmetic, the same on every rank: what a slowed device stretches.
                z = work[0]
                for _ in range(args.compute_work):
                    z = torch.tanh(z @ work[1])
            if faulty and args.fault == "oom" and step == args.fault_step:
                _fault_mark(args, rank, step)
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
        grads = []
        for p in model.parameters():
            if p.grad is None:
                raise RuntimeError("a parameter got no gradient")
            grads.append(p.grad)
        flat = torch.cat([g.reshape(-1) for g in grads])
        if here and args.fault == "raise_before_collective":
            _fault_mark(args, rank, step)
            raise RuntimeError("drill: rank failed before entering the collective")
        dist.all_reduce(flat)  # the gradient average: one collective per step, same on all
        flat /= world
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].reshape(g.shape))
            offset += n
        if here and args.fault == "raise_after_collective":
            _fault_mark(args, rank, step)
            raise RuntimeError("drill: rank failed after the collective, before its update")
        with fl_torch.phase("optimizer"):
            opt.step()
        cursor = step * batch_tokens * world
        if faulty and args.fault == "cursor_mismatch" and step >= args.fault_step:
            _fault_mark(args, rank, step)
            cursor -= 10 * batch_tokens * world  # this rank's sampler restarted behind
        began = time.monotonic()
        fl_torch.report_step(
            step,
            loss=loss.detach(),
            grad_norm=float(flat.norm()),
            tokens=batch_tokens,
            data_cursor=cursor,
        )
        ended = time.monotonic()
        rep = reporter.get()
        line = {
            "step": step,
            "ts": time.time(),
            "step_ms": round((ended - last_end) * 1000, 3),
            "report_ms": round((ended - began) * 1000, 3),
            "dropped": rep.dropped,
            "sample_seed": step * 1000 + rank,
        }
        steps_log.write(json.dumps(line) + "\n")
        steps_log.flush()
        last_end = ended
        _write_status(status, {"step": step, "pid": os.getpid(), "ts": time.time()})
        if faulty and args.fault == "hang_after_ckpt" and step == args.fault_step:
            # Stopped right after the step that carried the checkpoint phase: the silence
            # the old 30-minute checkpoint grace excused.
            _fault_mark(args, rank, step)
            os.kill(os.getpid(), signal.SIGSTOP)
        if step % args.ckpt_every == 0 and (not args.ckpt_until or step <= args.ckpt_until):
            with fl_torch.phase("checkpoint"):
                _save(args, dcp, dist, torch, model, step, rank)
    dist.destroy_process_group()
    return 0


def _save(
    args: argparse.Namespace, dcp: Any, dist: Any, torch: Any, model: Any, step: int, rank: int
) -> None:
    state = {"model": model.state_dict(), "step": torch.tensor(step)}
    commit_checkpoint(args, dcp, dist, rank, step, state)


def commit_checkpoint(
    args: argparse.Namespace,
    dcp: Any,
    dist: Any,
    rank: int,
    step: int,
    state: dict[str, Any],
    meta: dict[str, Any] | None = None,
) -> None:
    """Save `state` with DCP as the drill's checkpoint of `step`: rank 0 writes the manifest
    (`faultline.json`: identity plus `meta`) first and `COMMITTED` last, after every rank's
    shard and DCP's `.metadata` are down (the barrier). The one save path of both trainers."""
    directory = args.ckpt_root / f"{args.group}-step_{step:06d}"
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        manifest = {
            "group": args.group,
            "generation": args.generation,
            "step": step,
            "checkpoint_id": directory.name,
            **(meta or {}),
        }
        (directory / "faultline.json").write_text(json.dumps(manifest))
    dcp.save(state, checkpoint_id=str(directory))
    dist.barrier()
    if rank == 0:
        (directory / "COMMITTED").write_text("")  # every rank's shard and .metadata are down


if __name__ == "__main__":
    sys.exit(main())
