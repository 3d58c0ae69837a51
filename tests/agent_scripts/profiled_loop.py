"""A tiny CPU training loop under torch.profiler, writing its trace with tensorboard_trace_handler.

    python profiled_loop.py TRACE_DIR [--steps N]

wait 2, warmup 1, active 3: the profiler records its steps #3, #4 and #5 (its own count starts at 0), which are the
loop's 4th to 6th iterations. Prints one JSON line: the loop's losses and the files the handler wrote.
"""

import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

torch.manual_seed(0)
torch.set_num_threads(1)
out = sys.argv[1]
steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 8
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
losses = []
with profile(
    activities=[ProfilerActivity.CPU],
    schedule=schedule(wait=2, warmup=1, active=3, repeat=1),
    on_trace_ready=tensorboard_trace_handler(out),
    with_flops=True,
) as prof:
    for _ in range(steps):
        x = torch.randn(16, 32)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        prof.step()
print(json.dumps({"losses": losses, "files": sorted(os.listdir(out))}))
