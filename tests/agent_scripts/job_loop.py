"""One rank of a job of several nodes: the small GPT of gpt_loop.py in DDP over gloo, on the CPU.

Every rank stops at the same step: after each step the ranks agree (an all-reduce of a flag) whether the test's
``STOP_FILE`` exists or ``MAX_STEPS`` is reached. The node ``STRAGGLER_NODE`` waits ``STRAGGLE_S`` between its
backward pass and its optimizer step, so its steps are reported that much after the other nodes'. Each rank writes
``progress-rank<N>`` (its latest step) and, at the end, ``done-rank<N>.json`` in ``OUT_DIR``.
"""

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from gpt_loop import GPT, GPTConfig
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
node = int(os.environ["GROUP_RANK"])
out = Path(os.environ["OUT_DIR"])
stop_file = Path(os.environ["STOP_FILE"])
max_steps = int(os.environ.get("MAX_STEPS", "100000"))
pause_s = float(os.environ.get("STEP_SLEEP_S", "0.05"))
straggle_s = (
    float(os.environ.get("STRAGGLE_S", "0")) if int(os.environ.get("STRAGGLER_NODE", "-1")) == node else 0.0
)
torch.manual_seed(0)
torch.set_num_threads(1)
cfg = GPTConfig()
model = DistributedDataParallel(GPT(cfg))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
generator = torch.Generator().manual_seed(10 + rank)
step = 0
while True:
    x = torch.randint(cfg.vocab_size, (2, cfg.block_size), generator=generator)
    optimizer.zero_grad()
    _, loss = model(x, x)
    loss.backward()
    if straggle_s:
        time.sleep(straggle_s)
    optimizer.step()
    step += 1
    (out / f"progress-rank{rank}").write_text(str(step))
    flag = torch.tensor([1.0 if stop_file.exists() or step >= max_steps else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() > 0:
        break
    time.sleep(pause_s)
dist.destroy_process_group()
(out / f"done-rank{rank}.json").write_text(
    json.dumps({"rank": rank, "node": node, "steps": step, "pid": os.getpid()})
)
