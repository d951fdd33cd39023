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

`--layers L` makes the dense model deeper (L linear layers, a ReLU after each but the
last; default 2). `--pp P` runs it as a P-stage pipeline (world = DP x P; P divides L):
stage s holds layers [s*L/P, (s+1)*L/P); each step is one micro-batch (GPipe with one
micro-batch): each stage receives its input activations from the stage before
(`dist.recv`), sends its output to the next (`dist.send`, traced as p2p by agents.torch),
the last stage computes the loss, and the gradients travel back stage by stage. Every
stage reads the replica's slice (stage 0 the inputs, the last stage the labels).

`--experts E` makes the model a top-1 mixture of E such MLPs behind a replicated gate, and
`--ep N` splits the experts over N ranks (expert parallel, world = DP x N ... each EP rank
is also a data-parallel rank of the dense gate and reads its own slice). The dispatch is
a routing-dependent `all_to_all`, as real MoE layers do: each rank routes its own tokens,
exchanges per-expert counts (`all_to_all_single` of the counts), sends each token to the
rank that holds its expert (`all_to_all_single` with split sizes that change every step
with the routing, so the collectives rule's split-matrix check sees real uneven splits),
the expert rank runs them, and a second `all_to_all_single` (the combine, differentiable:
its backward is the reverse exchange) returns the outputs, which the token's own rank
weighs by its gate probability. The per-token losses are SUM-reduced, so the update
equals the unsplit MoE's. Gate gradients are summed over the world, an expert's over the
DP replicas that hold it.

PP and EP shards are plain tensors under the unsharded names (each rank saves the ones it
holds; DCP keeps one copy of the replicated gate), so one rank loads the whole model.
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


class _Partial:
    """A model whose ranks each hold a subset of the unsharded state dict's entries (PP
    stages, EP experts): the whole weights are the union of every rank's subset."""

    params: dict[str, Any]
    group: Any
    dist: Any

    def parameters(self) -> list[Any]:
        return list(self.params.values())

    def full_state(self) -> dict[str, Any]:
        """The whole weights (a collective over the model-parallel group)."""
        mine = {k: v.detach().clone() for k, v in self.params.items()}
        parts: list[Any] = [None] * self.dist.get_world_size(self.group)
        self.dist.all_gather_object(parts, mine, group=self.group)
        out: dict[str, Any] = {}
        for part in parts:
            out.update(part)
        return out

    def dcp_state(self, mesh: Any = None) -> dict[str, Any]:
        return {k: v.detach() for k, v in self.params.items()}


def dense(torch: Any, layers: int = 2) -> Any:
    """The unsharded dense model: `layers` Linear layers (WIDTH -> HIDDEN ... -> 1), a
    ReLU after each but the last (layers=2 is the original two-layer MLP, same weights)."""
    dims = [WIDTH] + [HIDDEN] * (layers - 1) + [1]
    mods: list[Any] = []
    for i in range(layers):
        mods.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i < layers - 1:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


class _PipelineStage(_Partial):
    """Stage `s` of `pp` of the unsharded dense Sequential: its run of consecutive Linear
    layers (state-dict names `2i.weight`/`2i.bias` for layer i)."""

    def __init__(
        self, full: Any, s: int, pp: int, rank: int, group: Any, torch: Any, dist: Any
    ) -> None:
        self.s, self.pp, self.rank = s, pp, rank
        self.group, self.torch, self.dist = group, torch, dist
        layers = sum(isinstance(m, torch.nn.Linear) for m in full)
        per = layers // pp
        self.layers = list(range(s * per, (s + 1) * per))
        self.last_layer = layers - 1
        state = full.state_dict()
        self.params = {
            f"{2 * i}.{k}": torch.nn.Parameter(state[f"{2 * i}.{k}"].detach().clone())
            for i in self.layers
            for k in ("weight", "bias")
        }

    def _run(self, h: Any) -> Any:
        for i in self.layers:
            h = h @ self.params[f"{2 * i}.weight"].T + self.params[f"{2 * i}.bias"]
            if i < self.last_layer:
                h = self.torch.relu(h)
        return h

    def forward_backward(self, x: Any, y: Any) -> Any:
        """One micro-batch through every stage; returns this stage's share of the loss
        (the last stage's: the others return 0)."""
        torch, dist = self.torch, self.dist
        first, last = self.s == 0, self.s == self.pp - 1
        inp = x
        if not first:
            inp = torch.empty(x.shape[0], HIDDEN)
            dist.recv(inp, src=self.rank - 1)
            inp.requires_grad_()
        out = self._run(inp)
        if last:
            loss = ((out - y) ** 2).sum() / GLOBAL_BATCH
            loss.backward()
        else:
            dist.send(out.detach().contiguous(), dst=self.rank + 1)
            grad = torch.empty_like(out)
            dist.recv(grad, src=self.rank + 1)
            out.backward(grad)
            loss = torch.zeros(())
        if not first:
            dist.send(inp.grad.contiguous(), dst=self.rank - 1)
        return loss.detach()


def moe(torch: Any, experts: int) -> Any:
    """The unsharded mixture: a gate Linear(WIDTH, E) and E MLPs of the dense model."""
    mlp = [
        torch.nn.Sequential(
            torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1)
        )
        for _ in range(experts)
    ]
    return torch.nn.ModuleDict(
        {"gate": torch.nn.Linear(WIDTH, experts), "experts": torch.nn.ModuleList(mlp)}
    )


class _ExpertParallelMoE(_Partial):
    """Rank `t` of `ep`'s experts (and the replicated gate) of the unsharded mixture."""

    def __init__(self, full: Any, t: int, ep: int, group: Any, torch: Any, dist: Any) -> None:
        self.t, self.ep, self.group, self.torch, self.dist = t, ep, group, torch, dist
        self.experts = len(full["experts"])
        per = self.experts // ep
        self.local = list(range(t * per, (t + 1) * per))
        self.routed: dict[int, int] = {}  # tokens each local expert took in the last step
        self.sent: list[int] = []  # tokens this rank sent to each EP rank in the last step
        mine = ("gate.", *(f"experts.{e}." for e in self.local))
        self.params = {
            n: torch.nn.Parameter(v.detach().clone())
            for n, v in full.state_dict().items()
            if n.startswith(mine)
        }

    def gate_params(self) -> list[Any]:
        return [v for k, v in self.params.items() if k.startswith("gate.")]

    def expert_params(self) -> list[Any]:
        return [v for k, v in self.params.items() if not k.startswith("gate.")]

    def forward_backward(self, x: Any, y: Any) -> Any:
        """This rank's tokens through the gate, each to the rank holding its expert and its
        output back (a routing-dependent all_to_all each way); this rank's experts run the
        tokens every rank routed to them."""
        p, torch = self.params, self.torch
        probs = torch.softmax(x @ p["gate.weight"].T + p["gate.bias"], dim=1)
        choice = probs.argmax(dim=1)  # top-1 routing
        order = torch.argsort(choice, stable=True)  # grouped by expert, so by its rank
        counts = torch.bincount(choice, minlength=self.experts)  # my tokens per expert
        per = self.experts // self.ep
        if self.ep > 1:
            # recv[j, k]: rank j's tokens for my k-th local expert
            recv = _exchange(counts, [per] * self.ep, [per] * self.ep, self.group, self.dist)
            recv = recv.reshape(self.ep, per)
            send_splits = counts.reshape(self.ep, per).sum(dim=1).tolist()
            recv_splits = recv.sum(dim=1).tolist()
            tokens = _exchange(x[order], send_splits, recv_splits, self.group, self.dist)
            self.sent = send_splits
        else:
            recv, tokens = counts.reshape(1, per), x[order]
        self.routed = {e: int(recv[:, k].sum()) for k, e in enumerate(self.local)}
        # Run the local experts over what each source sent (source-major, expert-minor).
        pieces = [p[f"experts.{self.local[0]}.2.bias"][:0].reshape(0, 1)]  # keeps a grad
        at = 0
        for j in range(recv.shape[0]):
            for k, e in enumerate(self.local):
                n = int(recv[j, k])
                if n:
                    q = f"experts.{e}."
                    h = torch.relu(tokens[at : at + n] @ p[q + "0.weight"].T + p[q + "0.bias"])
                    pieces.append(h @ p[q + "2.weight"].T + p[q + "2.bias"])
                at += n
        outs = torch.cat(pieces)
        if self.ep > 1:  # combine: the outputs go back to their tokens' ranks
            outs = _combine(outs, recv_splits, send_splits, self.group, torch, self.dist)
        back = torch.empty_like(outs)
        back[order] = outs  # the token order this rank's x had
        weighted = probs.gather(1, choice.reshape(-1, 1)) * back
        loss = ((weighted - y) ** 2).sum() / GLOBAL_BATCH
        loss.backward()
        return loss.detach()


def _exchange(t: Any, send: list[int], recv: list[int], group: Any, dist: Any) -> Any:
    """all_to_all_single of `t`'s rows: `send[j]` rows to rank j, `recv[j]` from it."""
    out = t.new_empty((sum(recv), *t.shape[1:]))
    dist.all_to_all_single(
        out, t.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group
    )
    return out


_COMBINE: list[Any] = []  # the combine's autograd function (built once, torch imported late)


def _combine(t: Any, send: list[int], recv: list[int], group: Any, torch: Any, dist: Any) -> Any:
    """The MoE combine: each token's expert output back to the rank it came from
    (`_exchange`), differentiable: backward sends the gradients the reverse way."""
    if not _COMBINE:

        class _Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, t: Any, send: Any, recv: Any, group: Any) -> Any:
                ctx.args = (send, recv, group)
                return _exchange(t, send, recv, group, dist)

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                send, recv, group = ctx.args
                return _exchange(grad, recv, send, group, dist), None, None, None

        _COMBINE.append(_Fn)
    return _COMBINE[0].apply(t, send, recv, group)


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


def _shape_error(
    world: int, tp: int, pp: int, ep: int, experts: int, layers: int = 2
) -> str | None:
    """Why this world cannot run the requested shape (None: it can)."""
    if min(tp, pp, ep) < 1 or sum(d > 1 for d in (tp, pp, ep)) > 1:
        return f"TP {tp}, PP {pp}, EP {ep}: each >= 1, at most one of them > 1"
    if layers < 2 or (layers != 2 and (tp > 1 or experts)):
        return f"--layers {layers}: >= 2, and TP and MoE split the two-layer MLP only"
    if tp > 1 and (world % tp or HIDDEN % tp):
        return f"TP {tp} must divide the world size {world} and the hidden width {HIDDEN}"
    if layers % pp or world % pp:
        return f"PP {pp}: the model has {layers} layers (PP must divide them and the world {world})"
    if ep > 1 and (not experts or experts % ep or world % ep):
        return f"EP {ep} needs --experts divisible by it and a world ({world}) divisible by it"
    dp = world // (tp * pp)  # EP ranks are DP ranks of the dense part
    if GLOBAL_BATCH % dp:
        return f"DP {dp} does not divide the global batch {GLOBAL_BATCH}"
    return None


def _depth_error(manifest: Path, experts: int, layers: int) -> str | None:
    """Why a checkpoint cannot load into this depth (before any process group forms)."""
    saved = int(json.loads(manifest.read_text()).get("layers", 2))
    if not experts and saved != layers:
        return f"the checkpoint is of a {saved}-layer model, not --layers {layers}"
    return None


def _sum(tensors: list[Any], group: Any, torch: Any, dist: Any) -> None:
    """SUM-reduce `tensors` in place in one flat all_reduce over `group` (None: alone)."""
    if group is None or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].reshape(t.shape))
        offset += n


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
    parser.add_argument("--layers", type=int, default=2, help="dense model depth (Linear layers)")
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages (dividing --layers)")
    parser.add_argument("--experts", type=int, default=0, help="MoE experts (0: dense)")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel degree")
    args = parser.parse_args(argv)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    tp, pp, ep = args.tp, args.pp, args.ep
    why = _shape_error(world, tp, pp, ep, args.experts, args.layers)
    if why is None and args.resume is not None:
        why = _depth_error(args.resume / "faultline.json", args.experts, args.layers)
    if why:
        print(f"error: {why}")
        return 2
    # The model-parallel group of a rank: the ranks that split one copy of the model
    # (consecutive ranks); its DP group: the ranks at the same place in every copy.
    mp = tp * pp * ep
    t = rank % mp
    # A TP or PP copy reads one slice per copy; EP ranks each read their own.
    dp, replica = (world, rank) if ep > 1 else (world // mp, rank // mp)
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
    full = moe(torch, args.experts) if args.experts else dense(torch, args.layers)
    # Every rank creates every group, in the same order (new_group is collective).
    world_group = dist.group.WORLD if world > 1 else None
    mp_group = dp_group = None
    if mp > 1:
        for g in range(world // mp):
            grp = dist.new_group(list(range(g * mp, (g + 1) * mp))) if mp < world else world_group
            if g == rank // mp:
                mp_group = grp
        for k in range(mp):
            grp = dist.new_group(list(range(k, world, mp))) if mp < world else None
            if k == t:
                dp_group = grp
    else:
        dp_group = world_group
    cursor, start = 0, 0
    if args.resume is not None:
        manifest = json.loads((args.resume / "faultline.json").read_text())
        # Every new rank loads the whole model (DCP reads each tensor from whichever old
        # ranks' shards hold it), then keeps its own part below: any old split onto any new.
        state: dict[str, Any] = {
            "model": full.state_dict(),
            "step": torch.tensor(0),
            "cursor": torch.tensor(0),
        }
        dcp.load(state, checkpoint_id=str(args.resume))  # the old world's shards, resharded
        full.load_state_dict(state["model"])
        start, cursor = int(state["step"]), int(manifest["data_cursor"])
        _write(
            args.status_dir / f"restored-rank{rank}.json",
            {
                "checkpoint": args.resume.name,
                "manifest_cursor": cursor,
                "state_cursor": int(state["cursor"]),
                "manifest_world": manifest.get("world_size"),
                "manifest_tp": manifest.get("tp", 1),
                "manifest_pp": manifest.get("pp", 1),
                "manifest_ep": manifest.get("ep", 1),
                "manifest_layers": manifest.get("layers", 2),
                "manifest_global_batch": manifest.get("global_batch"),
                "saved_param_sha": manifest.get("param_sha"),
                "loaded_param_sha": param_sha(full),
                "world": world,
                "shards_on_disk": sorted(p.name for p in args.resume.glob("*.distcp")),
            },
        )
        if int(state["cursor"]) != cursor:
            print(f"error: manifest cursor {cursor} != checkpoint cursor {int(state['cursor'])}")
            return 3
    model: Any = full
    if tp > 1:
        model = _TensorParallelMLP(full, t, tp, mp_group, torch, dist)
    elif pp > 1:
        model = _PipelineStage(full, t, pp, rank, mp_group, torch, dist)
    elif args.experts:
        model = _ExpertParallelMoE(full, t, ep, mp_group, torch, dist)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    per_rank = GLOBAL_BATCH // dp  # per DP replica: its TP ranks and PP stages share it
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
            opt.zero_grad()
            if hasattr(model, "forward_backward"):
                loss = model.forward_backward(x, y)
            else:
                loss = ((model(x) - y) ** 2).sum() / GLOBAL_BATCH  # this rank's share
                loss.backward()
                loss = loss.detach()
        loss = loss.reshape(1).clone()
        # SUM over the replicas: the global batch's gradient and loss, for any shape.
        if isinstance(model, _ExpertParallelMoE):
            _sum(
                [q.grad for q in model.expert_params() if q.grad is not None], dp_group, torch, dist
            )
            _sum(
                [q.grad for q in model.gate_params() if q.grad is not None] + [loss],
                world_group,
                torch,
                dist,
            )
        else:
            _sum(
                [q.grad for q in model.parameters() if q.grad is not None] + [loss],
                dp_group,
                torch,
                dist,
            )
            if pp > 1:  # only the last stage computed a loss
                _sum([loss], mp_group, torch, dist)
        global_loss = float(loss[0])
        with fl_torch.phase("optimizer"):
            opt.step()
        cursor += GLOBAL_BATCH
        fl_torch.report_step(step, loss=global_loss, tokens=per_rank * WIDTH, data_cursor=cursor)
        line = {
            "step": step,
            "ts": time.time(),
            "samples": [lo, lo + per_rank],
            "loss": global_loss,
            "world": world,
            "tp": tp,
            "pp": pp,
            "ep": ep,
            "cursor": cursor,
        }
        if isinstance(model, _ExpertParallelMoE):
            line["routed"] = model.routed  # the drill checks every expert took tokens
            line["sent"] = model.sent  # the dispatch's split sizes: routing-dependent
        steps_log.write(json.dumps(line) + "\n")
        steps_log.flush()
        _write(status, {"step": step, "pid": os.getpid(), "ts": time.time()})
        if step % args.ckpt_every == 0:
            with fl_torch.phase("checkpoint"):
                _save(args, dcp, dist, torch, model, step, rank, world, (tp, pp, ep), cursor)
    # Every rank leaves together: a rank that exits while a peer's last gloo send to it
    # is still in flight can make the peer abort (SIGABRT) instead of finishing cleanly.
    dist.barrier()
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
    shape: tuple[int, int, int],
    cursor: int,
) -> None:
    tp, pp, ep = shape
    if not hasattr(model, "full_state"):
        weights, sha = model.state_dict(), param_sha(model)
    else:
        whole = model.full_state()  # a collective: every rank gathers the whole weights
        sha = _sha(whole)
        weights = model.dcp_state(_mesh(world, tp) if tp > 1 else None)
    meta = {
        "data_cursor": cursor,
        "world_size": world,
        "tp": tp,
        "pp": pp,
        "ep": ep,
        "dp": world // (tp * pp),
        "experts": args.experts,
        "layers": args.layers,
        "global_batch": GLOBAL_BATCH,
        "param_sha": sha,
    }
    state = {"model": weights, "step": torch.tensor(step), "cursor": torch.tensor(cursor)}
    commit_checkpoint(args, dcp, dist, rank, step, state, meta)


if __name__ == "__main__":
    sys.exit(main())
