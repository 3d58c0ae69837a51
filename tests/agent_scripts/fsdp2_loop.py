"""An FSDP2 loop (``fully_shard``) on the CPU (gloo) with a DataLoader, for the collective probe's and the
straggler's tests: run with torchrun --standalone --nproc_per_node N.

Each Linear is its own FSDP unit, kept unsharded after forward (reshard_after_forward=False), so a step is one
all_gather per unit in the forward and, gloo having no reduce_scatter, one all_reduce per unit of its whole gradient
in the backward. Each unit's parameters are sharded on dim 0 across the N ranks.

Environment: STEPS (default 60); SLOW_RANK: that rank is slowed by SLOW_S seconds (default 0.2) a step, in its
forward (SLOW_WHERE=forward) or in its DataLoader (SLOW_WHERE=data); PAUSE_S (0.0) slept by every rank after each
step; LOSSES: where each rank writes its losses; SLEEP_RANK sleeps SLEEP_S seconds in step SLEEP_STEP between its
forward and its backward: alive, it never enters that step's all_reduce, which the other ranks wait in.
"""

import gc
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

steps = int(os.environ.get("STEPS", "60"))
slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
slow_where = os.environ.get("SLOW_WHERE", "forward")
slow_s = float(os.environ.get("SLOW_S", "0.2"))
pause_s = float(os.environ.get("PAUSE_S", "0"))
sleep_rank = int(os.environ.get("SLEEP_RANK", "-1"))
sleep_step = int(os.environ.get("SLEEP_STEP", "-1"))
sleep_s = float(os.environ.get("SLEEP_S", "0"))

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
slowed = rank == slow_rank


class Batches(torch.utils.data.Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1 + rank)
        self.x = torch.randn(steps, 16, 64, generator=generator)
        self.y = torch.randint(0, 8, (steps, 16), generator=generator)

    def __len__(self) -> int:
        return steps

    def __getitem__(self, i):
        if slowed and slow_where == "data":
            time.sleep(slow_s)
        return self.x[i], self.y[i]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(64, 32)
        self.second = torch.nn.Linear(32, 8)

    def forward(self, x):
        if slowed and slow_where == "forward":
            time.sleep(slow_s)
        return self.second(torch.relu(self.first(x)))


model = Net()
fully_shard(model.first, reshard_after_forward=False)
fully_shard(model.second, reshard_after_forward=False)
fully_shard(model, reshard_after_forward=False)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = torch.utils.data.DataLoader(Batches(), batch_size=None)
losses = []
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    if rank == sleep_rank and len(losses) + 1 == sleep_step:
        time.sleep(sleep_s)  # alive, not entering the all_reduce the others wait in
    loss.backward()
    opt.step()
    losses.append(loss.item())
    if pause_s:
        time.sleep(pause_s)
if os.environ.get("LOSSES"):
    with open(os.environ["LOSSES"] + f".rank{rank}", "w") as out:
        out.write(" ".join(repr(v) for v in losses) + "\n")
# FSDP2's modules and optimizer go before the group: left to the interpreter's exit, torch 2.13 aborted there in 4 of
# 12 bare runs side by side, three at a time ("terminate called without an active exception"); in none of 18 this way.
del model, opt, loader
gc.collect()
dist.barrier()  # every rank done with its collectives before any closes its group (gloo aborts otherwise)
dist.destroy_process_group()
