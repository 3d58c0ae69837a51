"""What the agent costs a training loop: emit() per call, the optimizer step hooks per iteration, the loss probe per
backward(), and whole loops with every probe on against the plain loop and against trainmeter 0.0.7 (the previous
generation): the tight CPU loop of issue 16 (Embedding(16, 4) + Linear(4, 16), DataLoader batch 1, AdamW, 1 thread),
the same loop fed floats (no token ids: its steps have no token count) and a ~1 ms loop, in paired rounds, with a
per-probe breakdown; and interpreter start-up with and without tm.
Prints figures; asserts nothing (speed targets are read, never tested).

Run: ``PYTHONPATH=. .venv/bin/python bench/bench_agent.py [--rounds 7] [--peer-venv /work/peer]``. A PULL socket
drained by another process stands in for the hub in the in-process parts; the loops run under the real ``tm``. The
loop figures are CPU time of the training process per iteration (this machine is shared: CPU time is what the agent
adds, wall time also holds other people's work). What tm's other processes spend, and the whole run's cost, is
``bench_tree.py``'s (every process of the tree counted, by the slope between a short and a long run).
Targets: median emit() <= 2 µs, step hooks <= 3 µs per iteration (issue 2); every probe <= 3 µs per iteration on the
tight loop and below 0.0.7 (issue 16); start-up added <= 40 ms (torch excluded) and ~0 in a DataLoader worker.
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

from tight_loop import DATA_AND_MODEL, timed_run

BATCH = 100  # calls timed together, so the clock's own cost and resolution do not dominate
BATCHES = 2000


# The hub runs in the launcher, another process: a thread here would compete with the loop for the GIL.
_DRAIN = """
import sys, zmq
pull = zmq.Context().socket(zmq.PULL)
pull.bind(sys.argv[1])
print("bound", flush=True)
while True:
    pull.recv_multipart()
"""


def _hub_stand_in(endpoint: str):
    drain = subprocess.Popen([sys.executable, "-c", _DRAIN, endpoint], stdout=subprocess.PIPE, text=True)
    drain.stdout.readline()  # bound before the agent connects

    def close() -> None:
        drain.terminate()
        drain.wait(timeout=60)
        drain.stdout.close()

    return close


def _per_call_us(body, batches: int = BATCHES) -> list[float]:
    """µs per call of ``body(n)`` (which runs n calls), one figure per batch."""
    figures = []
    for _ in range(batches):
        started = time.perf_counter()
        body(BATCH)
        figures.append((time.perf_counter() - started) / BATCH * 1e6)
    return figures


def _line(name: str, with_tm: list[float], without_tm: list[float]) -> None:
    median_with, median_without = statistics.median(with_tm), statistics.median(without_tm)
    print(
        f"{name:<34} median {median_with:7.3f} µs (mean {statistics.fmean(with_tm):7.3f}) | "
        f"without tm {median_without:7.3f} µs | added {median_with - median_without:7.3f} µs | "
        f"ratio {median_with / median_without:6.2f}"
    )


def bench_emit(trainmeter_agent) -> None:
    emit = trainmeter_agent.emit

    def loop(n: int) -> None:
        for _ in range(n):
            emit(train_loss=1.25)

    def loop_two(n: int) -> None:
        for _ in range(n):
            emit(train_loss=1.25, lr=3e-4)

    agent = trainmeter_agent._process_agent
    _per_call_us(loop, 50)  # warm up: activation (hello, imports) is not a per-call cost
    with_one, with_two = _per_call_us(loop), _per_call_us(loop_two)
    # The same loop outside tm: emit is then the no-op every user without tm gets.
    trainmeter_agent._process_agent, trainmeter_agent._ENABLED = None, False
    without_one, without_two = _per_call_us(loop), _per_call_us(loop_two)
    trainmeter_agent._process_agent, trainmeter_agent._ENABLED = agent, True
    _line("emit(train_loss=)", with_one, without_one)
    _line("emit(train_loss=, lr=)", with_two, without_two)


def bench_step_hooks(trainmeter_agent) -> None:
    try:
        import torch
    except ImportError:
        print("step hooks: torch is not installed, skipped")
        return
    torch.set_num_threads(1)
    agent = trainmeter_agent._process_agent
    agent.iterations.detach()  # the agent attached when torch was imported above: measure without it first
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.0)
    grads = [torch.zeros(1), torch.zeros(1)]

    def iterations(n: int) -> None:
        # A backward's only trace the agent reads: a fresh gradient object. Two preallocated ones alternate.
        for i in range(n):
            param.grad = grads[i & 1]
            optimizer.step()

    _per_call_us(iterations, 50)
    without_tm = _per_call_us(iterations, 500)
    agent.iterations.attach()
    _per_call_us(iterations, 50)
    steps_before = agent.iterations.iteration
    with_tm = _per_call_us(iterations, 500)
    agent.iterations.detach()
    steps = agent.iterations.iteration - steps_before
    _line("optimizer.step() iteration", with_tm, without_tm)
    print(f"{'':<34} {steps} iterations counted ({500 * BATCH} expected)")

    # The hooks alone (what agent_us reports), without the optimizer around them: with the step record sent, and
    # with everything but the send (the record is built and dropped), to tell the agent's logic from the bus's cost.
    detector = agent.iterations

    # The arguments torch passes: the step's own (``self`` first, no closure), so the hooks take the steady lane as
    # they do under optimizer.step(); empty ones would send them the general way.
    step_args, no_kwargs = (optimizer,), {}

    def hooks_only(n: int) -> None:
        for i in range(n):
            param.grad = grads[i & 1]
            detector.pre_hook(optimizer, step_args, no_kwargs)
            detector.post_hook(optimizer, step_args, no_kwargs)

    def baseline(n: int) -> None:
        for i in range(n):
            param.grad = grads[i & 1]

    without_hooks = _per_call_us(baseline, 500)
    _line("pre+post hooks, step record sent", _per_call_us(hooks_only, 500), without_hooks)
    from trainmeter_core.model import records

    producer, agent.producer = agent.producer, _BuildOnly()
    _line("pre+post hooks, record not sent", _per_call_us(hooks_only, 500), without_hooks)
    agent.producer = producer

    def sends(n: int) -> None:
        for i in range(n):
            producer.send(records.Step(step=i + 1))

    figures = _per_call_us(sends, 500)
    print(
        f"{'Producer.send(Step) alone':<34} median {statistics.median(figures):7.3f} µs (the bus client's share)"
    )


def bench_probes(trainmeter_agent) -> None:
    """The probes of issue 5 alone, per call: the model's forward pre-hook and the DataLoader's data-wait record."""
    try:
        import torch
    except ImportError:
        print("probes: torch is not installed, skipped")
        return
    agent = trainmeter_agent._process_agent
    model = torch.nn.Sequential(torch.nn.Embedding(512, 64), torch.nn.Linear(64, 512))
    ids = torch.randint(512, (8, 32))
    model(ids)  # the first training forward: the probe adopts this module as the model
    if agent.model.root() is not model:
        print("probes: the model probe did not adopt the model, skipped")
        return
    hook, data_wait = agent.model._pre_hook, agent.phases._batch
    inputs, no_kwargs, batch = (ids,), {}, (ids,)

    def forward_hook(n: int) -> None:
        for _ in range(n):
            hook(model, inputs, no_kwargs)

    def data_wait_record(n: int) -> None:
        for _ in range(n):
            data_wait(time.monotonic(), batch)

    figures = _per_call_us(forward_hook, 500)
    print(f"{'model probe per forward':<34} median {statistics.median(figures):7.3f} µs per micro-batch")
    figures = _per_call_us(data_wait_record, 500)
    print(f"{'data-wait phase record':<34} median {statistics.median(figures):7.3f} µs per DataLoader batch")
    agent.model.reset_iteration()


def bench_backward(trainmeter_agent) -> None:
    """The loss probe: ``loss.backward()`` on a 0-dim CPU loss through the wrapper, and its end-of-iteration hand-over."""
    try:
        import torch
    except ImportError:
        print("loss probe: torch is not installed, skipped")
        return
    agent = trainmeter_agent._process_agent
    probe = agent.loss
    wrapped = torch.autograd.backward
    if probe is None or not getattr(wrapped, "_tm_wrapped", False):
        print("loss probe: not attached, skipped")
        return
    param = torch.nn.Parameter(torch.ones(()))
    step = [0]

    def backwards(n: int) -> None:
        for _ in range(n):
            (param * 2.0).backward()

    def iterations(n: int) -> None:
        # One backward and the probe's end of iteration (the loss handed to the agent, sent with the next batch).
        for _ in range(n):
            (param * 2.0).backward()
            step[0] += 1
            probe.end_iteration({"step": step[0], "micro_batches": 1})

    _per_call_us(iterations, 50)
    with_tm = _per_call_us(iterations, 500)
    torch.autograd.backward = wrapped.__wrapped__
    try:
        _per_call_us(backwards, 50)
        without_tm = _per_call_us(backwards, 500)
    finally:
        torch.autograd.backward = wrapped
    _line("backward() + loss hand-over", with_tm, without_tm)


class _BuildOnly:
    """Stands in for the producer: takes the records (blocks among them) and sends nothing."""

    def send(self, record) -> bool:
        return True

    def send_many(self, logged) -> bool:
        return True

    def stamp(self, record, now_t: float, now_wall: float) -> None:
        pass


# The loops run as scripts: ``python -c LOOP blocks per_block``. Each prints the median CPU µs per iteration over its
# blocks (after 3 warm-up blocks: lazy inits, the agent's hello, its counted FLOP step), the median wall µs, the
# iterations run and its own CPU seconds in all (start-up included), as JSON.
_LOOP_HEAD = """
import json, statistics, sys, time
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
blocks, per_block = int(sys.argv[1]), int(sys.argv[2])
"""
_LOOP_TAIL = """
def batches():
    while True:
        yield from loader
source = batches()
cpu_us, wall_us = [], []
for block in range(blocks):
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(per_block):
        (x,) = next(source)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
        loss.backward()
        optimizer.step()
    cpu_us.append((time.process_time() - cpu0) / per_block * 1e6)
    wall_us.append((time.perf_counter() - wall0) / per_block * 1e6)
print(json.dumps({"cpu_us": statistics.median(cpu_us[3:]), "wall_us": statistics.median(wall_us[3:]),
                  "iterations": blocks * per_block, "process_cpu_s": time.process_time()}))
"""
LOOPS = {
    # Issue 16's tight loop: an iteration is a few hundred µs of torch's own Python and dispatch on one core.
    "tight loop": _LOOP_HEAD + DATA_AND_MODEL + _LOOP_TAIL,
    # The same size of loop fed floats (a regression of each input on itself): a model that sees no token ids, whose
    # steps have no token count (a vision model's, an MLP's on features).
    "tight loop, floats": _LOOP_HEAD
    + """
xs = torch.randn(4096, 8)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs), batch_size=1)
model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 8))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
"""
    + _LOOP_TAIL.replace(
        "torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())",
        "(model(x) - x).pow(2).mean()",
    ),
    # About a millisecond per iteration: a wider embedding and head, batches of 8 sequences of 32 tokens.
    "~1 ms loop": _LOOP_HEAD
    + """
ids = torch.randint(512, (4096, 32))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=8)
model = torch.nn.Sequential(torch.nn.Embedding(512, 64), torch.nn.Linear(64, 512))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
"""
    + _LOOP_TAIL,
}


# The floor under any agent: the same loop with do-nothing hooks where tm's probes attach in a steady iteration (the
# DataLoader's __next__ with the two clock reads a data wait needs, autograd.backward, a forward set on the model that
# calls its class's, the global optimizer step pre-hook; tm's post-hook leaves the steady lane) and one extra thread,
# asleep, as the agent keeps one (its flush timer; an idle thread alone has been measured at 2.7 µs). What this adds is
# torch's and Python's cost of calling out at all, before any probe does work: a per-iteration target below it cannot
# be met by a probe in Python.
_FLOOR_HOOKS = """
import torch.utils.data.dataloader as _dataloader
_next = _dataloader._BaseDataLoaderIter.__next__
def _timed_next(self):
    started = time.monotonic()
    batch = _next(self)
    time.monotonic()
    return batch
_dataloader._BaseDataLoaderIter.__next__ = _timed_next
import torch.optim.optimizer as _optimizer_module
_backward = torch.autograd.backward
def _seen_backward(*args, **kwargs):
    return _backward(*args, **kwargs)
torch.autograd.backward = _seen_backward
class _Forward:
    def __init__(self, module):
        self.module, self.function = module, type(module).forward
    def __call__(self, *args, **kwargs):
        return self.function(self.module, *args, **kwargs)
model.__dict__["forward"] = _Forward(model)
_optimizer_module.register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: None)
import threading
threading.Thread(target=threading.Event().wait, name="floor-sleeper", daemon=True).start()
"""


# The agent's flush thread in a steady loop (trainmeter_agent/_outbox.py, QUIET_MAX_S): it wakes about once a second,
# takes a lock and looks at two attributes, and sleeps again. Measured in one process, the floor's loop with its extra
# thread switched between waking each second and sleeping for good, in alternating phases of 15 blocks (an ABBA
# order), so both phases share the process's memory layout. Two scripts that differ only in the thread's code differed
# by +4.7 to +6.9 µs an iteration (the bench's line until 2026-12-07), and by -0.8 µs in one process: the script's
# text and where its memory lies, not the wakes (a wake a second is in one block of six at most, and a block's median
# leaves it out).
_WAKING_THREAD = """
_mode = {"wake": False}
_changed = threading.Event()
def _thread():
    lock = threading.Lock()
    while True:
        if _mode["wake"]:
            time.sleep(1.0)
            with lock:
                pass
        else:
            _changed.wait()
            _changed.clear()
threading.Thread(target=_thread, name="floor-waker", daemon=True).start()
"""
#: The loop's first blocks warm it up; then phases of this many blocks each, the thread asleep, waking, waking, asleep, ...
_WARM_BLOCKS, _PHASE_BLOCKS = 3, 15
_WAKING_PHASES = f"""
def _waking(phase):
    return bool(phase % 2) != bool((phase // 2) % 2)
def _set_phase(block):
    if block >= {_WARM_BLOCKS} and (block - {_WARM_BLOCKS}) % {_PHASE_BLOCKS} == 0:
        _mode["wake"] = _waking((block - {_WARM_BLOCKS}) // {_PHASE_BLOCKS})
        _changed.set()
"""
_WAKING_RESULT = f"""
phases = {{False: [], True: []}}
for phase in range((blocks - {_WARM_BLOCKS}) // {_PHASE_BLOCKS}):
    first = {_WARM_BLOCKS} + phase * {_PHASE_BLOCKS}
    phases[_waking(phase)].append(statistics.median(cpu_us[first : first + {_PHASE_BLOCKS}]))
print(json.dumps({{"waking": phases[True], "asleep": phases[False]}}))
"""


def waking_thread_script(code: str) -> str:
    """The loop script with the floor's do-nothing hooks, its extra thread switched between waking each second and
    sleeping for good in alternating phases of its own loop's blocks: prints each phase's median CPU µs per
    iteration."""
    hooks = _FLOOR_HOOKS.replace(
        'threading.Thread(target=threading.Event().wait, name="floor-sleeper", daemon=True).start()\n',
        _WAKING_THREAD + _WAKING_PHASES,
    )
    loop = _LOOP_TAIL.replace(
        "for block in range(blocks):\n", "for block in range(blocks):\n    _set_phase(block)\n"
    )
    loop = loop[: loop.index("print(json.dumps(")] + _WAKING_RESULT
    return code.replace(_LOOP_TAIL, hooks + loop)


def with_floor_hooks(code: str) -> str:
    """A loop script with the do-nothing hooks installed just before its loop starts."""
    return code.replace(_LOOP_TAIL, _FLOOR_HOOKS + _LOOP_TAIL)


def bench_waking_thread(phases: int = 8) -> None:
    """What the agent's one thread, waking each second, costs the tight loop over a thread asleep for good: one
    process, phases alternated (``waking_thread_script``)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=repo)
    script = waking_thread_script(LOOPS["tight loop"])
    result = _run_loop(
        [sys.executable, "-c", script, str(_WARM_BLOCKS + phases * 2 * _PHASE_BLOCKS), "500"], env, repo
    )
    if result is None:
        return
    added = [a - b for a, b in zip(result["waking"], result["asleep"], strict=True)]
    print(
        f"tight loop, do-nothing hooks: their extra thread waking once a second (the agent's flush thread in a steady "
        f"loop) instead of never adds {statistics.median(added):+6.2f} µs CPU per iteration (one process, "
        f"{len(added)} pairs of phases of 15 blocks of 500 iterations, spread {min(added):.1f} to {max(added):.1f}; "
        f"asleep {statistics.median(result['asleep']):.1f} µs)"
    )


def _run_loop(argv: list[str], env: dict, cwd: str) -> dict | None:
    """One run: the training process's own figures (tm's other processes are ``bench_tree.py``'s, which counts every
    process of the tree; ``RUSAGE_CHILDREN`` alone here missed every process its parent left unwaited)."""
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        print(f"  failed: {' '.join(argv[:3])}...: {done.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_loops(rounds: int, peer_venv: str | None, tight_iterations: int, names: list[str]) -> None:
    """Each loop of ``names`` plain, under tm and under 0.0.7 (its own venv, its own plain run), in rounds,
    alternated."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tm = os.path.join(os.path.dirname(sys.executable), "tm")
    runs = tempfile.mkdtemp(prefix="tm-bench-runs-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=repo, TM_RUNS_DIR=runs)
    peer_python = os.path.join(peer_venv, "bin", "python") if peer_venv else None
    peer_tm = os.path.join(peer_venv, "bin", "tm") if peer_venv else None
    if peer_python and not (os.path.exists(peer_python) and os.path.exists(peer_tm)):
        print(f"0.0.7 not found in {peer_venv}: its column is left out")
        peer_python = peer_tm = None
    peer_env = dict(env)
    peer_env.pop("PYTHONPATH")
    try:
        for name in names:
            code = LOOPS[name]
            tight = name.startswith("tight loop")
            per_block = 500 if tight else 100
            blocks = max(6, tight_iterations // per_block) if tight else 30
            variants = {
                "plain": ([sys.executable, "-c", code, str(blocks), str(per_block)], env),
                "empty hooks": (
                    [sys.executable, "-c", with_floor_hooks(code), str(blocks), str(per_block)],
                    env,
                ),
                "tm": (
                    [tm, "-q", "--no-web", "--", sys.executable, "-c", code, str(blocks), str(per_block)],
                    env,
                ),
            }
            if peer_python:
                variants["0.0.7 plain"] = ([peer_python, "-c", code, str(blocks), str(per_block)], peer_env)
                variants["0.0.7"] = (
                    [peer_tm, "-q", "--no-web", "--", peer_python, "-c", code, str(blocks), str(per_block)],
                    peer_env,
                )
            results: dict[str, list[dict]] = {k: [] for k in variants}
            for _ in range(rounds):
                for variant, (argv, run_env) in variants.items():
                    result = _run_loop(argv, run_env, runs)  # 0.0.7 keeps its runs under the working folder
                    if result is None:
                        return
                    results[variant].append(result)
            _loop_lines(name, results, rounds)
    finally:
        shutil.rmtree(runs, ignore_errors=True)


def _paired(results: dict, key: str, with_: str, without: str) -> list[float]:
    return [a[key] - b[key] for a, b in zip(results[with_], results[without], strict=True)]


def _loop_lines(name: str, results: dict, rounds: int) -> None:
    med = statistics.median
    plain = med(r["cpu_us"] for r in results["plain"])
    added = _paired(results, "cpu_us", "tm", "plain")
    added_wall = _paired(results, "wall_us", "tm", "plain")
    print(
        f"{name}: plain {plain:7.1f} µs CPU per iteration; tm adds {med(added):6.2f} µs CPU (median of {rounds} "
        f"paired rounds, spread {min(added):.1f} to {max(added):.1f}; wall {med(added_wall):+.1f} µs), every probe on"
    )
    print(f"{'':<12}(tm's other processes and the whole tree: bench/bench_tree.py)")
    floor = _paired(results, "cpu_us", "empty hooks", "plain")
    print(
        f"{'':<12}do-nothing hooks at the agent's attach points (no tm) add {med(floor):6.2f} µs CPU per iteration "
        f"(spread {min(floor):.1f} to {max(floor):.1f}): the floor under any probe written in Python"
    )
    if "0.0.7" in results:
        peer_added = _paired(results, "cpu_us", "0.0.7", "0.0.7 plain")
        print(
            f"{'':<12}0.0.7 adds {med(peer_added):6.2f} µs CPU per iteration (spread {min(peer_added):.1f} to "
            f"{max(peer_added):.1f}); tm - 0.0.7 = "
            f"{med(added) - med(peer_added):+.2f} µs"
        )


def bench_breakdown(endpoint: str, blocks: int = 300, per_block: int = 30) -> None:
    """The tight loop in this process, its probes switched on and off by their own switches (the hooks stay where they
    are: patching a class or a module in and out would also undo CPython's specialised attribute reads around them),
    in alternating blocks of ``per_block`` iterations, each iteration timed on its own: the probes' work in time (µs
    an iteration, paired medians of blocks; the median of an iteration's wall time leaves out the moments another
    process had the core). Every probe at once against none, then each probe's share as they add up in the order the
    steady step needs them (the steps alone go the general way; with the model's forward seen they take the steady
    step; then the data wait; then the loss), and each probe alone against none. What stays when every probe is off
    (the hooks called, returning at once) is the loop's ``empty hooks`` line below, not counted here."""
    try:
        import torch
    except ImportError:
        print("breakdown: torch is not installed, skipped")
        return
    import trainmeter_agent

    agent = trainmeter_agent._process_agent
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ids = torch.randint(16, (4096, 8))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=1)
    model = torch.nn.Sequential(torch.nn.Embedding(16, 4), torch.nn.Linear(4, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def batches():
        while True:
            yield from loader

    source = batches()
    run = timed_run(torch, model, optimizer, source)

    # The model bench_probes adopted is let go, so that this one is adopted at its first forward.
    agent.model.detach_root_hooks()
    agent.model.resume_discovery()
    agent.iterations.attach()
    run(300)
    if agent.model.root() is not model:
        print("breakdown: the model probe did not adopt the model, skipped")
        return

    def switch(steps: bool, model_probe: bool, data_wait: bool, loss: bool) -> None:
        agent.iterations.steps_on = steps
        agent.model.on = model_probe
        agent.loss.on = loss
        (agent.stopped.discard if data_wait else agent.stopped.add)("data_wait")
        agent.regate()  # the set changed outside stop_probe

    off = (False, False, False, False)
    # (steps, model, data wait, loss): each configuration adds one probe to the one before. The steps alone go the
    # general way (the steady step reads the model probe's micro-batches), so the model's share can come out negative.
    stacked = {
        "optimizer hooks (steps), alone": (True, False, False, False),
        "+ model probe (the steady step)": (True, True, False, False),
        "+ DataLoader data wait": (True, True, True, False),
        "+ loss at backward()": (True, True, True, True),
    }

    def paired(on: tuple, without: tuple) -> list[float]:
        """µs an iteration, block by block: the median of ``on`` minus the median of ``without``, in either order."""
        figures = []
        for block in range(blocks):
            medians = {}
            for config in (on, without) if block % 2 else (without, on):
                switch(*config)
                run(5)  # the switch's own iterations (the lane found again, a mark written) are not timed
                times: list[int] = []
                run(per_block, times)
                medians[config] = statistics.median(times)
            figures.append((medians[on] - medians[without]) / 1e3)
        return figures

    started = time.perf_counter()
    print(
        f"the probes' work, tight loop in-process ({_load()}; {blocks} pairs of blocks of {per_block} iterations, "
        f"the median iteration of each):"
    )
    _quartiles("every probe, against every probe off", paired(stacked["+ loss at backward()"], off))
    before = off
    for name, config in stacked.items():
        _quartiles(f"  {name}", paired(config, before))
        before = config
    print("  each probe alone, against every probe off:")
    alone = {
        "model probe (its forward)": (False, True, False, False),
        "DataLoader data wait": (False, False, True, False),
        "loss at backward()": (False, False, False, True),
    }
    for name, config in alone.items():
        _quartiles(f"    {name}", paired(config, off))
    switch(True, True, True, True)
    print(
        f"  ({time.perf_counter() - started:.0f} s; the steps alone send their record the general way, the model "
        "probe on lets them take the steady step: its share is the model's work less what that saves)"
    )


def _quartiles(name: str, figures: list[float]) -> None:
    q1, median, q3 = statistics.quantiles(figures, n=4)
    print(f"  {name:<40} {median:+7.2f} µs an iteration (quartiles {q1:+.1f} to {q3:+.1f})")


def _load() -> str:
    with open("/proc/loadavg") as f:
        return "load average " + " ".join(f.read().split()[:3])


def bench_startup(endpoint: str) -> None:
    """Interpreter start-up added by the bootstrap: a plain ``python -c pass``, and a DataLoader spawn worker's."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    boot = os.path.join(repo, "trainmeter_agent", "boot")
    plain = {k: v for k, v in os.environ.items() if not k.startswith("TM_")}
    plain.update(PYTHONPATH=repo)
    with_tm = dict(plain, PYTHONPATH=os.pathsep.join([boot, repo]), TM_AGENT="1", TM_AGENT_ENDPOINT=endpoint)
    # A spawn worker's command line holds this fragment: the bootstrap stays dormant on seeing it.
    worker = "import multiprocessing.spawn\nif 0: from multiprocessing.spawn import spawn_main"

    def median_ms(code: str, env: dict) -> float:
        figures = []
        for _ in range(15):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], env=env, check=True)
            figures.append((time.perf_counter() - started) * 1e3)
        return statistics.median(figures)

    for name, code in (("python -c pass", "pass"), ("a spawn DataLoader worker", worker)):
        without_ms, with_ms = median_ms(code, plain), median_ms(code, with_tm)
        print(
            f"start-up, {name:<26} {with_ms:6.1f} ms | without tm {without_ms:6.1f} ms | added {with_ms - without_ms:5.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7, help="paired rounds of each whole loop")
    parser.add_argument("--peer-venv", default=os.environ.get("TM_PEER_VENV") or "/work/peer")
    parser.add_argument("--iterations", type=int, default=10_000, help="iterations of the tight loop per run")
    parser.add_argument("--loops-only", action="store_true")
    parser.add_argument(
        "--loop",
        action="append",
        choices=list(LOOPS),
        help="only this loop (repeatable; default: every loop)",
    )
    parser.add_argument("--breakdown-only", action="store_true", help="only the probes' work in one process")
    args = parser.parse_args()
    print(
        f"{_load()}; reproduce: {sys.executable} bench/bench_agent.py --rounds {args.rounds} "
        f"--iterations {args.iterations} --peer-venv {args.peer_venv}"
        + (" --breakdown-only" if args.breakdown_only else "")
        + (" --loops-only" if args.loops_only else "")
        + "".join(f" --loop '{name}'" for name in args.loop or ())
    )
    socket_dir = tempfile.mkdtemp(dir="/tmp", prefix="tm-bench-")
    endpoint = f"ipc://{socket_dir}/in"
    close_hub = _hub_stand_in(endpoint)
    os.environ.update(TM_AGENT="1", TM_AGENT_ENDPOINT=endpoint)
    try:
        if not args.loops_only:
            # The bootstrap is imported before the clock starts: the start's own work is timed.
            import trainmeter_agent._bootstrap

            started = time.perf_counter()
            agent = trainmeter_agent._start()
            print(
                f"_start(): {(time.perf_counter() - started) * 1e3:.2f} ms (python {sys.version.split()[0]})"
            )
            if not args.breakdown_only:
                bench_emit(trainmeter_agent)
                bench_step_hooks(trainmeter_agent)
                bench_probes(trainmeter_agent)
                bench_backward(trainmeter_agent)
            bench_breakdown(endpoint)
            print(f"records sent {agent.producer.sent}, dropped {agent.producer.dropped}")
            agent.at_exit()
        if args.breakdown_only:
            return
        bench_loops(args.rounds, args.peer_venv, args.iterations, args.loop or list(LOOPS))
        if "tight loop" in (args.loop or list(LOOPS)):
            bench_waking_thread()
        if not args.loops_only:
            bench_startup(endpoint)
    finally:
        close_hub()
        shutil.rmtree(socket_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
