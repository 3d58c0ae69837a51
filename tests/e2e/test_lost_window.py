"""A training process killed by SIGKILL cannot flush: it loses at most the records of the one window its agent had open,
and the run says so (a notice in the log and on stderr, and in summary.json). Windows are counted, not timed: the
window here closes by its record count alone (TM_AGENT_FLUSH_RECORDS), with a deadline far away."""

from __future__ import annotations

import json

import pytest
from tm_runs import log_records, only_run, run_tm

WINDOW_RECORDS = 4
# emit(step=) declares one step record per call and nothing else: steps 1-4 and 5-8 leave as two full windows, steps
# 9 and 10 are the window still open when the process kills itself.
LOOP = """
import json, os, pathlib, signal, sys, time
from trainmeter_agent import emit

def logged_steps():
    steps = []
    for segment in sorted(pathlib.Path(os.environ["TM_RUN_DIR"]).glob("events-*.jsonl")):
        for line in segment.read_text().splitlines():
            record = json.loads(line)
            if record["kind"] == "step":
                steps.append(record["step"])
    return steps

for i in range(1, {steps} + 1):
    emit(step=i)
    print(i, flush=True)
    if i % {window} == 0:
        # A closed window has left the process (zmq's own thread sends it): wait until the run's log holds it, so
        # that what the kill below can take is the open window alone.
        deadline = time.monotonic() + 30
        while i not in logged_steps() and time.monotonic() < deadline:
            time.sleep(0.05)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("steps", [10, 12])
def test_sigkill_loses_at_most_the_open_window_and_the_run_says_so(tm_env, tmp_path, steps):
    script = tmp_path / "loop.py"
    script.write_text(LOOP.format(steps=steps, window=WINDOW_RECORDS))
    env = dict(
        tm_env,
        TM_AGENT_FLUSH_RECORDS=str(WINDOW_RECORDS),
        TM_AGENT_FLUSH_S="3600",
        TM_DISABLE_COMPONENTS="web",
    )
    result = run_tm([str(script)], env, timeout=120, cwd=tmp_path)
    assert result.returncode == 128 + 9, result.stderr
    done = [int(line) for line in result.stdout.split()]
    assert done == list(range(1, steps + 1))  # the loop got through every step before it was killed

    run = only_run(tmp_path / "runs")
    records = log_records(run)
    logged = [r["step"] for r in records if r["kind"] == "step"]
    # 10 steps: two windows of 4 left (8 steps), 2 were lost; 12 steps: three windows left, none open (0 lost).
    full_windows = steps // WINDOW_RECORDS
    assert logged == list(range(1, full_windows * WINDOW_RECORDS + 1))
    lost = steps - len(logged)
    assert lost < WINDOW_RECORDS  # less than one window: counted in windows, never in milliseconds
    assert lost == steps % WINDOW_RECORDS

    notices = [r for r in records if r["kind"] == "notice" and r["topic"] == "agent.lost_window"]
    assert (
        len(notices) == 1
    )  # the process said hello and never goodbye, whether or not its last window held any
    assert (
        "ended without saying goodbye" in notices[0]["message"]
        and f"{WINDOW_RECORDS} of its records" in (notices[0]["message"])
    )
    assert notices[0]["message"] in result.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert len(summary["bus"]["ended_without_bye"]) == 1
    assert summary["bus"]["ended_without_bye"][0].startswith("agent@")


def test_a_process_that_exits_normally_loses_nothing_and_no_loss_is_said(tm_env, tmp_path):
    script = tmp_path / "loop.py"
    script.write_text("from trainmeter_agent import emit\nfor i in range(1, 11):\n    emit(step=i)\n")
    env = dict(
        tm_env,
        TM_AGENT_FLUSH_RECORDS=str(WINDOW_RECORDS),
        TM_AGENT_FLUSH_S="3600",
        TM_DISABLE_COMPONENTS="web",
    )
    result = run_tm([str(script)], env, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run = only_run(tmp_path / "runs")
    records = log_records(run)
    # The open window (steps 9 and 10) leaves at exit, before the bye.
    assert [r["step"] for r in records if r["kind"] == "step"] == list(range(1, 11))
    assert not [r for r in records if r["kind"] == "notice" and r["topic"] == "agent.lost_window"]
    assert json.loads((run / "summary.json").read_text())["bus"]["ended_without_bye"] == []
    assert "ended without saying goodbye" not in result.stderr


# A tight torch loop (the benches' loop: DataLoader batch 1, Embedding + Linear, AdamW) that kills itself after
# {kill_at} optimizer steps. Each step is one row of the agent's window (its loss read at backward() rides in it) and
# each batch's data wait another: a window of WINDOW_ROWS rows holds about half as many steps. It waits half a second
# before the kill, so that every window already handed to the bus has reached the hub: what the kill takes is the open
# window alone.
TORCH_LOOP = """
import os, signal, time
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
ids = torch.randint(16, (4096, 8))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=1)
model = torch.nn.Sequential(torch.nn.Embedding(16, 4), torch.nn.Linear(4, 16))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for i, (batch,) in enumerate(loader, start=1):
    loss = torch.nn.functional.cross_entropy(model(batch).flatten(0, 1), batch.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if i == {kill_at}:
        break
print(i, flush=True)
time.sleep(0.5)
os.kill(os.getpid(), signal.SIGKILL)
"""
WINDOW_ROWS = 64


def test_a_killed_torch_loop_says_how_many_steps_it_lost_and_the_log_holds_the_rest(tm_env, tmp_path, torch):
    import re

    script = tmp_path / "loop.py"
    kill_at = 1000
    script.write_text(TORCH_LOOP.format(kill_at=kill_at))
    env = dict(
        tm_env,
        TM_AGENT_FLUSH_RECORDS=str(WINDOW_ROWS),
        TM_AGENT_FLUSH_S="3600",
        TM_DISABLE_COMPONENTS="web",
    )
    result = run_tm([str(script)], env, timeout=300, cwd=tmp_path)
    assert result.returncode == 128 + 9, result.stderr
    assert result.stdout.split() == [str(kill_at)]

    run = only_run(tmp_path / "runs")
    records = log_records(run)  # blocks read as the records they stand for
    logged = [r["step"] for r in records if r["kind"] == "step"]
    assert logged == list(range(1, len(logged) + 1))  # each step once, in order, from the first
    (notice,) = [r for r in records if r["kind"] == "notice" and r["topic"] == "agent.lost_window"]
    said = re.search(r"lost (\d+) of the (\d+) steps it counted \((\d) flush windows?\)", notice["message"])
    assert said, notice["message"]
    lost, counted, windows = (int(x) for x in said.groups())
    assert counted == kill_at  # the step page held the agent's count after the kill
    assert counted == len(logged) + lost  # every counted step is in the log or said lost
    assert lost < WINDOW_ROWS and windows == (1 if lost else 0)  # at most the one window that was open
    assert "never arrived" not in notice["message"]  # nothing handed to the bus went missing
    assert notice["message"] in result.stderr
