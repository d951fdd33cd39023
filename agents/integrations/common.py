"""What every framework integration does, whatever the framework: one training run's reports.

Owns the run's reporter (initialised with the framework's rank and the local GPU), the
step clock (input, compute and optimizer phases from the hook times; checkpoint time from
the save it measured), the step's tokens, loss and FLOPs from the micro-batches it saw,
checkpoint records for what a save wrote (agents.checkpoints' listing, then hashed in a
background thread at a bounded rate), and the run's transitions. The framework modules
only translate their hooks into these calls. Never raises into the training loop and
imports torch only inside the calls that need a tensor or a module.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agents import flops, reporter
from agents.checkpoints import check_shards, hash_file, manifest_of

log = logging.getLogger("faultline.integrations")

_NAME = re.compile(r"[^A-Za-z0-9_.:@/\-]+")
HASH_RATE_BYTES = 200 * 1024 * 1024  # per second: the trainer's own I/O comes first
# A checkpoint's files count as written once two listings this far apart agree.
SETTLE_S = 1.0
SETTLE_MAX_S = 60.0


def name(text: str) -> str:
    """`text` in the contract's name alphabet (a group or checkpoint id), at most 128."""
    return _NAME.sub("_", text).strip("_")[:128] or "run"


@contextlib.contextmanager
def never_raises(what: str) -> Iterator[None]:
    """Telemetry must not take training down: log (once per kind) and carry on."""
    try:
        yield
    except Exception:  # an integration bug is not the training job's problem
        if what not in _warned:
            _warned.add(what)
            log.exception("faultline %s failed; training continues without it", what)


_warned: set[str] = set()


def local_gpu() -> str | None:
    """The UUID of this process's current CUDA device (`GPU-...`, as NVML names it)."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    uuid = getattr(props, "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def loss_scale(scaler: Any) -> float | None:
    """An enabled AMP GradScaler's current loss scale; None without one (fp32, bf16)."""
    if scaler is None or not scaler.is_enabled():
        return None
    return float(scaler.get_scale())


def model_shape(model: Any) -> tuple[int, int | None, int | None]:
    """(N, layers, width) of a torch module for the FLOPs formula (agents.flops).

    N: the parameters that do a matmul per token. Embedding lookups do not; an output
    projection tied to the input embedding does, so it is counted once. Layers and width
    from a Hugging Face style `config` (num_hidden_layers, hidden_size) on the module or
    a submodule; None when there is none (the formula then has no attention term)."""
    import torch

    lookups = {
        id(p)
        for m in model.modules()
        if isinstance(m, torch.nn.Embedding)
        for p in m.parameters(recurse=False)
    }
    params = sum(p.numel() for p in model.parameters() if id(p) not in lookups)
    layers = hidden = None
    for module in model.modules():
        config = getattr(module, "config", None)
        n_layers = getattr(config, "num_hidden_layers", None)
        width = getattr(config, "hidden_size", None)
        if n_layers and width:
            layers, hidden = int(n_layers), int(width)
            head = getattr(module, "get_output_embeddings", None)
            weight = getattr(head() if callable(head) else None, "weight", None)
            if weight is not None and id(weight) in lookups:
                params += weight.numel()
            break
    return int(params), layers, hidden


def batch_tokens(batch: Any) -> tuple[int, int | None] | None:
    """(tokens, sequence length) of one micro-batch from its shape: `input_ids` of a
    mapping, else the first integer tensor of at least two dimensions (batch x sequence)
    in it. None when nothing in the batch looks like token ids."""
    import torch

    def ids(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            is_ids = value.dim() >= 2 and not value.is_floating_point()
            return value if is_ids else None
        if isinstance(value, dict):
            if "input_ids" in value:
                return ids(value["input_ids"])
            values: Any = value.values()
        elif isinstance(value, list | tuple):
            values = value
        else:
            return None
        for item in values:
            found = ids(item)
            if found is not None:
                return found
        return None

    tensor = ids(batch)
    if tensor is None:
        return None
    return int(tensor.shape[0]) * int(tensor.shape[1]), int(tensor.shape[1])


class Session:
    """One run's reports. The framework calls, in order per optimizer step:
    `step_begin`, `micro_batch` (and `loss`) per micro-batch, `pre_optimizer`,
    `optimizer_done`, then `step_end`; `checkpoint` after a save; `begin`/`end`/`failed`."""

    def __init__(
        self,
        *,
        group: str | None = None,
        generation: int | None = None,
        flops_per_token: float | None = None,
        recompute: bool | None = None,
        layers: int | None = None,
        hidden: int | None = None,
        verify_checkpoints: bool = True,
        rep: reporter.Reporter | None = None,
    ) -> None:
        self.group = group
        self.generation = generation
        self.flops_per_token = flops_per_token
        self.recompute = recompute
        self.layers, self.hidden = layers, hidden
        self.params: int | None = None
        self.verify_checkpoints = verify_checkpoints
        self.rep = rep
        self.rank = 0
        self.world = 1
        self.started = False
        self._last_end: float | None = None
        self._step_began: float | None = None
        self._pre_opt: float | None = None
        self._opt_done: float | None = None
        self._checkpoint_ms = 0.0
        self._other_ms = 0.0  # evaluation and logging between steps: in no phase
        self._mark: float | None = None  # the last hook time between steps
        self._tokens = 0
        self._model_flops = 0.0
        self._losses: list[Any] = []
        self.lr: float | None = None
        self._verifiers: list[threading.Thread] = []
        # Set once the newest save's `committed` went out (or was given up): each report
        # waits for the one before, so commits reach the service in save order whichever
        # directory settles first (ingest reads an older commit after a newer one as a
        # non-monotonic checkpoint).
        self._last_commit: threading.Event | None = None
        self._stop = threading.Event()

    # Lightning's spawn strategies pickle the trainer, callbacks included, into each child
    # process: the threads, the event and the reporter's sockets stay behind (a child
    # initialises its own at `begin`).
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(rep=None, _verifiers=[], _stop=None, _losses=[], _last_commit=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._stop = threading.Event()

    # -- the run --------------------------------------------------------------------------
    def begin(
        self, *, rank: int, world: int, group_hint: str, model: Any = None, gpu: str | None = None
    ) -> None:
        """Training starts on this rank: the reporter, the model's shape, and (rank 0) the
        group's `running` transition with its world size."""
        self.rank, self.world = int(rank), int(world)
        with never_raises("reporter setup"):
            if self.rep is None:
                self.rep = reporter.init(
                    group=self.group, generation=self.generation, rank=self.rank, gpu=gpu
                )
            rep = self.rep
            rep.rank = self.rank  # the framework's global rank, whoever made the reporter
            if rep.gpu is None and gpu is not None:
                rep.gpu = gpu
            if rep.group is None:
                # No group from the caller, FAULTLINE_GROUP or the launcher: the framework's
                # own name for the run. The process hooks need one to be installed.
                rep.group = name(group_hint)
                rep.install_hooks()
        with never_raises("model shape"):
            if model is not None and self.flops_per_token is None:
                params, layers, hidden = model_shape(model)
                self.params = params
                self.layers = self.layers or layers
                self.hidden = self.hidden or hidden
        now = time.monotonic()
        self._last_end = self._mark = now
        self.started = True
        if self.rank == 0 and self.rep is not None:
            self.rep.transition("running", reason="train_start", world_size=self.world)

    def end(self) -> None:
        """Training finished: rank 0 says the group completed."""
        if self.started and self.rank == 0 and self.rep is not None:
            self.rep.transition("completed", reason="train_end", world_size=self.world)
        self.started = False

    def failed(self, exc: BaseException) -> None:
        """The framework caught `exc` on its way out: the process record says why (the
        reporter sends one exit per process, so its own hooks add nothing after this)."""
        if self.rep is not None:
            self.rep.process(
                "exited", exit_code=1, reason=reporter.classify_exception(exc), error=exc
            )

    # -- between steps --------------------------------------------------------------------
    def other(self) -> None:
        """Logging or evaluation ended just now: its time counts in no phase."""
        now = time.monotonic()
        if self._mark is not None:
            self._other_ms += (now - self._mark) * 1000.0
        self._mark = now

    def checkpoint_took(self, ms: float | None = None) -> float:
        """A save between steps took `ms` (None: since the last hook); its time goes to the
        next step's `checkpoint` phase. Returns the milliseconds counted."""
        now = time.monotonic()
        if ms is None:
            ms = 0.0 if self._mark is None else (now - self._mark) * 1000.0
        self._checkpoint_ms += ms
        self._mark = now
        return ms

    @property
    def tokens(self) -> int:
        """Tokens of the step in progress so far."""
        return self._tokens

    # -- one step ---------------------------------------------------------------------------
    def step_begin(self) -> None:
        self._step_began = time.monotonic()

    def micro_batch(self, tokens: int, seq_len: int | None) -> None:
        self._tokens += tokens
        self._model_flops += tokens * self._per_token(seq_len)

    def loss(self, value: Any) -> None:
        """One micro-batch's loss on this rank (a tensor: read once, at the step's end)."""
        detach = getattr(value, "detach", None)
        self._losses.append(detach() if callable(detach) else value)

    def pre_optimizer(self, optimizer: Any = None) -> None:
        self._pre_opt = time.monotonic()
        with never_raises("learning rate"):
            groups = getattr(optimizer, "param_groups", None)
            if groups:
                self.lr = float(groups[0]["lr"])

    def optimizer_done(self) -> None:
        self._opt_done = time.monotonic()

    def step_end(
        self,
        step: int,
        *,
        grad_norm: float | None = None,
        loss_scale: float | None = None,
        overflow: bool | None = None,
    ) -> dict[str, Any]:
        """The step just finished (its fields; `send` reports them, perhaps after the
        framework's log adds the grad norm)."""
        now = time.monotonic()
        last = self._last_end if self._last_end is not None else now
        began = self._step_began if self._step_began is not None else last
        phases: dict[str, float] = {}
        gap = (began - last) * 1000.0
        phases["input"] = max(0.0, gap - self._checkpoint_ms - self._other_ms)
        if self._checkpoint_ms:
            phases["checkpoint"] = self._checkpoint_ms
        if self._pre_opt is not None:
            phases["compute"] = (self._pre_opt - began) * 1000.0
            done = self._opt_done if self._opt_done is not None else now
            phases["optimizer"] = (done - self._pre_opt) * 1000.0
        fields: dict[str, Any] = {
            "step": int(step),
            "tokens": self._tokens,
            "duration_ms": round((now - last) * 1000.0, 3),
            "phases": {k: round(max(0.0, v), 3) for k, v in phases.items()},
            "loss": self._mean_loss(),
            "grad_norm": grad_norm,
            "loss_scale": loss_scale,
            "overflow": overflow,
            "lr": self.lr,
        }
        if self._model_flops > 0:
            fields["model_flops"] = self._model_flops
            recompute = bool(self.recompute)
            fields["hw_flops"] = flops.hardware_flops(self._model_flops, recompute=recompute)
        self._last_end = self._mark = now
        self._step_began = self._pre_opt = self._opt_done = None
        self._checkpoint_ms = self._other_ms = 0.0
        self._tokens, self._model_flops, self._losses = 0, 0.0, []
        return fields

    def send(self, fields: dict[str, Any]) -> None:
        if self.rep is not None:
            self.rep.step(**fields)

    def _per_token(self, seq_len: int | None) -> float:
        if self.flops_per_token is not None:
            return float(self.flops_per_token)
        if self.params is None:
            return 0.0
        return flops.model_flops_per_token(
            self.params, layers=self.layers, hidden=self.hidden, seq_len=seq_len
        )

    def _mean_loss(self) -> float | None:
        if not self._losses:
            return None
        with never_raises("loss"):
            values = [float(v) for v in self._losses]  # a tensor's one sync per micro-batch
            bad = [v for v in values if not math.isfinite(v)]
            # A NaN micro-batch makes the step's loss NaN: an average must not dilute it.
            return bad[0] if bad else math.fsum(values) / len(values)
        return None

    # -- checkpoints ------------------------------------------------------------------------
    def checkpoint(
        self, path: str | os.PathLike[str], *, step: int | None, duration_ms: float, fmt: str
    ) -> None:
        """A save wrote `path` (a directory of shards or one file) and took `duration_ms`.

        In a background thread: `committed` with what is on disk (a directory once its
        listing has held still for SETTLE_S: other ranks may still be writing their own
        files into it when this rank's hook runs); then, hashed at a bounded rate,
        `verified` (or `corrupt`, naming the shard)."""
        rep = self.rep
        if rep is None:
            return
        target = Path(path)
        directory = target if target.is_dir() else target.parent
        ident = name(target.name if target.is_dir() else target.stem)
        first = manifest_of(target, fmt)  # now: the framework may rotate it away soon
        before, mine = self._last_commit, threading.Event()
        self._last_commit = mine

        def report() -> None:
            with never_raises("checkpoint report"):
                with contextlib.suppress(AttributeError, OSError):
                    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
                try:
                    manifest = self._settled(target, fmt, first) if target.is_dir() else first
                    if before is not None:
                        before.wait(SETTLE_MAX_S + SETTLE_S)
                    if not manifest["shards"]:
                        return  # removed (a rotation) before it held still: nothing to vouch for
                    rep.checkpoint(
                        ident,
                        "committed",
                        step=step,
                        manifest=manifest,
                        duration_ms=round(duration_ms, 3),
                    )
                finally:
                    mine.set()
                if not self.verify_checkpoints or not manifest["shards"]:
                    return
                checked, problem = check_shards(
                    directory, manifest, fmt, lambda p: hash_file(p, HASH_RATE_BYTES, self._stop)
                )
                if problem and self._removed(target):
                    return  # the framework's retention deleted it: gone, not corrupt
                phase = "corrupt" if problem else "verified"
                rep.checkpoint(ident, phase, step=step, manifest=checked, detail=problem)

        thread = threading.Thread(target=report, name="faultline-ckpt", daemon=True)
        self._verifiers = [t for t in self._verifiers if t.is_alive()] + [thread]
        thread.start()

    def _removed(self, target: Path) -> bool:
        """`target` is gone, or going (a removal of a directory takes a moment)."""
        self._stop.wait(SETTLE_S)
        return not target.exists()

    def _settled(self, target: Path, fmt: str, listing: dict[str, Any]) -> dict[str, Any]:
        """The listing of `target` once two reads SETTLE_S apart agree (at most SETTLE_MAX_S)."""
        began = time.monotonic()
        while time.monotonic() - began < SETTLE_MAX_S:
            if self._stop.wait(SETTLE_S):
                break
            again = manifest_of(target, fmt)
            if again == listing:
                break
            listing = again
        return listing

    def wait_verified(self, timeout: float | None = None) -> None:
        """Wait (up to `timeout` seconds each) for the checkpoints being hashed."""
        for thread in self._verifiers:
            thread.join(timeout)
