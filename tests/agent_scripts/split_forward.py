"""A training step that calls the model's parts one by one (``embed(x)``, then ``head(h)``) instead of one forward:
an ``Embedding(50, 16)`` and a ``Linear(16, 50)`` on token ids, 4 steps on the CPU.

Usage: split_forward.py lightning|loop|parts. ``lightning``: a LightningModule whose ``training_step`` calls
``self.embed`` and ``self.head``. ``loop``: a plain loop calling ``model.embed`` and ``model.head`` of one module.
``parts``: the two modules alone, held by no common module, one optimizer over both.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

STEPS = 4
VOCAB, WIDTH = 50, 16


class TwoParts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)


def batches():
    generator = torch.Generator().manual_seed(1)
    data = torch.randint(VOCAB, (4 * STEPS, 9), generator=generator)
    return [(data[i : i + 4, :-1], data[i : i + 4, 1:]) for i in range(0, 4 * STEPS, 4)]


def train(embed: nn.Module, head: nn.Module, optimizer) -> None:
    for x, y in batches():
        logits = head(embed(x))
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def loop() -> None:
    model = TwoParts()
    train(model.embed, model.head, torch.optim.SGD(model.parameters(), lr=0.1))


def parts() -> None:
    embed, head = nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB)
    train(embed, head, torch.optim.SGD([*embed.parameters(), *head.parameters()], lr=0.1))


def lightning() -> None:
    import lightning as L

    class LitTwoParts(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, WIDTH)
            self.head = nn.Linear(WIDTH, VOCAB)

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.head(self.embed(x))
            return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    x = torch.cat([x for x, _ in batches()])
    y = torch.cat([y for _, y in batches()])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    trainer.fit(LitTwoParts(), loader)


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    {"lightning": lightning, "loop": loop, "parts": parts}[sys.argv[1]]()
