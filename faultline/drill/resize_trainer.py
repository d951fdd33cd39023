"""One rank of the topology-change drill's job: a fixed GLOBAL batch over any world size.

Owns the training loop whose semantics survive a resize, so the drill can check them
rather than assume them: every step consumes the global samples
[cursor, cursor + GLOBAL_BATCH) (sample i is a pure function of i), rank r of W taking
the r-th of W equal slices; the loss is summed per sample and divided by GLOBAL_BATCH,
and gradients (with the loss) are SUM-reduced, so a step's update and its global loss
are the same for any W that divides GLOBAL_BATCH (data parallel: the global batch is
kept, the per-rank micro-batch is GLOBAL_BATCH / W). The data cursor is global (samples
consumed) and goes into the checkpoint twice: the DCP state and the manifest
(`faultline.json`, with the world size, global batch and a checksum of the weights that
were saved). `--resume` reads the cursor from the manifest, checks the DCP state agrees,
loads the DCP shards written by the old world into the new one and writes
`<status-dir>/restored-rank<r>.json` (the loaded weights' checksum) for the invariants.
Each step logs the sample range this rank consumed. It must not talk to the service:
everything goes through the reporter to the agent.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

from agents import reporter

GLOBAL_BATCH = 64
WIDTH = 64


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def param_sha(model: Any) -> str:
    """sha256 of the weights' bytes, in state-dict order (what must survive the resize)."""
    h = hashlib.sha256()
    for _, t in sorted(model.state_dict().items()):
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faultline.drill.resize_trainer")
    parser.add_argument("--group", required=True)
    parser.add_argument("--generation", type=int, required=True)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--ckpt-root", type=Path, required=True)
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--resume", type=Path, default=None)
    parser.add_argument("--status-dir", type=Path, required=True)
    parser.add_argument("--step-sleep", type=float, default=0.15)
    args = parser.parse_args(argv)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if GLOBAL_BATCH % world:
        print(f"error: world size {world} does not divide the global batch {GLOBAL_BATCH}")
        return 2
    reporter.init(group=args.group, generation=args.generation, rank=rank)
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from agents import torch as fl_torch

    torch.manual_seed(1234)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    fl_torch.install()
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    per_rank = GLOBAL_BATCH // world
    cursor, start = 0, 0
    if args.resume is not None:
        manifest = json.loads((args.resume / "faultline.json").read_text())
        state: dict[str, Any] = {
            "model": model.state_dict(),
            "step": torch.tensor(0),
            "cursor": torch.tensor(0),
        }
        dcp.load(state, checkpoint_id=str(args.resume))  # the old world's shards, resharded
        model.load_state_dict(state["model"])
        start, cursor = int(state["step"]), int(manifest["data_cursor"])
        _write(
            args.status_dir / f"restored-rank{rank}.json",
            {
                "checkpoint": args.resume.name,
                "manifest_cursor": cursor,
                "state_cursor": int(state["cursor"]),
                "manifest_world": manifest.get("world_size"),
                "manifest_global_batch": manifest.get("global_batch"),
                "saved_param_sha": manifest.get("param_sha"),
                "loaded_param_sha": param_sha(model),
                "world": world,
                "shards_on_disk": sorted(p.name for p in args.resume.glob("*.distcp")),
            },
        )
        if int(state["cursor"]) != cursor:
            print(f"error: manifest cursor {cursor} != checkpoint cursor {int(state['cursor'])}")
            return 3
    status = args.status_dir / f"rank{rank}.json"
    steps_log = open(args.status_dir / f"rank{rank}.steps", "a")  # noqa: SIM115
    for step in range(start + 1, args.steps + 1):
        lo = cursor + rank * per_rank
        with fl_torch.phase("input"):
            xs = [
                torch.randn(WIDTH, generator=torch.Generator().manual_seed(i))
                for i in range(lo, lo + per_rank)
            ]
            x = torch.stack(xs)
            y = x.sum(dim=1, keepdim=True) * 0.1
            time.sleep(args.step_sleep)
        with fl_torch.phase("compute"):
            loss = ((model(x) - y) ** 2).sum() / GLOBAL_BATCH  # this rank's share
            opt.zero_grad()
            loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])
        dist.all_reduce(flat)  # SUM: the global batch's gradient and loss, any world size
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].reshape(g.shape))
            offset += n
        global_loss = float(flat[-1])
        with fl_torch.phase("optimizer"):
            opt.step()
        cursor += GLOBAL_BATCH
        fl_torch.report_step(step, loss=global_loss, tokens=per_rank * WIDTH, data_cursor=cursor)
        line = {"step": step, "ts": time.time(), "samples": [lo, lo + per_rank],
                "loss": global_loss, "world": world, "cursor": cursor}  # fmt: skip
        steps_log.write(json.dumps(line) + "\n")
        steps_log.flush()
        _write(status, {"step": step, "pid": os.getpid(), "ts": time.time()})
        if step % args.ckpt_every == 0:
            with fl_torch.phase("checkpoint"):
                _save(args, dcp, dist, torch, model, step, rank, world, cursor)
    dist.destroy_process_group()
    return 0


def _save(
    args: argparse.Namespace,
    dcp: Any,
    dist: Any,
    torch: Any,
    model: Any,
    step: int,
    rank: int,
    world: int,
    cursor: int,
) -> None:
    directory = args.ckpt_root / f"{args.group}-step_{step:06d}"
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        meta = {
            "group": args.group,
            "generation": args.generation,
            "step": step,
            "checkpoint_id": directory.name,
            "data_cursor": cursor,
            "world_size": world,
            "global_batch": GLOBAL_BATCH,
            "param_sha": param_sha(model),
        }
        (directory / "faultline.json").write_text(json.dumps(meta))
    state = {
        "model": model.state_dict(),
        "step": torch.tensor(step),
        "cursor": torch.tensor(cursor),
    }
    dcp.save(state, checkpoint_id=str(directory))
    dist.barrier()
    if rank == 0:
        (directory / "COMMITTED").write_text("")


if __name__ == "__main__":
    sys.exit(main())
