"""A DDP loop on the CPU (gloo) with a DataLoader, for the straggler's tests: run with torchrun --standalone
--nproc_per_node N.

Environment: STEPS (default 60); SLOW_RANK: that rank is slowed by SLOW_S seconds (default 0.2) a step, in its
forward (SLOW_WHERE=forward) or in its DataLoader (SLOW_WHERE=data, the dataset's __getitem__ sleeps); PAUSE_S (0.0)
slept by every rank after each step; LOSSES: where each rank writes its losses; ON_GPU=1: each rank says it
computes on cuda:<its local rank> (a stand-in, for the fake GPUs' tests, of a loop that moved its model there);
THREAD_CPU: where each rank writes, as JSON, the CPU seconds of each of its threads by name (``/proc``'s
``schedstat``) from its first step to its last, and their count (``bench/bench_straggler.py``'s cost part).
"""

import json
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

steps = int(os.environ.get("STEPS", "60"))
slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
slow_where = os.environ.get("SLOW_WHERE", "forward")
slow_s = float(os.environ.get("SLOW_S", "0.2"))
pause_s = float(os.environ.get("PAUSE_S", "0"))
thread_cpu = os.environ.get("THREAD_CPU")

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
slowed = rank == slow_rank
on_gpu = os.environ.get("ON_GPU") == "1"


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
        self.layers = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))

    def forward(self, x):
        if slowed and slow_where == "forward":
            time.sleep(slow_s)
        return self.layers(x)


model = DistributedDataParallel(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = torch.utils.data.DataLoader(Batches(), batch_size=None)


def threads_cpu_s() -> dict[str, float]:
    """Each live thread's CPU seconds, by its name: the kernel's count of its time on a CPU, in nanoseconds
    (``/proc/self/task/<tid>/schedstat``; ``stat``'s user and system times count in ticks of 10 ms)."""
    out = {}
    for thread in threading.enumerate():
        try:
            with open(f"/proc/self/task/{thread.native_id}/schedstat") as stat:
                out[thread.name] = int(stat.read().split()[0]) / 1e9
        except OSError:
            continue  # ended meanwhile
    return out


losses = []
cpu_from: dict[str, float] = {}
for x, y in loader:
    if thread_cpu and not losses:
        cpu_from = threads_cpu_s()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
    if on_gpu and len(losses) == 1:
        # After the model probe said where the model is (the CPU), as it would say cuda:<k> of a model moved there.
        import trainmeter_agent

        device = {"type": "cuda", "index": int(os.environ["LOCAL_RANK"])}
        trainmeter_agent._process_agent.fact("device", device, "model")
    if pause_s:
        time.sleep(pause_s)
if thread_cpu:
    cpu_to = threads_cpu_s()
    spent = {name: cpu_to[name] - cpu_from.get(name, 0.0) for name in cpu_to}
    with open(f"{thread_cpu}.rank{rank}", "w") as out:
        json.dump({"steps": len(losses), "threads": spent}, out)
if os.environ.get("LOSSES"):
    with open(os.environ["LOSSES"] + f".rank{rank}", "w") as out:
        out.write(" ".join(repr(v) for v in losses) + "\n")
dist.barrier()  # every rank done with its collectives before any closes its group (gloo aborts otherwise)
dist.destroy_process_group()
