"""Each of the agent's hooks timed where it runs, inside the tight loop, in this checkout and in another one: what the
optimizer's step pre-hook, the DataLoader's ``__next__``, the model's ``forward`` and ``torch.autograd.backward``
cost with every probe on, less what they cost with every probe off (the hooks still called).

A worker runs ``bench_agent.py``'s tight loop with tm's agent in its own process (a hub stand-in takes its windows, and
the step page is mapped, as in a run under tm) and wraps each hook with a clock read on each side; it switches every
probe on and off in alternating blocks of ``--per-block`` iterations, ``--pairs`` pairs, and prints, for each hook, the
median over the pairs of the difference between the two blocks' mean call (the slowest 5% of calls of a block left
out: a flush, a page fault). The clocks around a call cost both blocks the same. The two checkouts' workers alternate,
``--rounds`` rounds, and each figure is the median over the rounds.

Why per hook, and in the loop: an agent's iteration on the tight loop costs mostly what torch's work between its hooks
pushed out of the caches (the objects and the C code a hook touches), not its bytecode, so a change is measured where
it runs or not at all; a bare microbenchmark of a hook runs it warm. And why several processes: the same code measures
up to 20% apart from one process to the next (where its objects landed), so a round is a process of each checkout.

Run: ``PYTHONPATH=. .venv/bin/python bench/bench_agent_hooks.py [--baseline CHECKOUT] [--rounds 8]``
Prints figures; asserts nothing.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from bench_agent import _hub_stand_in
from checkouts import compare

# argv: pairs, per_block. Run in the checkout's folder (its own bench/tight_loop.py and trainmeter_agent).
WORKER = """
import json, statistics, sys, time
sys.path.insert(0, "bench")
import trainmeter_agent._bootstrap
import trainmeter_agent
agent = trainmeter_agent._start()
import torch
import torch.optim.optimizer as optimizer_module
import torch.utils.data.dataloader as dataloader_module
from tight_loop import made_here, timed_run
loader, model, optimizer, source = made_here(torch)
agent.iterations.attach()
pairs, per_block = int(sys.argv[1]), int(sys.argv[2])
run = timed_run(torch, model, optimizer, source)

def switch(on):
    agent.iterations.steps_on = on
    agent.model.on = on
    agent.loss.on = on
    (agent.stopped.discard if on else agent.stopped.add)("data_wait")
    agent.regate()

run(500)
clock = time.perf_counter_ns
spent = {"step pre-hook": [], "DataLoader __next__": [], "model forward": [], "autograd backward": []}

def timed(calls, function):
    def call(*args, **kwargs):
        started = clock()
        result = function(*args, **kwargs)
        calls.append(clock() - started)
        return result
    return call

hooks = optimizer_module._global_optimizer_pre_hooks
key = next(iter(hooks))
hooks[key] = timed(spent["step pre-hook"], hooks[key])
iterator = dataloader_module._BaseDataLoaderIter
iterator.__next__ = timed(spent["DataLoader __next__"], iterator.__next__)
forward = model.__dict__["forward"]
class _Timed:  # what tm set on the model is an object whose __call__ nn.Module calls: the clock goes around it
    __call__ = staticmethod(timed(spent["model forward"], forward))
model.__dict__["forward"] = _Timed()
torch.autograd.backward = timed(spent["autograd backward"], torch.autograd.backward)

def block():
    for calls in spent.values():
        calls.clear()
    run(per_block)
    means = {}
    for name, calls in spent.items():
        kept = sorted(calls)[: max(1, len(calls) * 95 // 100)]
        means[name] = statistics.fmean(kept) / 1e3
    return means

differences = {name: [] for name in spent}
for pair in range(pairs):
    means = {}
    for on in (True, False) if pair % 2 else (False, True):
        switch(on)
        run(5)
        means[on] = block()
    for name in spent:
        differences[name].append(means[True][name] - means[False][name])
figures = {name + ", on less off": statistics.median(values) for name, values in differences.items()}
figures["the four hooks, on less off"] = sum(figures.values())
switch(True)
print(json.dumps(figures))
agent.at_exit()
"""


def main() -> None:
    socket_dir = tempfile.mkdtemp(dir="/tmp", prefix="tm-hooks-")
    endpoint = f"ipc://{socket_dir}/in"
    pages = os.path.join(socket_dir, "pages")
    os.mkdir(pages)
    close_hub = _hub_stand_in(endpoint)
    for name in [name for name in os.environ if name.startswith("TM_")]:
        del os.environ[name]
    os.environ.update(OMP_NUM_THREADS="1", TM_AGENT="1", TM_AGENT_ENDPOINT=endpoint, TM_AGENT_PAGES=pages)
    try:
        compare(
            __doc__,
            WORKER,
            ("60", "40"),
            "the agent's hooks timed in the tight loop, every probe on less every probe off, a fresh process a round",
            2,
            os.path.basename(__file__),
        )
    finally:
        close_hub()
        shutil.rmtree(socket_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
