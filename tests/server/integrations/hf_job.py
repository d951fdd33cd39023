"""A real 2-layer GPT-2 trained by a real `transformers.Trainer`, one process of a DDP/gloo
job, reporting through `FaultlineCallback` (the one line under test).

Run by tests/server/integrations/test_transformers.py with RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT and FAULTLINE_* set. Built from a config, trained on an in-memory dataset:
nothing is downloaded. `--nan-rank R --nan-step K`: rank R's loss is NaN from its K-th
training forward on (a fault in the model's numerics, as a bad batch or a broken kernel
would make it).
"""

from __future__ import annotations

import argparse
import gc

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from agents.integrations.transformers import FaultlineCallback

SEQ = 32
VOCAB = 128


class Model(GPT2LMHeadModel):
    nan_from: int | None = None
    calls = 0

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        if self.training:
            self.calls += 1
            if self.nan_from is not None and self.calls >= self.nan_from:
                out.loss = out.loss * float("nan")
        return out


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--nan-rank", type=int)
    ap.add_argument("--nan-step", type=int, default=4)
    opts = ap.parse_args()
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        n_positions=SEQ,
        vocab_size=VOCAB,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = Model(config)
    args = TrainingArguments(
        output_dir=opts.out,
        max_steps=opts.steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="steps",
        save_steps=opts.steps // 2,
        report_to=[],
        remove_unused_columns=False,  # Model.forward takes **kwargs: keep every column
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    if opts.nan_rank is not None and args.process_index == opts.nan_rank:
        model.nan_from = opts.nan_step
    trainer = Trainer(
        model=model, args=args, train_dataset=Tokens(64), callbacks=[FaultlineCallback()]
    )
    trainer.train()
    # As a training script should: a process group left to the interpreter's exit can abort
    # the rank there ("terminate called without an active exception", seen under load).
    # The DDP wrapper goes first, while its process group lives: freed after it (main's
    # locals at its return), the NaN rank hung there once in CI under load, its stack at
    # `main()`'s return line and gloo's thread with no Python frame.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()  # both ranks past their last collective
        del trainer, model
        gc.collect()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
