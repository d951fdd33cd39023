"""Hugging Face Transformers: a `TrainerCallback` that reports the run to the node agent.

    from agents.integrations.transformers import FaultlineCallback
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[FaultlineCallback()])

Owns translating the Trainer's hooks into `agents.integrations.common.Session` calls: a
step per optimizer step (this rank's tokens and loss from forward hooks on the model, so
per rank and NaN included: the Trainer's logged loss is the all-rank mean and skips
non-finite values), the grad norm the Trainer logs on logging steps, the learning rate the
optimizer stepped with, the AMP loss scale and skipped steps, phase times, each saved
`checkpoint-<step>` directory, and the run's start and end. Importing this module imports
transformers; nothing else in `agents` imports this module.
"""

from __future__ import annotations

import os
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # say which extra brings it, not just the module's name
    raise ImportError(
        "agents.integrations.transformers needs transformers: pip install 'faultline[transformers]'"
    ) from exc

from agents.integrations.common import (
    Session,
    batch_tokens,
    local_gpu,
    loss_scale,
    never_raises,
)
from agents.reporter import Reporter

CHECKPOINT_PREFIX = "checkpoint"  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR
# How long the end of training waits for the last checkpoint's hashes to be sent.
VERIFY_WAIT_S = 30.0


class FaultlineCallback(TrainerCallback):
    """Reports steps, checkpoints and the run's transitions; every hook swallows its errors.

    `group`/`generation` default to the reporter's (arguments, FAULTLINE_* variables, the
    launcher's), else the run's name. `flops_per_token` overrides the FLOPs the callback
    works out from the model (agents.flops: 6·N + 12·L·d·T)."""

    def __init__(
        self,
        *,
        group: str | None = None,
        generation: int | None = None,
        flops_per_token: float | None = None,
        verify_checkpoints: bool = True,
        reporter: Reporter | None = None,
    ) -> None:
        self.session = Session(
            group=group,
            generation=generation,
            flops_per_token=flops_per_token,
            verify_checkpoints=verify_checkpoints,
            rep=reporter,
        )
        self._hooks: list[Any] = []
        self._pending: dict[str, Any] | None = None
        self._scale: float | None = None
        self._tokens_seen = 0

    # -- the run ------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with never_raises("train begin"):
            model = kwargs.get("model")
            if self.session.recompute is None:
                self.session.recompute = bool(getattr(args, "gradient_checkpointing", False))
            run = getattr(args, "run_name", None) or os.path.basename(
                os.path.abspath(args.output_dir)
            )
            self.session.begin(
                rank=args.process_index,
                world=args.world_size,
                group_hint=run or "transformers",
                model=model,
                gpu=local_gpu(),
            )
            self._tokens_seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
            if model is not None and not self._hooks:
                self._hooks = [
                    model.register_forward_pre_hook(self._forward_in, with_kwargs=True),
                    model.register_forward_hook(self._forward_out, with_kwargs=True),
                ]

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with never_raises("train end"):
            self._flush()
            for hook in self._hooks:
                hook.remove()
            self._hooks = []
            self.session.end()
            self.session.wait_verified(VERIFY_WAIT_S)

    # -- this rank's micro-batches ----------------------------------------------------------------
    def _forward_in(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not module.training:
            return  # evaluation and generation are not training steps
        with never_raises("batch shape"):
            shape = batch_tokens(kwargs) or batch_tokens(args)
            if shape is not None:
                self.session.micro_batch(*shape)

    def _forward_out(
        self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        if not module.training:
            return
        with never_raises("loss"):
            loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
            if loss is None:
                return
            self.session.loss(_rank_mean(loss, kwargs))

    # -- one optimizer step -----------------------------------------------------------------
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with never_raises("step begin"):
            self._flush()
            self.session.step_begin()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with never_raises("pre optimizer"):
            optimizer = kwargs.get("optimizer")
            self.session.pre_optimizer(optimizer)
            scaler = getattr(optimizer, "scaler", None)  # accelerate's AMP GradScaler
            self._scale = loss_scale(scaler)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with never_raises("optimizer step"):
            self.session.optimizer_done()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with never_raises("step end"):
            seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
            if self.session.tokens == 0 and seen > self._tokens_seen:
                # No token ids reached the model's forward (inputs_embeds, a wrapped
                # model): the Trainer's count, gathered over ranks, shared out evenly.
                self.session.micro_batch((seen - self._tokens_seen) // self.session.world, None)
            self._tokens_seen = seen
            skipped = getattr(kwargs.get("optimizer"), "step_was_skipped", None)
            fields = self.session.step_end(
                state.global_step,
                loss_scale=self._scale,
                overflow=bool(skipped) if self._scale is not None else None,
            )
            if control.should_log:
                self._pending = fields  # the log that follows carries the grad norm
            else:
                self.session.send(fields)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        with never_raises("log"):
            pending = self._pending
            if pending is not None and pending["step"] == state.global_step and logs:
                norm = logs.get("grad_norm")
                pending["grad_norm"] = None if norm is None else float(norm)
                if pending.get("lr") is None and logs.get("learning_rate") is not None:
                    pending["lr"] = float(logs["learning_rate"])
            self._flush()
            self.session.other()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with never_raises("evaluate"):
            self._flush()
            self.session.other()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with never_raises("save"):
            self._flush()
            ms = self.session.checkpoint_took()  # since the step, its log or evaluation
            if not state.is_world_process_zero:
                return  # one checkpoint record per checkpoint, from the rank that wrote it
            path = os.path.join(args.output_dir, f"{CHECKPOINT_PREFIX}-{state.global_step}")
            if os.path.isdir(path):
                self.session.checkpoint(
                    path, step=state.global_step, duration_ms=ms, fmt="transformers"
                )

    def _flush(self) -> None:
        if self._pending is not None:
            fields, self._pending = self._pending, None
            self.session.send(fields)


def _rank_mean(loss: Any, kwargs: dict[str, Any]) -> Any:
    """This rank's mean token loss of the micro-batch. Where the Trainer passes the step's
    token count (`num_items_in_batch`, over every micro-batch and, by default, every rank),
    the model divided its summed loss by it: scaled back by this micro-batch's own count
    (the causal-LM count the Trainer uses: labels after the first position, not -100)."""
    items = kwargs.get("num_items_in_batch")
    labels = kwargs.get("shift_labels")
    if labels is None:
        labels = kwargs.get("labels")
        labels = None if labels is None or labels.dim() < 2 else labels[..., 1:]
    if items is None or labels is None:
        return loss
    local = (labels != -100).sum().clamp(min=1)  # no .item(): no sync per micro-batch
    return loss.detach() * items / local
