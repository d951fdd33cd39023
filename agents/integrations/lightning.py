"""Lightning: a `Callback` that reports the run to the node agent.

    from agents.integrations.lightning import FaultlineCallback
    trainer = L.Trainer(..., callbacks=[FaultlineCallback()])

Owns translating Lightning's hooks into `agents.integrations.common.Session` calls: a step
per optimizer step (`trainer.global_step`) with this rank's tokens (from the batch's token
ids, or `tokens_of(batch)`), loss (`training_step`'s), the gradient norm before clipping
(`on_before_optimizer_step`: unscaled, not yet clipped), the learning rate, the AMP loss
scale and whether the scaler skipped the step, phase times; every checkpoint the strategy
saves (its CheckpointIO's `save_checkpoint`, wrapped: the file or directory it wrote and
how long it took); the run's start and end, and an exception on its way out. Importing
this module imports lightning; nothing else in `agents` imports this module.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # say which extra brings it, not just the module's name
    raise ImportError(
        "agents.integrations.lightning needs lightning: pip install 'faultline[lightning]'"
    ) from exc

from agents.integrations.common import (
    Session,
    batch_tokens,
    local_gpu,
    loss_scale,
    never_raises,
)
from agents.reporter import Reporter

VERIFY_WAIT_S = 30.0


class FaultlineCallback(Callback):
    """Reports steps, checkpoints and the run's transitions; every hook swallows its errors.

    `group`/`generation` default to the reporter's (arguments, FAULTLINE_* variables, the
    launcher's), else the run's root directory name. FLOPs: `flops_per_token`, else from
    the module (agents.flops): N from its parameters, layers and width from a Hugging Face
    style `config` on it or `layers=`/`hidden=`. `recompute=True` when the model
    recomputes activations (HFU counts the second forward). `grad_norm=False` skips the
    per-step norm (one reduction over the gradients and one sync)."""

    def __init__(
        self,
        *,
        group: str | None = None,
        generation: int | None = None,
        flops_per_token: float | None = None,
        layers: int | None = None,
        hidden: int | None = None,
        recompute: bool = False,
        tokens_of: Callable[[Any], tuple[int, int | None] | None] | None = None,
        grad_norm: bool = True,
        verify_checkpoints: bool = True,
        reporter: Reporter | None = None,
    ) -> None:
        self.session = Session(
            group=group,
            generation=generation,
            flops_per_token=flops_per_token,
            recompute=recompute,
            layers=layers,
            hidden=hidden,
            verify_checkpoints=verify_checkpoints,
            rep=reporter,
        )
        self.tokens_of = tokens_of or batch_tokens
        self.want_grad_norm = grad_norm
        self._last_step = 0
        self._in_step = False
        self._grad_norm: float | None = None
        self._scale: float | None = None
        self._wrapped: Any = None

    # -- the run ------------------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        with never_raises("checkpoint hook"):
            self._wrap_saves(trainer)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        with never_raises("train start"):
            root = os.path.basename(os.path.abspath(trainer.default_root_dir))
            self.session.begin(
                rank=trainer.global_rank,
                world=trainer.world_size,
                group_hint=root or "lightning",
                model=pl_module,
                gpu=local_gpu(),
            )
            self._last_step = int(trainer.global_step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        with never_raises("train end"):
            self.session.end()
            self.session.wait_verified(VERIFY_WAIT_S)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        with never_raises("exception"):
            self.session.failed(exception)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        with never_raises("validation"):
            self.session.other()

    # -- one optimizer step -----------------------------------------------------------------
    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        with never_raises("batch start"):
            if not self._in_step:
                self._in_step = True
                self.session.step_begin()
            shape = self.tokens_of(batch)
            if shape is not None:
                self.session.micro_batch(*shape)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        with never_raises("before optimizer step"):
            self.session.pre_optimizer(optimizer)
            self._scale = loss_scale(getattr(trainer.precision_plugin, "scaler", None))
            self._grad_norm = _grad_norm(pl_module) if self.want_grad_norm else None

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        with never_raises("batch end"):
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None:
                self.session.loss(loss)
            step = int(trainer.global_step)
            if step <= self._last_step:
                return  # an accumulation micro-batch: the optimizer has not stepped
            self._last_step = step
            self.session.optimizer_done()
            overflow = None
            after = loss_scale(getattr(trainer.precision_plugin, "scaler", None))
            if self._scale is not None and after is not None:
                # The scaler lowers its scale exactly when it found inf/NaN and skipped.
                overflow = after < self._scale
            self.session.send(
                self.session.step_end(
                    step, grad_norm=self._grad_norm, loss_scale=self._scale, overflow=overflow
                )
            )
            self._in_step = False
            self._grad_norm = self._scale = None

    # -- checkpoints --------------------------------------------------------------------------
    def _wrap_saves(self, trainer: Any) -> None:
        """Time every save of the strategy's CheckpointIO and report what it wrote (the
        strategy calls it on the ranks that write: rank 0 under DDP)."""
        io = trainer.strategy.checkpoint_io
        if io is self._wrapped:
            return
        original = io.save_checkpoint
        session = self.session

        def save_checkpoint(
            checkpoint: dict[str, Any], path: Any, storage_options: Any = None
        ) -> Any:
            began = time.monotonic()
            result = original(checkpoint, path, storage_options=storage_options)
            ms = (time.monotonic() - began) * 1000.0
            with never_raises("checkpoint"):
                session.checkpoint_took(ms)
                step = checkpoint.get("global_step") if isinstance(checkpoint, dict) else None
                if os.path.exists(path):
                    session.checkpoint(path, step=step, duration_ms=ms, fmt="lightning")
            return result

        io.save_checkpoint = save_checkpoint
        self._wrapped = io


def _grad_norm(module: Any) -> float | None:
    """The 2-norm of all gradients (what clipping would compare with its limit)."""
    import torch

    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return None
    norm = torch.nn.utils.get_total_norm(grads)
    full = getattr(norm, "full_tensor", None)  # a DTensor's norm: every shard's
    return float(full() if callable(full) else norm)
