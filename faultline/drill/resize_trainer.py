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

`--tp T` runs the same model tensor-parallel (world = DP x T, Megatron's MLP split): the
first linear layer column-parallel (rank t holds output features [t*H/T, (t+1)*H/T) and
their biases), the ReLU local, the second linear layer row-parallel (its matching input
columns), the partial outputs SUM-reduced across the TP group (backward: identity) and the
output bias replicated. The TP ranks of a DP replica consume the same slice of the global
batch; gradients are SUM-reduced across the DP replicas of each TP shard. The shards go
into the checkpoint as DTensors, so a world of another shape (TP 2 -> 1) loads them
resharded by DCP; the manifest's checksum is of the whole (gathered) weights, in the
unsharded model's state-dict names, so the same check holds for any TP.
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
from faultline.drill.trainer import commit_checkpoint

GLOBAL_BATCH = 64
WIDTH = 64
HIDDEN = 64


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def param_sha(model: Any) -> str:
    """sha256 of the weights' bytes, in state-dict order (what must survive the resize)."""
    return _sha(model.state_dict())


def _sha(state: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for _, t in sorted(state.items()):
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


class _TensorParallelMLP:
    """Rank `t` of `tp`'s shards of the unsharded `Sequential(Linear, ReLU, Linear)`."""

    # name in the unsharded state dict -> the dimension it is split on (None: replicated)
    SPLIT = {"0.weight": 0, "0.bias": 0, "2.weight": 1, "2.bias": None}

    def __init__(self, full: Any, t: int, tp: int, group: Any, torch: Any, dist: Any) -> None:
        self.t, self.tp, self.group, self.torch, self.dist = t, tp, group, torch, dist
        state = full.state_dict()
        self.params: dict[str, Any] = {}
        for name, dim in self.SPLIT.items():
            whole = state[name].detach()
            part = whole if dim is None else whole.chunk(tp, dim)[t]
            self.params[name] = torch.nn.Parameter(part.clone().contiguous())

    def parameters(self) -> list[Any]:
        return list(self.params.values())

    def __call__(self, x: Any) -> Any:
        p, torch = self.params, self.torch
        h = torch.relu(x @ p["0.weight"].T + p["0.bias"])  # column-parallel: local
        partial = h @ p["2.weight"].T  # row-parallel: this shard's share of the output
        return _all_reduce_sum(partial, self.group, torch, self.dist) + p["2.bias"]

    def full_state(self) -> dict[str, Any]:
        """The whole weights (a collective: every TP rank must call it)."""
        out = {}
        for name, dim in self.SPLIT.items():
            local = self.params[name].detach()
            if dim is None:
                out[name] = local.clone()
                continue
            parts = [self.torch.empty_like(local) for _ in range(self.tp)]
            self.dist.all_gather(parts, local.contiguous(), group=self.group)
            out[name] = self.torch.cat(parts, dim)
        return out

    def dcp_state(self, mesh: Any) -> dict[str, Any]:
        """The shards as DTensors over the TP mesh, so DCP saves each rank's slice."""
        from torch.distributed.tensor import DTensor, Replicate, Shard

        return {
            name: DTensor.from_local(
                self.params[name].detach(), mesh, [Replicate() if dim is None else Shard(dim)]
            )
            for name, dim in self.SPLIT.items()
        }


_MESH: list[Any] = []  # the TP mesh, built once (building one creates process groups)


def _mesh(world: int, tp: int) -> Any:
    """This rank's TP sub-mesh of the (dp, tp) device mesh."""
    if not _MESH:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
        _MESH.append(mesh["tp"])
    return _MESH[0]


_SUM: dict[Any, Any] = {}  # TP group -> its autograd function (built once, torch imported late)


def _all_reduce_sum(x: Any, group: Any, torch: Any, dist: Any) -> Any:
    """Megatron's `g`: SUM across the TP group forward, identity backward."""
    fn = _SUM.get(group)
    if fn is None:

        class _Sum(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, t: Any) -> Any:
                out = t.clone()
                dist.all_reduce(out, group=group)
                return out

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                return grad

        fn = _SUM[group] = _Sum
    return fn.apply(x)


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
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    args = parser.parse_args(argv)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    tp = args.tp
    if tp < 1 or world % tp or HIDDEN % tp:
        print(f"error: TP {tp} must divide the world size {world} and the hidden width {HIDDEN}")
        return 2
    dp, t, replica = world // tp, rank % tp, rank // tp
    if GLOBAL_BATCH % dp:
        print(f"error: DP {dp} does not divide the global batch {GLOBAL_BATCH}")
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
    full = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1)
    )
    # Process groups: the TP group of this rank (same replica) and the DP group of its shard
    # (same t). Every rank creates every group, in the same order (new_group is collective).
    tp_group = dp_group = None
    if tp > 1:
        for g in range(dp):
            ranks = list(range(g * tp, (g + 1) * tp))
            grp = dist.new_group(ranks) if dp > 1 else dist.group.WORLD
            if g == replica:
                tp_group = grp
        for k in range(tp):
            ranks = list(range(k, world, tp))
            grp = dist.new_group(ranks) if tp < world else None
            if k == t:
                dp_group = grp
    model: Any = full if tp == 1 else _TensorParallelMLP(full, t, tp, tp_group, torch, dist)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    per_rank = GLOBAL_BATCH // dp  # per DP replica: its TP ranks share the slice
    cursor, start = 0, 0
    if args.resume is not None:
        manifest = json.loads((args.resume / "faultline.json").read_text())
        if tp > 1:
            raise SystemExit("error: --resume restores onto TP 1 only (the drill's new world)")
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
                "manifest_tp": manifest.get("tp", 1),
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
        lo = cursor + replica * per_rank
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
        if dp > 1:  # SUM over the replicas: the global batch's gradient and loss, any DP
            dist.all_reduce(flat, group=dp_group)
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
                "loss": global_loss, "world": world, "tp": tp, "cursor": cursor}  # fmt: skip
        steps_log.write(json.dumps(line) + "\n")
        steps_log.flush()
        _write(status, {"step": step, "pid": os.getpid(), "ts": time.time()})
        if step % args.ckpt_every == 0:
            with fl_torch.phase("checkpoint"):
                _save(args, dcp, dist, torch, model, step, rank, world, tp, cursor)
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
    tp: int,
    cursor: int,
) -> None:
    if tp == 1:
        weights, sha = model.state_dict(), param_sha(model)
    else:
        whole = model.full_state()  # a collective: every rank gathers the whole weights
        sha = _sha(whole)
        weights = model.dcp_state(_mesh(world, tp))
    meta = {"data_cursor": cursor, "world_size": world, "tp": tp, "dp": world // tp,
            "global_batch": GLOBAL_BATCH, "param_sha": sha}  # fmt: skip
    state = {"model": weights, "step": torch.tensor(step), "cursor": torch.tensor(cursor)}
    commit_checkpoint(args, dcp, dist, rank, step, state, meta)


if __name__ == "__main__":
    sys.exit(main())
