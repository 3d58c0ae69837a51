"""Exceptions of the user's own optimizer must reach the user unchanged, with or without GradScaler.

Prints one JSON line: for each case, the exception's type, whether it is the very object raised, and the file and
function of the traceback's last frame.
"""

import json
import sys
import traceback

import torch

torch.set_num_threads(1)
MINE = ValueError("mine")
INTERRUPT = KeyboardInterrupt("stop")


class BrokenSGD(torch.optim.SGD):
    def step(self, closure=None):
        raise self.error


def attempt(error, use_scaler):
    model = torch.nn.Linear(2, 1)
    optimizer = BrokenSGD(model.parameters(), lr=0.1)
    optimizer.error = error
    scaler = torch.amp.GradScaler("cpu") if use_scaler else None
    loss = model(torch.ones(1, 2)).sum()
    try:
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt is one of the cases
        last = traceback.extract_tb(exc.__traceback__)[-1]
        return {
            "type": type(exc).__name__,
            "same": exc is error,
            "file": last.filename,
            "function": last.name,
        }
    return {"type": None}


results = {
    "plain": attempt(MINE, use_scaler=False),
    "grad_scaler": attempt(MINE, use_scaler=True),
    "interrupt": attempt(INTERRUPT, use_scaler=False),
    "interrupt_grad_scaler": attempt(INTERRUPT, use_scaler=True),
}
print(json.dumps({"script": __file__, "results": results}))
sys.stdout.flush()
