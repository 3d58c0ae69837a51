"""A two-rank DDP loop on the CPU (gloo) for the golden logs: run with torchrun --standalone --nproc_per_node 2."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainmeter_agent import emit

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
model = DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Flatten(), torch.nn.Linear(32 * 16, 64))
)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for _ in range(steps):
    x = torch.randint(0, 64, (8, 16))
    y = x[:, 0]
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0:
        emit(train_loss=loss.item())
dist.destroy_process_group()
print(f"rank {rank} done", file=sys.stderr if os.environ.get("QUIET") else sys.stdout)
