"""Trains a small model for a few steps, then does what training scripts do with whole models: an EMA copy made with
copy.deepcopy and trained on, and the model pickled with torch.save. Prints one JSON line: the EMA's loss and the
saved file. Runs the same with and without tm."""

from __future__ import annotations

import copy
import json
import sys

import torch


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(16, (4, 8))
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    ema = copy.deepcopy(model)  # after the agent adopted the model: its hook is on it now
    ema_optimizer = torch.optim.SGD(ema.parameters(), lr=0.1)
    for _ in range(2):  # the copy trains too: its forwards are not the model's micro-batches
        ema_loss = torch.nn.functional.cross_entropy(ema(ids).flatten(0, 1), ids.flatten())
        ema_loss.backward()
        ema_optimizer.step()
        ema_optimizer.zero_grad()
    torch.save(model, sys.argv[1])
    print(json.dumps({"ema_loss": ema_loss.item().hex(), "saved": sys.argv[1]}))


if __name__ == "__main__":
    main()
