"""What the agent costs a training loop: emit() per call, the optimizer step hooks per iteration, a whole ~1 ms
iteration with every probe on (model, data wait, steps, emit), and interpreter start-up, with and without tm in the
same run. Prints figures; asserts nothing (speed targets are read, never tested).

Run: ``PYTHONPATH=. .venv/bin/python bench/bench_agent.py``. A PULL socket drained by another process stands in for
the hub. Targets: median emit() <= 2 µs, step hooks <= 3 µs per iteration (issue 2); every probe <= 3 µs per
iteration, start-up added <= 40 ms (torch excluded) and ~0 in a DataLoader worker (issue 5).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

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

    def hooks_only(n: int) -> None:
        for i in range(n):
            param.grad = grads[i & 1]
            detector.pre_hook(optimizer, (), {})
            detector.post_hook(optimizer, (), {})

    def baseline(n: int) -> None:
        for i in range(n):
            param.grad = grads[i & 1]

    without_hooks = _per_call_us(baseline, 500)
    _line("pre+post hooks, step record sent", _per_call_us(hooks_only, 500), without_hooks)
    from trainmeter_core import records as rec

    producer, agent.producer = agent.producer, _BuildOnly()
    _line("pre+post hooks, record not sent", _per_call_us(hooks_only, 500), without_hooks)
    agent.producer = producer

    def sends(n: int) -> None:
        for i in range(n):
            producer.send(rec.Step(step=i + 1))

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
    print(f"{'model forward pre-hook':<34} median {statistics.median(figures):7.3f} µs per micro-batch")
    figures = _per_call_us(data_wait_record, 500)
    print(f"{'data-wait phase record':<34} median {statistics.median(figures):7.3f} µs per DataLoader batch")
    agent.model.reset_iteration()


class _BuildOnly:
    """Stands in for the producer: takes the record and sends nothing."""

    def send(self, record) -> bool:
        return True

    def send_many(self, records) -> bool:
        return True


# A loop of about one iteration per millisecond on one core: a DataLoader of token ids, an embedding and a linear
# head, a backward, an SGD step and one emit(). It prints the median µs per iteration over blocks of BATCH.
_LOOP = """
import statistics, sys, time
import torch
import trainmeter_agent
from trainmeter_agent import emit
own_us = []  # the agent's own time per iteration, as its step records say (agent_us)
agent = trainmeter_agent._process_agent
if agent is not None:
    send_step = agent.send_step
    def collect(fields):
        if "agent_us" in fields:
            own_us.append(fields["agent_us"])
        send_step(fields)
    agent.send_step = collect
torch.set_num_threads(1)
torch.manual_seed(0)
ids = torch.randint(512, (4096, 32))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=8)
model = torch.nn.Sequential(torch.nn.Embedding(512, 64), torch.nn.Linear(64, 512))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
def batches():
    while True:
        yield from loader
source = batches()
figures = []
for block in range(int(sys.argv[1])):
    started = time.perf_counter()
    for _ in range(100):
        (x,) = next(source)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
        loss.backward()
        optimizer.step()
        emit(train_loss=loss.item())
    if block >= 5:  # warm-up blocks (lazy inits, the agent's hello and its counted step) are not the steady state
        figures.append((time.perf_counter() - started) * 1e4)
print(statistics.median(figures), statistics.median(own_us[500:]) if own_us else 0.0)
"""


def bench_loop(endpoint: str) -> None:
    """µs per iteration of _LOOP without tm and with every probe on, runs alternated so drift hits both alike."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    boot = os.path.join(repo, "trainmeter_agent", "boot")
    plain = {k: v for k, v in os.environ.items() if not k.startswith("TM_")}
    plain.update(OMP_NUM_THREADS="1", PYTHONPATH=repo)
    with_tm = dict(plain, PYTHONPATH=os.pathsep.join([boot, repo]), TM_AGENT="1", TM_AGENT_ENDPOINT=endpoint)
    results: dict[str, list[float]] = {"without": [], "with": []}
    own: list[float] = []
    for _ in range(3):
        for name, env in (("without", plain), ("with", with_tm)):
            done = subprocess.run(
                [sys.executable, "-c", _LOOP, "40"], env=env, capture_output=True, text=True
            )
            if done.returncode != 0:
                print(f"1 ms loop: failed: {done.stderr.strip().splitlines()[-1:]}")
                return
            iteration_us, agent_us = map(float, done.stdout.split())
            results[name].append(iteration_us)
            if name == "with":
                own.append(agent_us)
    without_us, with_us = min(results["without"]), min(results["with"])
    print(
        f"{'~1 ms iteration, every probe on':<34} {with_us:7.1f} µs | without tm {without_us:7.1f} µs | "
        f"added {with_us - without_us:6.2f} µs per iteration ({(with_us - without_us) / without_us * 100:5.2f}%)"
    )
    # The difference above includes the hub stand-in's process competing for the same cores; the agent's own share:
    print(
        f"{'':<34} the agent's own time (agent_us, median): {min(own):6.2f} µs per iteration, emit() not included"
    )


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
    socket_dir = tempfile.mkdtemp(dir="/tmp", prefix="tm-bench-")
    endpoint = f"ipc://{socket_dir}/in"
    close_hub = _hub_stand_in(endpoint)
    os.environ.update(TM_AGENT="1", TM_AGENT_ENDPOINT=endpoint)
    try:
        import trainmeter_agent
        from trainmeter_agent import _bootstrap

        started = time.perf_counter()
        agent = _bootstrap.install()
        print(f"install(): {(time.perf_counter() - started) * 1e3:.2f} ms (python {sys.version.split()[0]})")
        bench_emit(trainmeter_agent)
        bench_step_hooks(trainmeter_agent)
        bench_probes(trainmeter_agent)
        print(f"records sent {agent.producer.sent}, dropped {agent.producer.dropped}")
        agent.at_exit()
        bench_loop(endpoint)
        bench_startup(endpoint)
    finally:
        close_hub()
        shutil.rmtree(socket_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
