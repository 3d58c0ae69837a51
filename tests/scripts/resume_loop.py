"""A CPU training loop that checkpoints every 50 steps and resumes from its latest checkpoint, as a preemptible job.

Usage: resume_loop.py CKPT_DIR LAST_STEP [STOP_AFTER]. It loads the newest ``step-N.pt`` of CKPT_DIR (model, AdamW
state, step), trains on to LAST_STEP, and saves ``step-N.pt`` every 50 steps. With STOP_AFTER it stops after that
step (and its checkpoint, if it writes one), lets the agent send what it holds, writes ``CKPT_DIR/stopped`` with its
pid, and waits to be killed: the signal for a test to kill it with no timing race.
"""

import os
import sys
import time
from pathlib import Path

import torch

from trainmeter_agent import emit

CHECKPOINT_EVERY = 50

torch.set_num_threads(1)
ckpt_dir = Path(sys.argv[1])
last_step = int(sys.argv[2])
stop_after = int(sys.argv[3]) if len(sys.argv) > 3 else None

model = torch.nn.Linear(16, 1)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
start = 0
saved = sorted(ckpt_dir.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
if saved:
    checkpoint = torch.load(saved[-1])
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    start = checkpoint["step"]

for step in range(start + 1, last_step + 1):
    data = torch.Generator().manual_seed(step)  # each step's batch depends on its number only
    inputs, targets = torch.randn(64, 16, generator=data), torch.randn(64, 1, generator=data)
    optimizer.zero_grad()
    loss = ((model(inputs) - targets) ** 2).mean()
    loss.backward()
    optimizer.step()
    time.sleep(0.004)  # the rest of a step's work, so that compute is more than a rounding error of elapsed
    emit(train_loss=loss.item())
    if step % CHECKPOINT_EVERY == 0:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        torch.save(state, ckpt_dir / f"step-{step}.pt")
    if step == stop_after:
        time.sleep(0.1)
        emit(stopped_at=step)  # the agent sends it with the rows before it: the test waits for it in the log
        (ckpt_dir / "stopped").write_text(str(os.getpid()))
        while True:
            time.sleep(1)
