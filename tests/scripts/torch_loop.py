"""A small CPU training loop with three shapes of iteration, for the step-counting and numerics tests.

usage: torch_loop.py VARIANT ITERATIONS OUT_PREFIX     VARIANT: one | two | scaler
Writes OUT_PREFIX.json (every loss as float.hex, the RNG state's digest) and OUT_PREFIX.pt (the final state_dict).
"""

import hashlib
import json
import sys

import torch

variant, iterations, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
params = list(model.parameters())
if variant == "two":
    # Two optimizers stepping in one iteration, as Muon with AdamW does: one iteration, not two.
    optimizers = [torch.optim.AdamW(params[:2], lr=1e-2), torch.optim.SGD(params[2:], lr=1e-2, momentum=0.9)]
else:
    optimizers = [torch.optim.AdamW(params, lr=1e-2)]
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4) if variant == "scaler" else None
losses = []
for i in range(1, iterations + 1):
    x = torch.randn(32, 16)
    y = x.sum(dim=1, keepdim=True).sin()
    loss = torch.nn.functional.mse_loss(model(x), y)
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    if scaler is None:
        loss.backward()
        for opt in optimizers:
            opt.step()
    else:
        scaler.scale(loss).backward()
        if i % 10 == 0:
            params[0].grad[0, 0] = float("inf")  # an overflow: GradScaler skips this step
        for opt in optimizers:
            scaler.step(opt)
        scaler.update()
    losses.append(loss.item().hex())
rng = hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()
torch.save(model.state_dict(), out + ".pt")
with open(out + ".json", "w") as f:
    json.dump({"losses": losses, "rng": rng}, f)
