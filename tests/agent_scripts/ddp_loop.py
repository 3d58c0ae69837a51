"""Two ranks under ``torchrun --standalone`` (gloo, CPU) train the small GPT of gpt_loop.py wrapped in DDP.

Each rank writes rank<N>.json (its rank, pid and losses as float.hex) in the working directory: two processes
printing at once could interleave their lines. The agent should see dp 2 on both.
"""

import json
import os

import torch
import torch.distributed as dist
from gpt_loop import GPT, GPTConfig
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
cfg = GPTConfig()
model = DistributedDataParallel(GPT(cfg))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
generator = torch.Generator().manual_seed(10 + rank)  # each rank its own shard of the data
losses = []
for _ in range(int(os.environ.get("STEPS", "5"))):
    x = torch.randint(cfg.vocab_size, (2, cfg.block_size), generator=generator)
    optimizer.zero_grad()
    _, loss = model(x, x)
    loss.backward()
    optimizer.step()
    losses.append(loss.item().hex())
dist.destroy_process_group()
with open(f"rank{rank}.json", "w") as out:
    json.dump({"rank": rank, "pid": os.getpid(), "losses": losses}, out)
