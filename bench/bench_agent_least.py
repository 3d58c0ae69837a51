"""The least a Python agent can cost the tight loop while keeping what tm keeps of each step, beside what tm's agent
costs, both measured the same way: a lower bound for issue 42's "agent alone" target.

The least agent (``_LEAST``, written for this bench only) hooks where tm's probes hook in a steady iteration (the
DataLoader's ``__next__``, a ``forward`` set on the model, ``torch.autograd.backward``, the global optimizer step
pre-hook) and keeps one sleeping thread, as the floor in ``bench_agent.py`` does; switched on, it does only what the
records tm keeps need, with no check beyond one that keeps a GPU loss from being read by ``item()``: the data wait's
start and end into two preallocated lists; each forward's micro-batch and token count (the ids' ``numel()`` when they
are integers); the loss's ``item()`` after ``backward()``; and at the optimizer's step the row of the iteration that
ends there (step, time, interval, micro-batches, tokens, loss) into six preallocated lists. It tells a new iteration two
ways: by a forward seen since the last step (0.0.7's way), or by the first parameter's gradient and its version
(tm's way, which a second ``step()`` without a backward and two optimizers need), holding that gradient itself where
tm holds a weak reference. It sends nothing (a window's send is off the training thread in tm).

Both agents run the tight loop in a process of their own (``bench_agent.py``'s loop, one thread), switched between on
and off (off: their hooks still called, returning at once) in alternating blocks of ``--per-block`` iterations, each
iteration timed; a figure is the median over ``--pairs`` pairs of the difference of the two blocks' median iterations
(``bench_agent.py``'s breakdown, whose "every probe" line is tm's figure here). Trainmeter 0.0.7's agent (the previous
generation) is measured the same way in a third process, run by the Python of its own venv (``--peer-venv``),
installed as its bootstrap installs it, its probes switched by its own ``disabled`` set, its records sent to a
datagram socket another process drains. The processes alternate, ``--rounds`` rounds. Then each agent's line events
an iteration in its own code (a line trace of the training thread over 100 iterations, every hook on, then off), and
what tm's extra time comes to per extra line. Prints figures; asserts nothing.

Run: ``PYTHONPATH=. .venv/bin/python bench/bench_agent_least.py [--rounds 3] [--pairs 200] [--peer-venv /work/peer]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench_agent import _hub_stand_in

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)

# argv: pairs, per_block. The loop, then the paired blocks of its configurations; prints
# {"pairs": {name: [µs, ...]}, "off_us": median iteration with everything off}. With "lines" for pairs, the line
# events an iteration in the agent's code instead, every hook on and off: {"lines": n, "lines_off": n}.
_PAIRS = """
import json, statistics, sys, time
pairs = 0 if sys.argv[1] == "lines" else int(sys.argv[1])
per_block = int(sys.argv[2])
run = timed_run(torch, model, optimizer, source)
run(300)
if sys.argv[1] == "lines":
    # The line events an iteration in the agent's own code (``traced``), every hook on, then off: a line trace of the
    # training thread over 100 iterations
    lines = [0]
    def _line(frame, event, arg):
        if event == "line":
            lines[0] += 1
        return _line
    def _call(frame, event, arg):
        return _line if traced(frame.f_code) else None
    counted = {}
    for config in (EVERY, "off"):
        switch(config)
        run(50)
        lines[0] = 0
        sys.settrace(_call)
        run(100)
        sys.settrace(None)
        counted[config] = lines[0] / 100
    print(json.dumps({"lines": counted[EVERY], "lines_off": counted["off"]}))
    raise SystemExit
figures, offs = {name: [] for name in CONFIGS if name != "off"}, []
for pair in range(pairs):
    for name in figures:
        medians = {}
        for config in (name, "off") if pair % 2 else ("off", name):
            switch(config)
            run(5)
            times = []
            run(per_block, times)
            medians[config] = statistics.median(times)
        figures[name].append((medians[name] - medians["off"]) / 1e3)
        offs.append(medians["off"] / 1e3)
switch("off")
print(json.dumps({"pairs": figures, "off_us": statistics.median(offs)}))
"""

_LOOP_HEAD = f"""
import sys
sys.path.insert(0, {BENCH!r})
import torch
from tight_loop import made_here, timed_run
loader, model, optimizer, source = made_here(torch)
"""

# The least agent: the floor's hooks (bench_agent._FLOOR_HOOKS), each doing what the records need when switched on.
_LEAST = (
    _LOOP_HEAD
    + """
import threading
import torch.optim.optimizer as _optimizer_module
import torch.utils.data.dataloader as _dataloader
ROWS = 4096
DATA, FORWARD, LOSS, STEPS, BY_GRADIENT = 1, 2, 4, 8, 16
class _State:
    on = 0  # which hooks work (0: every hook returns at once); BY_GRADIENT: a step told by its first gradient
    micro = tokens = step = 0
    loss = t = 0.0
    grad = None
    version = -1
    waits = row = 0
S = _State()
wait_start, wait_end = [0.0] * ROWS, [0.0] * ROWS
rows = [[0] * ROWS for _ in range(6)]
step_col, t_col, interval_col, micro_col, tokens_col, loss_col = rows
_next = _dataloader._BaseDataLoaderIter.__next__
def _timed_next(self):
    started = time.monotonic()
    batch = _next(self)
    ended = time.monotonic()
    if S.on & DATA:
        i = S.waits
        wait_start[i] = started
        wait_end[i] = ended
        S.waits = i + 1 if i + 1 < ROWS else 0
    return batch
_dataloader._BaseDataLoaderIter.__next__ = _timed_next
_backward = torch.autograd.backward
def _seen_backward(*args, **kwargs):
    result = _backward(*args, **kwargs)
    if S.on & LOSS:
        loss = args[0]
        if loss.is_cpu:  # item() of a GPU loss would wait for the GPU
            S.loss += loss.item()
    return result
torch.autograd.backward = _seen_backward
_long = torch.long
_tensor = torch.Tensor
class _Forward:
    def __init__(self, module):
        self.module, self.function = module, type(module).forward
    def __call__(self, *args, **kwargs):
        if S.on & FORWARD:
            S.micro += 1
            ids = args[0] if args else None
            if type(ids) is _tensor and ids.dtype is _long:
                S.tokens += ids.numel()
        return self.function(self.module, *args, **kwargs)
model.__dict__["forward"] = _Forward(model)
def _pre_hook(optimizer, args, kwargs):
    if S.on & STEPS:
        now = time.monotonic()
        if S.on & BY_GRADIENT:
            grad = optimizer.param_groups[0]["params"][0].grad
            version = grad._version
            if grad is S.grad and version == S.version:
                return None  # stepped again without a backward
            S.grad, S.version = grad, version
        elif not S.micro:
            return None
        i = S.row
        step_col[i] = S.step
        t_col[i] = now
        interval_col[i] = now - S.t
        micro_col[i] = S.micro
        tokens_col[i] = S.tokens
        loss_col[i] = S.loss
        S.row = i + 1 if i + 1 < ROWS else 0
        S.step += 1
        S.t = now
        S.micro = S.tokens = 0
        S.loss = 0.0
    return None
_optimizer_module.register_optimizer_step_pre_hook(_pre_hook)
threading.Thread(target=threading.Event().wait, name="least-sleeper", daemon=True).start()
CONFIGS = {
    "off": 0,
    "every hook, a step told by its gradient": DATA | FORWARD | LOSS | STEPS | BY_GRADIENT,
    "every hook, a step told by a forward seen": DATA | FORWARD | LOSS | STEPS,
    "data wait": DATA,
    "forward": FORWARD,
    "loss": LOSS,
    "steps, told by the gradient": STEPS | BY_GRADIENT,
}
EVERY = "every hook, a step told by its gradient"
_HOOKS = {"_timed_next", "_seen_backward", "__call__", "_pre_hook"}
def traced(code):
    return code.co_filename == "<string>" and code.co_name in _HOOKS
def switch(config):
    S.on = CONFIGS[config]
    S.micro = S.tokens = 0
    S.loss = 0.0
"""
    + _PAIRS
)

# tm's agent in the process (as bench_agent.py's breakdown starts it: a hub stand-in takes its windows; its step page
# mapped, as under tm), every probe switched by its own switches.
_TM = (
    """
import os
import trainmeter_agent._bootstrap
import trainmeter_agent
agent = trainmeter_agent._start()
"""
    + _LOOP_HEAD
    + """
agent.iterations.attach()
def switch(config):
    every = config == "every probe"
    agent.iterations.steps_on = every
    agent.model.on = every or config == "forward"
    agent.loss.on = every or config == "loss"
    (agent.stopped.discard if every or config == "data wait" else agent.stopped.add)("data_wait")
    agent.regate()
EVERY = "every probe"
def traced(code):
    return "trainmeter_agent" in code.co_filename
# Each probe alone but the steps: alone, without the model probe's count, they take the general way, not the steady one
CONFIGS = {"off": 0, "every probe": 1, "data wait": 2, "forward": 3, "loss": 4}
"""
    + _PAIRS
    + """
agent.at_exit()
"""
)


# trainmeter 0.0.7's agent in the process, from its own venv, installed as its bootstrap installs it (before torch is
# imported; its records go to a datagram socket another process drains), every probe switched by its ``disabled`` set
# (its hooks stay: the steps' post-hook, the DataLoader's ``__next__``, the root module's forward pre-hook).
_PEER = (
    """
import sys
from trainmeter.agent import core as _core
_core.install()
agent = sys.meta_path[0]._agent  # the finder that attaches the agent when torch is imported
"""
    + _LOOP_HEAD
    + """
_PROBES = ("steps", "dataloader", "batch")
def switch(config):
    if config == "off":
        agent.disabled.update(_PROBES)
    else:
        agent.disabled.difference_update(_PROBES)
EVERY = "every probe"
def traced(code):
    return "/trainmeter/agent/" in code.co_filename
CONFIGS = {"off": 0, "every probe": 1}
"""
    + _PAIRS
)

# Drains 0.0.7's datagram socket (argv: its path), as 0.0.7's supervisor does.
_PEER_DRAIN = """
import socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.bind(sys.argv[1])
print("bound", flush=True)
while True:
    sock.recv(1 << 16)
"""


def _run(code: str, env: dict, pairs: int | str, per_block: int, python: str = sys.executable) -> dict:
    done = subprocess.run(
        [python, "-c", code, str(pairs), str(per_block)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"a worker failed ({done.returncode}): {done.stderr.strip()[-600:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _load() -> str:
    with open("/proc/loadavg") as f:
        return "load average " + " ".join(f.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--per-block", type=int, default=30)
    parser.add_argument("--peer-venv", default=os.environ.get("TM_PEER_VENV") or "/work/peer")
    args = parser.parse_args()
    command = (
        f"PYTHONPATH=. {sys.executable} bench/bench_agent_least.py --rounds {args.rounds} --pairs {args.pairs} "
        f"--per-block {args.per_block} --peer-venv {args.peer_venv}"
    )
    print(f"{_load()}; reproduce: {command}")
    socket_dir = tempfile.mkdtemp(dir="/tmp", prefix="tm-least-")
    endpoint = f"ipc://{socket_dir}/in"
    close_hub = _hub_stand_in(endpoint)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    # The step page mapped, as under tm (without a folder for it the agent counts into an array of its own, whose
    # store costs the loop more than the mapped page's)
    pages = os.path.join(socket_dir, "pages")
    os.mkdir(pages)
    tm_env = dict(env, TM_AGENT="1", TM_AGENT_ENDPOINT=endpoint, TM_AGENT_PAGES=pages)
    agents = [("least", _LEAST, env, sys.executable), ("tm", _TM, tm_env, sys.executable)]
    peer_python = os.path.join(args.peer_venv, "bin", "python")
    drain = None
    if os.path.exists(peer_python):
        peer_socket = os.path.join(socket_dir, "peer")
        drain = subprocess.Popen(
            [sys.executable, "-c", _PEER_DRAIN, peer_socket], stdout=subprocess.PIPE, text=True
        )
        drain.stdout.readline()  # bound before the agent sends
        peer_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        peer_env["TRAINMETER_SOCK"] = peer_socket
        agents.append(("0.0.7", _PEER, peer_env, peer_python))
    else:
        print(f"trainmeter 0.0.7 not found in {args.peer_venv} (bin/python): its line is left out")
    rounds: dict[tuple[str, str], list[float]] = {}
    offs: dict[str, list[float]] = {who: [] for who, *_ in agents}
    started = time.perf_counter()
    try:
        for _ in range(args.rounds):
            for who, code, run_env, python in agents:
                result = _run(code, run_env, args.pairs, args.per_block, python)
                offs[who].append(result["off_us"])
                for name, figures in result["pairs"].items():
                    rounds.setdefault((who, name), []).append(statistics.median(figures))
        lines = {
            who: _run(code, run_env, "lines", args.per_block, python) for who, code, run_env, python in agents
        }
    finally:
        close_hub()
        if drain is not None:
            drain.terminate()
            drain.wait(timeout=60)
            drain.stdout.close()
        shutil.rmtree(socket_dir, ignore_errors=True)
    off = statistics.median(offs["least"])
    print(
        f"the tight loop in one process, each configuration against every hook off in {args.pairs} pairs of blocks "
        f"of {args.per_block} iterations, the median of each round's median ({time.perf_counter() - started:.0f} s, "
        f"{args.rounds} rounds; {_load()}); an iteration with the hooks off: "
        + ", ".join(
            f"{who} {statistics.median(figures):.1f} µs (rounds {_spread(figures)})"
            for who, figures in offs.items()
        )
        + ":"
    )

    def figure(who: str, name: str) -> float:
        return statistics.median(rounds[(who, name)])

    def line(label: str, who: str, name: str) -> None:
        median = figure(who, name)
        print(
            f"  {label:<52} {median:+6.2f} µs = {median / off:5.1%} of the loop "
            f"(rounds {', '.join(f'{x:+.2f}' for x in rounds[(who, name)])})"
        )

    line(
        "least agent, every hook, a step told by its gradient",
        "least",
        "every hook, a step told by its gradient",
    )
    line(
        "least agent, every hook, a step told by a forward seen",
        "least",
        "every hook, a step told by a forward seen",
    )
    line("tm's agent, every probe", "tm", "every probe")
    if "0.0.7" in offs:
        line("trainmeter 0.0.7's agent, every probe (its own venv)", "0.0.7", "every probe")
    least = figure("least", "every hook, a step told by its gradient")
    every = figure("tm", "every probe")
    print(
        f"  tm / the least agent that tells a step as tm does: {every / least:.2f}"
        if least > 0
        else "  tm / the least agent: not computed (the least agent's figure came out at or below zero)"
    )
    if "0.0.7" in offs:
        peer = figure("0.0.7", "every probe")
        print(
            f"  tm / 0.0.7: {every / peer:.2f}; 0.0.7 / the least agent that tells a step by a forward seen, as 0.0.7 "
            f"does: {peer / figure('least', 'every hook, a step told by a forward seen'):.2f}"
            if peer > 0
            else "  tm / 0.0.7: not computed (0.0.7's figure came out at or below zero)"
        )
    print(
        "  by hook, alone (tm's steps: every probe less the three others, since alone they go the general way):"
    )
    print(f"  {'':<22} {'least':>8} {'tm':>8} {'tm - least':>11}")
    tm_parts = 0.0
    for name in ("data wait", "forward", "loss"):
        ours, theirs = figure("tm", name), figure("least", name)
        tm_parts += ours
        print(f"  {name:<22} {theirs:+8.2f} {ours:+8.2f} {ours - theirs:+11.2f} µs")
    steps = every - tm_parts
    least_steps = figure("least", "steps, told by the gradient")
    print(f"  {'steps':<22} {least_steps:+8.2f} {steps:+8.2f} {steps - least_steps:+11.2f} µs")
    print(
        "  line events an iteration in the agent's own code, every hook on / off (a line trace of 100 iterations): "
        + ", ".join(
            f"{who} {counts['lines']:.0f} / {counts['lines_off']:.0f}" for who, counts in lines.items()
        )
        + "; tm's extra µs per extra line on: "
        f"{(every - least) / (lines['tm']['lines'] - lines['least']['lines']):.3f}"
    )
    print(
        "  (each agent against its own hooks called and returning at once: the floor under them is bench_agent.py's)"
    )
    print(f"  reproduce: {command}")


def _spread(values: list[float]) -> str:
    return f"{min(values):.1f} to {max(values):.1f}"


if __name__ == "__main__":
    main()
