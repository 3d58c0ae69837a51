"""A CPU training loop with known sleeps in each place the time split names, stopped and resumed as a preemptible job.

Usage: badput_loop.py CKPT_DIR LAST_STEP STOP_AFTER|0 SLEEPS|0 [HANG_AT_STEP]. It loads the newest ``step-N.pt`` of
CKPT_DIR (model, AdamW state, step) and trains to LAST_STEP through a DataLoader, saving ``step-N.pt`` every 20 steps
and evaluating at each process's 10th step. With SLEEPS=1 it sleeps 1.5 s at start-up (after its imports), 1.0 s
inside the load of a checkpoint, 1.0 s inside the 5th batch each process fetches, 1.2 s inside each checkpoint's save,
1.2 s in each eval, and 4.5 s between two steps after step HANG_AT_STEP (a hang); each sleep, as it measured it, is a
line of ``CKPT_DIR/injected.jsonl``. With STOP_AFTER it stops after that step, emits ``stopped_at``, writes
``CKPT_DIR/stopped`` with its pid and waits to be killed: the signal for a test to kill it once ``stopped_at`` is in
the run's log (the steps before it are then there too), with no timing race.
"""

import json
import os
import pickle
import sys
import time
import types
from pathlib import Path

SLEEPS = {
    "startup": 1.5,
    "checkpoint_load": 1.0,
    "data_wait": 1.0,
    "checkpoint": 1.2,
    "eval": 1.2,
    "hang": 4.5,
}
ckpt_dir = Path(sys.argv[1])
last_step, stop_after, sleeps = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
hang_at = int(sys.argv[5]) if len(sys.argv) > 5 else None


def injected(bucket: str) -> None:
    """Sleep the bucket's time (with SLEEPS=1) and write down how long it took."""
    if not sleeps:
        return
    started = time.monotonic()
    time.sleep(SLEEPS[bucket])
    with open(ckpt_dir / "injected.jsonl", "a") as out:
        out.write(json.dumps({"bucket": bucket, "s": time.monotonic() - started}) + "\n")


import torch  # noqa: E402  (the helper above first: it is what the sleeps use)

from trainmeter_agent import emit  # noqa: E402

# After the imports: slept beside tm's own start-up (its processes starting while the training imports torch), a
# sleep would hide some of their time instead of adding its own.
injected("startup")

torch.set_num_threads(1)


class Batches(torch.utils.data.Dataset):
    """Each step's batch depends on its index only; the 5th one a process fetches is slow to load."""

    fetched = 0

    def __len__(self):
        return 10_000

    def __getitem__(self, index):
        Batches.fetched += 1
        if Batches.fetched == 5:
            injected("data_wait")
        data = torch.Generator().manual_seed(index)
        return torch.randn(16, generator=data), torch.randn(1, generator=data)


class SlowPickler(pickle.Pickler):
    """A checkpoint's pickler that takes its time: the sleep falls inside torch.save."""

    def __init__(self, *args, **kwargs):
        injected("checkpoint")
        super().__init__(*args, **kwargs)


slow_pickle = types.ModuleType("slow_pickle")
slow_pickle.__dict__.update({k: getattr(pickle, k) for k in dir(pickle) if not k.startswith("__")})
slow_pickle.Pickler = SlowPickler
restored = []


def restore(storage, location):
    """map_location: the first storage restored takes its time, inside torch.load."""
    if not restored:
        restored.append(True)
        injected("checkpoint_load")
    return storage


model = torch.nn.Linear(16, 1)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
start = 0
saved = sorted(ckpt_dir.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
if saved:
    checkpoint = torch.load(saved[-1], map_location=restore)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    start = checkpoint["step"]

loader = iter(torch.utils.data.DataLoader(Batches(), batch_size=8, sampler=range(start * 8, 10_000)))
for n, step in enumerate(range(start + 1, last_step + 1), start=1):
    inputs, targets = next(loader)
    optimizer.zero_grad()
    loss = ((model(inputs) - targets) ** 2).mean()
    loss.backward()
    optimizer.step()
    time.sleep(0.005)  # the rest of a step's work
    if n == 10:
        model.eval()
        with torch.no_grad():
            model(inputs)
        injected("eval")
        model.train()
    if step % 20 == 0:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        torch.save(state, ckpt_dir / f"step-{step}.pt", pickle_module=slow_pickle)
    if step == hang_at:
        injected("hang")
    if step == stop_after:
        time.sleep(0.1)
        # The agent sends it with the rows before it within a window, or, the loop gone quiet, once its flush thread
        # looks (at most a second later: trainmeter_agent/_outbox.py, QUIET_MAX_S). The test kills once the log holds
        # it; the wait here makes the time from the last step to the kill the same in every attempt and run (the time
        # after the last step, one of the buckets the test compares), not one flush thread's phase.
        emit(stopped_at=step)
        time.sleep(1.5)
        (ckpt_dir / "stopped").write_text(str(os.getpid()))
        while True:
            time.sleep(1)
