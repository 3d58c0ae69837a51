"""A subscriber of a live run that asks for ``step`` records gets each step once, in order, though the agent sends
its steady steps in blocks: the subscriber expands them (issue 42). Its steps, with their sequence numbers, are the
log's, and so are the losses of a subscriber of ``metric`` records."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from deadline import wait_for
from tm_runs import TM, log_records, only_run

pytestmark = pytest.mark.xdist_group("heavy")

STEPS = 1500

# The benches' tight loop, which waits for the subscriber to be listening (the file "go") before its first step.
LOOP = """
import os, pathlib, time
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
go = pathlib.Path(os.environ["GO_FILE"])
while not go.exists():
    time.sleep(0.02)
ids = torch.randint(16, ({steps}, 8))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=1)
model = torch.nn.Sequential(torch.nn.Embedding(16, 4), torch.nn.Linear(4, 16))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for (batch,) in loader:
    loss = torch.nn.functional.cross_entropy(model(batch).flatten(0, 1), batch.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

# Listens for steps, losses and ticks; says "ready" at its first tick (its subscription is live then), and at the end
# prints what it received as JSON.
SUBSCRIBER = """
import json, sys
from trainmeter_core.api import subscribe

steps, losses, ready = [], [], False
for record in subscribe(sys.argv[1], kinds=["step", "metric", "tick"]):
    if record.kind == "tick" and not ready:
        ready = True
        print("ready", flush=True)
    elif record.kind == "step":
        steps.append([record.step, record.seq])
    elif record.kind == "metric" and "train_loss" in record.values:
        losses.append([record.step, record.seq])
print(json.dumps({"steps": steps, "losses": losses}), flush=True)
"""


def test_a_live_subscriber_of_steps_gets_each_step_once_in_order_as_the_log_has_it(tm_env, tmp_path, torch):
    loop, listener, go = tmp_path / "loop.py", tmp_path / "listen.py", tmp_path / "go"
    loop.write_text(LOOP.format(steps=STEPS))
    listener.write_text(SUBSCRIBER)
    env = dict(tm_env, GO_FILE=str(go), TM_DISABLE_COMPONENTS="web")
    tm = subprocess.Popen(
        [TM, "--no-web", "--", sys.executable, str(loop)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    sub = None
    try:
        runs = tmp_path / "runs"
        wait_for(lambda: runs.is_dir() and any(runs.glob("*/endpoints.json")), 60, "the run to start")
        run = only_run(runs)
        sub = subprocess.Popen(
            [sys.executable, str(listener), str(run)],
            env=tm_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert sub.stdout.readline().strip() == "ready", sub.stderr.read()
        go.write_text("")
        out, err = sub.communicate(timeout=300)
    finally:
        go.write_text("")
        tm.wait(300)
        if sub is not None and sub.poll() is None:
            sub.kill()
    assert tm.returncode == 0, tm.stderr.read()
    assert sub.returncode == 0 and err == "", err
    got = json.loads(out.splitlines()[-1])
    logged = log_records(run)  # the log's blocks as the records they stand for
    # Every step once, in order, with the sequence numbers the log gives them.
    assert [step for step, _ in got["steps"]] == list(range(1, STEPS + 1))
    assert got["steps"] == [[r["step"], r["seq"]] for r in logged if r["kind"] == "step"]
    assert got["losses"] == [
        [r["step"], r["seq"]] for r in logged if r["kind"] == "metric" and "train_loss" in r["values"]
    ]
    assert len(got["losses"]) == STEPS  # every step's loss, never sampled
    # The agent did send blocks: most steps are rows of one, not records of their own.
    raw = log_records(run, blocks=True)
    in_blocks = sum(r["order"].count("s") for r in raw if r["kind"] == "block")
    assert in_blocks >= STEPS - 2, in_blocks
