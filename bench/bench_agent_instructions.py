"""What the agent costs a tight training loop, counted in instructions instead of seconds: each iteration of issue 16's
tight loop (Embedding(16, 4) + Linear(4, 16), DataLoader batch 1, AdamW, 1 thread) run under valgrind's callgrind,
plain, with do-nothing hooks at the agent's attach points, with one more thread that only sleeps, under the real
``tm`` with every probe on, and under trainmeter 0.0.7 (the previous generation) from its own venv. Prints figures;
asserts nothing.

Why instructions: on this shared 2-core machine the loop's CPU time per iteration moved by 2x from one day to the
next and by +-30 us between rounds of one run (``bench_agent.py``), more than the agent's whole cost. An instruction
count is the same on every run of the same code. It does not weigh cache misses or a slow instruction more than any
other, so it is a proxy for time, not time; ``bench_agent.py`` still measures the time. It is a poor proxy for the
agent's work: its instructions ran at a third to a seventh of the loop's pace. In valgrind's simulation they miss the
instruction cache 1.5 times and the branch predictor twice as often per instruction as the loop's own, which explains
part of it. Halving the agent's instructions (its hooks in C, tried in 0a0e4f6 and reverted) did not move its time
(docs/performance.md, "Instructions are not the agent's time").

Only the training thread's instructions inside the measured iterations count (callgrind's ``--toggle-collect`` on
``functools.reduce``, through which the loop runs them): the start, the warm-up and the agent's flush thread do not,
and neither does zmq's I/O thread (its C++ work is one message per window). Each variant closes its windows every
~250 iterations, as 50 ms do at ~200 us per iteration: tm by record count, 0.0.7 (which flushes by time alone, and
valgrind runs the loop ~50x slower) by its flush interval set to 250 measured iterations.

``--breakdown`` runs the loop in one process with the agent installed in it and each probe switched on alone.

Run: ``.venv/bin/python bench/bench_agent_instructions.py [--iterations 1000] [--peer-venv /work/peer] [--breakdown]``
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from tight_loop import DATA_AND_MODEL

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARM_UP = 300  # iterations before the measured ones: lazy inits, the agent's hello, its counted FLOP step
ITERATIONS_PER_WINDOW = 250

_LOOP = (
    """
import functools, sys, threading, time
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
warm_up, n, hooks = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "empty-hooks"
if sys.argv[3] == "sleeping-thread":  # a second thread that never runs: what merely having one costs the loop
    threading.Thread(target=time.sleep, args=(1e9,), daemon=True).start()
"""
    + DATA_AND_MODEL[1:]
    + """if hooks:
    import torch.optim.optimizer as optimizer_module
    import torch.utils.data.dataloader as dataloader
    plain_next, plain_backward = dataloader._BaseDataLoaderIter.__next__, torch.autograd.backward
    def timed_next(self):
        started = time.monotonic()
        batch = plain_next(self)
        time.monotonic()
        return batch
    def seen_backward(*args, **kwargs):
        return plain_backward(*args, **kwargs)
    class Forward:  # a forward set on the model, as tm's model probe sets it
        def __init__(self, module):
            self.module, self.function = module, type(module).forward
        def __call__(self, *args, **kwargs):
            return self.function(self.module, *args, **kwargs)
    dataloader._BaseDataLoaderIter.__next__ = timed_next
    torch.autograd.backward = seen_backward
    model.__dict__["forward"] = Forward(model)
    optimizer_module.register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: None)
def batches():
    while True:
        yield from loader
source = batches()
def iteration(carried, _):
    (x,) = next(source)
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    optimizer.step()
    return carried
started = time.perf_counter()
for _ in range(warm_up):
    iteration(None, None)
per_iteration_s = (time.perf_counter() - started) / warm_up
previous_generation = sys.modules.get("trainmeter.agent.core")  # 0.0.7's agent: it flushes by time alone
if previous_generation is not None:
    previous_generation.FLUSH_INTERVAL = WINDOW * per_iteration_s
functools.reduce(iteration, range(n), None)  # the measured iterations: callgrind counts inside reduce only
"""
)


def _callgrind(out: str) -> list[str]:
    return [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=no",
        "--toggle-collect=functools_reduce",
        f"--callgrind-out-file={out}",
    ]


def _collected(stderr: str) -> int | None:
    found = re.search(r"Collected : (\d+)", stderr)
    return int(found.group(1)) if found else None


def _variants(iterations: int, peer_venv: str | None, work: str) -> dict[str, tuple[list[str], dict]]:
    script = os.path.join(work, "loop.py")
    with open(script, "w") as f:
        f.write(_LOOP.replace("WINDOW", str(ITERATIONS_PER_WINDOW)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TM_")}
    # A fixed hash seed: dict and set layouts, hence a few thousand instructions an iteration, move with it.
    env.update(
        OMP_NUM_THREADS="1", PYTHONHASHSEED="0", PYTHONPATH=REPO, TM_RUNS_DIR=os.path.join(work, "runs")
    )
    # tm closes a window at 1000 items or 50 ms; here at 500 items (a steady step and its data wait are two).
    tm_env = dict(env, TM_AGENT_FLUSH_S="1e9", TM_AGENT_FLUSH_RECORDS=str(2 * ITERATIONS_PER_WINDOW))
    python, tm = sys.executable, os.path.join(os.path.dirname(sys.executable), "tm")
    args = [str(WARM_UP), str(iterations)]

    def under(name: str, command: list[str]) -> list[str]:
        return [*_callgrind(os.path.join(work, f"{name}.out")), *command]

    variants = {
        "plain": (under("plain", [python, script, *args, "plain"]), env),
        "empty hooks": (under("hooks", [python, script, *args, "empty-hooks"]), env),
        # No agent, one more thread, asleep: glibc's malloc takes its arena lock in a process with two threads, and
        # tm's agent has two (zmq's I/O thread and the flush timer), where 0.0.7's has none.
        "plain, 2 threads": (under("thread", [python, script, *args, "sleeping-thread"]), env),
        "tm": ([tm, "-q", "--no-web", "--", *under("tm", [python, script, *args, "plain"])], tm_env),
    }
    if peer_venv:
        peer_python, peer_tm = os.path.join(peer_venv, "bin", "python"), os.path.join(peer_venv, "bin", "tm")
        if os.path.exists(peer_python) and os.path.exists(peer_tm):
            peer_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
            variants["0.0.7 plain"] = (under("peer-plain", [peer_python, script, *args, "plain"]), peer_env)
            variants["0.0.7"] = (
                [peer_tm, "-q", "--no-web", "--", *under("peer", [peer_python, script, *args, "plain"])],
                peer_env,
            )
        else:
            print(f"0.0.7 not found in {peer_venv}: its rows are left out")
    return variants


def bench_loops(iterations: int, peer_venv: str | None) -> None:
    work = tempfile.mkdtemp(prefix="tm-bench-instr-")
    try:
        variants = _variants(iterations, peer_venv, work)

        def run(item):
            name, (argv, env) = item
            done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=work)
            count = _collected(done.stderr)
            if done.returncode != 0 or count is None:
                tail = done.stderr.strip().splitlines()[-3:]
                print(f"  {name}: failed (exit {done.returncode}): {tail}")
            return name, count

        with ThreadPoolExecutor(max_workers=2) as pool:  # one valgrind per core
            counts = dict(pool.map(run, variants.items()))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    per = {name: count / iterations for name, count in counts.items() if count is not None}
    print(f"instructions per iteration of the tight loop ({iterations} measured iterations after {WARM_UP}):")
    for name, value in per.items():
        base = per.get("0.0.7 plain" if name.startswith("0.0.7") else "plain")
        added = (
            f"  adds {value - base:9,.0f}"
            if base is not None and name not in ("plain", "0.0.7 plain")
            else ""
        )
        print(f"  {name:<16} {value:12,.0f}{added}")
    if {"tm", "plain", "0.0.7", "0.0.7 plain"} <= set(per):
        tm_added, peer_added = per["tm"] - per["plain"], per["0.0.7"] - per["0.0.7 plain"]
        print(
            f"  tm adds {tm_added / peer_added:.2f}x what 0.0.7 adds ({tm_added:,.0f} against {peer_added:,.0f})"
        )


# --------------------------------------------------------------------------------------------------------------------
# The per-probe breakdown: the agent installed in one process, each probe on alone, each configuration counted through
# its own C function (callgrind reports each one's inclusive count).

_ENTRIES = (
    "takewhile_next",
    "dropwhile_next",
    "filterfalse_next",
    "starmap_next",
    "accumulate_next",
    "functools_reduce",
)
# The tight loop is written out again here, its ``iteration`` taking ``*_`` (the itertools entries call it with one
# argument) where ``_LOOP``'s takes two: sharing one definition moved the counts of the figures in docs/performance.md
# (the plain loop by 2.4k an iteration, what the do-nothing hooks add from 23.6k to 18.4k), so the two stay apart.
_BREAKDOWN = (
    """
import functools, itertools, os, subprocess, sys, tempfile
socket_dir = tempfile.mkdtemp(dir="/tmp")
endpoint = f"ipc://{socket_dir}/in"
# A PULL socket drained by another process stands in for the hub.
drain = subprocess.Popen([sys.executable, "-c", "import sys, zmq\\nsocket = zmq.Context().socket(zmq.PULL)\\n"
                          "socket.bind(sys.argv[1])\\nprint('bound', flush=True)\\nwhile True: socket.recv_multipart()",
                          endpoint], stdout=subprocess.PIPE, text=True)
drain.stdout.readline()
os.environ.update(TM_AGENT="1", TM_AGENT_ENDPOINT=endpoint)
import trainmeter_agent
from trainmeter_agent._forward import set_forward
agent = trainmeter_agent._start()
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
n = int(sys.argv[1])
"""
    + DATA_AND_MODEL[1:]
    + """def batches():
    while True:
        yield from loader
source = batches()
def iteration(*_):
    (x,) = next(source)
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    optimizer.step()
    return True
for _ in range(50):
    iteration()
assert agent.model.root() is model, "the model probe did not adopt the model"
iter_class = torch.utils.data.dataloader._BaseDataLoaderIter
wrapped_next, wrapped_backward = iter_class.__next__, torch.autograd.backward
def switch(steps, model_probe, data_wait, loss):
    agent.iterations.attach() if steps else agent.iterations.detach()
    for handle in agent.model._handles:
        handle.remove()
    agent.model._handles = [set_forward(agent.model, model, torch)] if model_probe else []
    iter_class.__next__ = wrapped_next if data_wait else wrapped_next.__wrapped__
    torch.autograd.backward = wrapped_backward if loss else wrapped_backward.__wrapped__
entries = {
    "takewhile_next": lambda n: list(itertools.takewhile(iteration, range(n))),
    "dropwhile_next": lambda n: list(itertools.dropwhile(iteration, range(n))),
    "filterfalse_next": lambda n: list(itertools.filterfalse(iteration, range(n))),
    "starmap_next": lambda n: list(itertools.starmap(iteration, ((i,) for i in range(n)))),
    "accumulate_next": lambda n: list(itertools.accumulate(range(n), iteration)),
    "functools_reduce": lambda n: functools.reduce(iteration, range(n), None),
}
configs = [("takewhile_next", (False, False, False, False)), ("dropwhile_next", (True, False, False, False)),
           ("filterfalse_next", (False, True, False, False)), ("starmap_next", (False, False, True, False)),
           ("accumulate_next", (False, False, False, True)), ("functools_reduce", (True, True, True, True))]
for entry, config in configs:
    switch(*config)
    for _ in range(100):
        iteration()
    entries[entry](n)
switch(True, True, True, True)
agent.at_exit()
drain.kill()
"""
)
_NAMES = {
    "takewhile_next": "no probe",
    "dropwhile_next": "steps alone",
    "filterfalse_next": "model alone",
    "starmap_next": "data wait alone",
    "accumulate_next": "loss alone",
    "functools_reduce": "every probe",
}


def bench_breakdown(iterations: int) -> None:
    work = tempfile.mkdtemp(prefix="tm-bench-instr-")
    out = os.path.join(work, "breakdown.out")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TM_")}
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONHASHSEED="0",
        PYTHONPATH=REPO,
        TM_AGENT_FLUSH_S="1e9",
        TM_AGENT_FLUSH_RECORDS=str(2 * ITERATIONS_PER_WINDOW),
    )
    toggles = [f"--toggle-collect={entry}" for entry in _ENTRIES]
    try:
        argv = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            *toggles,
            f"--callgrind-out-file={out}",
        ]
        done = subprocess.run(
            [*argv, sys.executable, "-c", _BREAKDOWN, str(iterations)],
            env=env,
            capture_output=True,
            text=True,
            cwd=work,
        )
        if done.returncode != 0:
            print(f"breakdown failed: {done.stderr.strip().splitlines()[-3:]}")
            return
        report = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", out], capture_output=True, text=True
        ).stdout
    finally:
        shutil.rmtree(work, ignore_errors=True)
    counts = {}
    for line in report.splitlines():
        found = re.match(r"\s*([\d,]+)\s.*:(\w+) \[", line)
        if found and found.group(2) in _ENTRIES:
            counts[found.group(2)] = int(found.group(1).replace(",", "")) / iterations
    base = counts.get("takewhile_next")
    print(f"per-probe breakdown, in one process, instructions per iteration ({iterations} iterations each):")
    for entry in _ENTRIES:
        if entry in counts and base is not None:
            print(f"  {_NAMES[entry]:<16} {counts[entry]:12,.0f}  adds {counts[entry] - base:9,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=1000, help="measured iterations per variant")
    parser.add_argument("--peer-venv", default=os.environ.get("TM_PEER_VENV") or "/work/peer")
    parser.add_argument(
        "--breakdown", action="store_true", help="also the per-probe breakdown in one process"
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind): nothing measured")
        return
    print(
        f"reproduce: {sys.executable} bench/bench_agent_instructions.py --iterations {args.iterations} "
        f"--peer-venv {args.peer_venv}{' --breakdown' if args.breakdown else ''}"
    )
    bench_loops(args.iterations, args.peer_venv)
    if args.breakdown:
        bench_breakdown(args.iterations)


if __name__ == "__main__":
    main()
