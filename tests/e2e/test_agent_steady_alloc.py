"""The agent's steady iteration allocates nothing that lives on (issue 42): a tight torch loop under the agent, warmed,
then 10,000 iterations between two tracemalloc snapshots, whose difference in the agent's own files is nothing.

What this proves: no object allocated by a line of ``trainmeter_agent/*`` during those iterations is still alive at
their end beyond what was alive at their start: no list that grows, no record or tuple kept per step, no cache filling
up. Flushes are left on and counted (about one window every 50 ms, or every 1000 rows): a window's blocks are
allocated and freed within its flush, and the test checks some windows did leave; a flush just before each snapshot
empties the window, so that what waits in it is not counted at one snapshot and not the other.

Which line tracemalloc names for an object depends on where its memory was first taken: a float or a tuple taken from
CPython's free list keeps the line of whoever made the object that list held. So what an iteration replaces (its start
time, a count) would be named by chance at one snapshot and not at the other. Both snapshots are therefore taken after
the same sequence: a flush, a full collection (which empties the free lists), then AGENT_US_EVERY iterations (each
state an iteration replaces, the agent's timed ones included, made again from empty free lists, so the same way
before both snapshots), and a flush. The measured iterations are a multiple of the overhead fact's period (256), so
both sequences fall at the same place of every period the agent keeps. What it does not prove: that an
iteration allocates nothing at all. A float or int made and dropped within an iteration (a clock read, a step number
replacing the last) is freed before the next snapshot and cancels out; their cost is time, which bench/bench_agent.py
measures. Nor does it see allocations made by torch or by the producer's own module on the agent's behalf.
"""

from __future__ import annotations

import json

# One busy process a test and nothing timed: beside the heavy tests, not in their line (docs/architecture.md,
# "Tests").

# The benches' tight loop (bench/tight_loop.py: Embedding + Linear, DataLoader batch 1, AdamW), warmed, then measured.
# Prints the positive differences of the agent's files between the two snapshots, and the windows sent between them.
LOOP = """
import gc, json, sys, time, tracemalloc
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
WARM, MEASURED = 200, 10_240  # 40 periods of the overhead fact (256 steps)
{model}
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=1)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
{leak}
import trainmeter_agent
agent = trainmeter_agent._process_agent  # the agent sitecustomize started

def iterate(batches, n):
    for _ in range(n):
        (batch,) = next(batches)
        loss = {loss}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

batches = iter(loader)
iterate(batches, WARM)
tracemalloc.start()
# What each iteration replaces is traced before the first snapshot, and so is what the flush thread holds while it
# sleeps (it wakes at most every QUIET_MAX_S and a window): traced iterations for three seconds.
warm_until = time.monotonic() + 3.0
while time.monotonic() < warm_until:
    iterate(batches, 10)
agent_files = [tracemalloc.Filter(True, "*/trainmeter_agent/*")]


def settle():
    # Both snapshots after the same sequence (the docstring): the window's rows and records (an overhead fact) that
    # wait for their flush would otherwise be counted at one snapshot and not the other, and what an iteration
    # replaces is made again after the free lists of floats, lists and tuples were emptied.
    agent.outbox.flush()
    gc.collect()
    iterate(batches, 16)  # AGENT_US_EVERY
    agent.outbox.flush()
    gc.collect()
    # Under the outbox's lock: the flush thread, if it wakes now, waits at its acquire, where it holds nothing.
    with agent.outbox._lock:
        return tracemalloc.take_snapshot().filter_traces(agent_files)


before = settle()
# A copy (``+ 0`` makes a new int here): the agent's own count, made in its file, kept alive by this test until the
# second snapshot would be one more object of the agent's at it.
windows = agent.outbox.windows + 0
iterate(batches, MEASURED - 16)
after = settle()
windows = agent.outbox.windows - windows
tracemalloc.stop()
grown = [
    {{"where": str(stat.traceback), "count": stat.count_diff, "size_b": stat.size_diff}}
    for stat in after.compare_to(before, "lineno")
    if stat.count_diff > 0 or stat.size_diff > 0
]
general = agent.general_steps if hasattr(agent, "general_steps") else None
print(json.dumps({{"grown": grown, "windows": windows, "steady": agent.iterations.steady, "general": general}}))
"""
# What a deliberate leak looks like (the test's own proof that it can fail): every step row kept in a list.
LEAK = """
from trainmeter_agent import _outbox
_put_step = _outbox.Outbox.put_step
_kept = []
def _leaky(self, *args):
    _kept.append(args)
    return _put_step(self, *args)
_outbox.Outbox.put_step = _leaky
"""

# The overhead fact (at most once a second) went out at every period before the first snapshot and never after it: what
# the agent keeps of its cost between two facts must leave nothing behind, whenever the last one went out.
FACT_THEN_NONE = """
import tracemalloc as _tracemalloc
from trainmeter_agent import _step_records
_step_records.OVERHEAD_MIN_S = 0.0
_take_snapshot = _tracemalloc.take_snapshot
def _then_never(*args, **kwargs):
    snapshot = _take_snapshot(*args, **kwargs)
    _step_records.OVERHEAD_MIN_S = float("inf")
    return snapshot
_tracemalloc.take_snapshot = _then_never
"""


# The model and loss of the loop: token ids into an embedding, or floats into a linear layer (a model fed no token
# ids: its steps have no token count, and take the steady way all the same)
IDS = {
    "model": """ids = torch.randint(16, (100_000, 8))
model = torch.nn.Sequential(torch.nn.Embedding(16, 4), torch.nn.Linear(4, 16))""",
    "loss": "torch.nn.functional.cross_entropy(model(batch).flatten(0, 1), batch.flatten())",
}
FLOATS = {
    "model": """ids = torch.randn(100_000, 8)
model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 8))""",
    "loss": "(model(batch) - batch).pow(2).mean()",
}


def _grown(run, leak: str = "", loop: dict[str, str] = IDS) -> dict:
    done = run.python(["-c", LOOP.format(leak=leak, **loop)], run.env())
    return json.loads(done.stdout)


def test_ten_thousand_steady_iterations_leave_nothing_allocated_in_the_agents_files(run, torch):
    measured = _grown(run)
    assert measured["steady"]  # the iterations took the steady way the test is about
    assert measured["windows"] > 0  # flushes were on: windows left during the measured iterations
    assert measured["grown"] == []


# The steps built the general way (send_step), counted in the test's own code: what tracemalloc is not filtered to.
GENERAL_COUNTED = """
from trainmeter_agent import _agent
_send_step = _agent.Agent.send_step
def _counted(self, fields):
    self.general_steps = getattr(self, "general_steps", 0) + 1
    return _send_step(self, fields)
_agent.Agent.send_step = _counted
"""


def test_a_loop_fed_no_token_ids_takes_the_steady_way_and_leaves_nothing_either(run, torch):
    measured = _grown(run, GENERAL_COUNTED, FLOATS)
    assert measured["steady"] and measured["windows"] > 0
    # Of about 10,500 steps, the general way built the process's first and the FLOP counter's alone.
    assert measured["general"] == 2
    assert measured["grown"] == []


def test_the_overhead_facts_timing_leaves_nothing_either(run, torch):
    # Its sums since the last fact were a float and an int made at each timed step (an int past 256 is an object):
    # one more of each at the second snapshot than at the first, seen once by CI in a loaded run.
    measured = _grown(run, FACT_THEN_NONE)
    assert measured["steady"] and measured["windows"] > 0
    assert measured["grown"] == []


def test_a_step_row_kept_per_iteration_is_seen(run, torch):
    # The leak's tuples are made in the agent's files (_step_records.py calls put_step with them): the test sees them.
    measured = _grown(run, LEAK)
    assert sum(entry["count"] for entry in measured["grown"]) >= 10_000
