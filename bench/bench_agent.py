"""What the agent costs a training loop: emit() per call and the optimizer step hooks per iteration, with and without
tm in the same run. Prints figures; asserts nothing (speed targets are read, never tested).

Run: ``PYTHONPATH=. .venv/bin/python bench/bench_agent.py``. A PULL socket drained by a thread stands in for the hub.
Targets (trainmeter issue 2): median emit() <= 2 µs, step hooks <= 3 µs per iteration.
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


class _BuildOnly:
    """Stands in for the producer: takes the record and sends nothing."""

    def send(self, record) -> bool:
        return True

    def send_many(self, records) -> bool:
        return True


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
        print(f"records sent {agent.producer.sent}, dropped {agent.producer.dropped}")
        agent.at_exit()
    finally:
        close_hub()
        shutil.rmtree(socket_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
