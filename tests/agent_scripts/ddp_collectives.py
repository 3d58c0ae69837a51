"""A DDP loop on the CPU (gloo) for the collective probe's tests: run with torchrun --standalone --nproc_per_node N.

Environment: STEPS (default 30); PAUSE_S (0.01) slept after each step; SLEEP_RANK and SLEEP_STEP: that rank sleeps SLEEP_S seconds before the backward (whose
all_reduce the others then wait in) of that step; LOG_REDUCE=1: each step all-reduces its loss after backward,
synchronously (the sleep then comes before that all_reduce instead); CHECKPOINT_STEP: after it rank 0 saves a checkpoint that takes
CHECKPOINT_S seconds while the others wait in a barrier; LOSSES, CPU_OUT: where each rank writes its losses, its CPU time.
The model's gradients are 4 tensors of 64·32 + 32 + 32·8 + 8 = 2344 floats: one DDP bucket, 9376 bytes.
"""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

steps = int(os.environ.get("STEPS", "30"))
sleep_rank = int(os.environ.get("SLEEP_RANK", "-1"))
sleep_step = int(os.environ.get("SLEEP_STEP", "-1"))
sleep_s = float(os.environ.get("SLEEP_S", "0"))
log_reduce = os.environ.get("LOG_REDUCE") == "1"
checkpoint_step = int(os.environ.get("CHECKPOINT_STEP", "-1"))
checkpoint_s = float(os.environ.get("CHECKPOINT_S", "0"))


class SlowToSave:
    """Pickled by torch.save in CHECKPOINT_S seconds: a checkpoint that takes that long to write."""

    def __reduce__(self):
        time.sleep(checkpoint_s)
        return (int, (0,))


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
model = DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
generator = torch.Generator().manual_seed(1 + rank)
losses = []
for step in range(1, steps + 1):
    x = torch.randn(16, 64, generator=generator)
    y = torch.randint(0, 8, (16,), generator=generator)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    if rank == sleep_rank and step == sleep_step and not log_reduce:
        time.sleep(sleep_s)  # alive, not entering the all_reduce the others wait in
    loss.backward()
    if log_reduce:
        if rank == sleep_rank and step == sleep_step:
            time.sleep(sleep_s)  # late to the loss's all_reduce, which the others wait in from Python
        dist.all_reduce(loss.detach().clone())  # synchronous: its wait is Python's
    opt.step()
    losses.append(loss.item())
    if step == checkpoint_step:
        if rank == 0:
            torch.save({"model": model.state_dict(), "slow": SlowToSave()}, f"checkpoint-{step}.pt")
        dist.barrier()  # the other ranks wait here while rank 0 saves
    time.sleep(float(os.environ.get("PAUSE_S", "0.01")))
if os.environ.get("CPU_OUT"):  # the process's CPU seconds, every thread's (bench/bench_collectives.py)
    with open(os.environ["CPU_OUT"] + f".rank{rank}", "w") as out:
        out.write(repr(time.process_time()) + "\n")
if os.environ.get("LOSSES"):
    with open(os.environ["LOSSES"] + f".rank{rank}", "w") as out:
        out.write(" ".join(repr(v) for v in losses) + "\n")
dist.destroy_process_group()
