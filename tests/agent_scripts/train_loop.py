"""A tiny CPU training loop for the agent's tests; prints its losses (float.hex) as one JSON line on stdout.

Usage: train_loop.py MODE [ITERATIONS]. MODE: plain, two_optimizers, double_step, grad_scaler, all (GradScaler and
emit, so that every probe of the agent is used). Deterministic: the same mode always gives the same losses.
"""

import json
import sys

import torch

from trainmeter_agent import emit

torch.set_num_threads(1)
torch.manual_seed(0)
mode = sys.argv[1]
iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 50

model = torch.nn.Linear(4, 1)
inputs = torch.randn(8, 4)
targets = torch.randn(8, 1)
if mode == "two_optimizers":  # like Muon for the matrices and AdamW for the rest
    optimizers = [torch.optim.SGD([model.weight], lr=0.05), torch.optim.AdamW([model.bias], lr=0.01)]
else:
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.05)]
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4) if mode in ("grad_scaler", "all") else None

losses = []
for iteration in range(1, iterations + 1):
    for optimizer in optimizers:
        optimizer.zero_grad()
    loss = ((model(inputs) - targets) ** 2).mean()
    if scaler is None:
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
        if mode == "double_step":
            optimizers[0].step()  # no backward since the last step: the same iteration
    else:
        scaler.scale(loss).backward()
        if iteration % 10 == 0:
            model.weight.grad[0, 0] = float("inf")  # GradScaler skips this step
        scaler.step(optimizers[0])
        scaler.update()
    if mode == "all":
        emit(train_loss=loss.detach(), lr=0.05)
    losses.append(loss.item().hex())
print(json.dumps(losses))
