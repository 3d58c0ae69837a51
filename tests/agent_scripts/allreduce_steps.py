"""A training loop on the CPU (gloo) whose one collective a step is a synchronous all_reduce from Python, of a known
size: for the bus bandwidth's tests. Run with torchrun --standalone --nproc_per_node N. STEPS (default 40); NUMEL
(default 262144 float32: 1 MiB) the all_reduce's tensor."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
buffer = torch.ones(int(os.environ.get("NUMEL", "262144")))
for _ in range(int(os.environ.get("STEPS", "40"))):
    loss = model(torch.randn(8, 16)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    dist.all_reduce(buffer)  # synchronous: torch.distributed waits on its work from Python
    buffer.fill_(1.0)
dist.barrier()  # every rank done with its collectives before any closes its group (gloo aborts otherwise)
dist.destroy_process_group()
