"""A real 2-layer transformer trained by a real Lightning `Trainer`, one process of a
DDP/gloo job (started externally, as a launcher would: LOCAL_RANK, NODE_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), reporting through `FaultlineCallback` (the one line under test).

Built in memory, trained on random token ids: nothing is downloaded. `--nan-rank R
--nan-step K`: rank R's loss is NaN from its K-th training step on.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from torch import nn

from agents.integrations.lightning import FaultlineCallback

SEQ = 32
VOCAB = 128
WIDTH = 64
LAYERS = 2


class TinyLM(L.LightningModule):
    def __init__(self, nan_rank: int | None, nan_step: int) -> None:
        super().__init__()
        self.nan_rank, self.nan_step = nan_rank, nan_step
        self.embed = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, 4, 4 * WIDTH, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, LAYERS)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.calls = 0

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(SEQ - 1)
        hidden = self.body(self.embed(batch[:, :-1]), mask=mask, is_causal=True)
        logits = self.head(hidden)
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        self.calls += 1
        if self.global_rank == self.nan_rank and self.calls >= self.nan_step:
            loss = loss * float("nan")
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--nan-rank", type=int)
    ap.add_argument("--nan-step", type=int, default=4)
    opts = ap.parse_args()
    torch.manual_seed(0)
    data = torch.randint(0, VOCAB, (64, SEQ), generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=opts.steps,
        default_root_dir=opts.out,
        callbacks=[
            FaultlineCallback(layers=LAYERS, hidden=WIDTH),
            L.pytorch.callbacks.ModelCheckpoint(every_n_train_steps=opts.steps // 2),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(TinyLM(opts.nan_rank, opts.nan_step), loader)
    # As a training script should: a process group left to the interpreter's exit can abort
    # the rank there ("terminate called without an active exception", seen under load).
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
