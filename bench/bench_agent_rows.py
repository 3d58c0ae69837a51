"""What the agent's outbox rows cost the tight loop (issue 42): in one process under the agent (a PULL drain stands in
for the hub), blocks of the tight loop with the outbox's step and phase rows real or no-op, alternated and paired; each
row call timed inside the real loop; the flushes' CPU; and how often the flush thread slept while the loop flushed
its own windows. Prints figures; asserts nothing.

Run: ``PYTHONPATH=. .venv/bin/python bench/bench_agent_rows.py [--pairs 60] [--per-block 300]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from time import perf_counter_ns

from bench_agent import _hub_stand_in, _load
from tight_loop import made_here


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=60, help="paired blocks, rows real and no-op")
    parser.add_argument("--per-block", type=int, default=300, help="iterations per block")
    args = parser.parse_args()
    print(
        f"{_load()}; reproduce: {sys.executable} bench/bench_agent_rows.py --pairs {args.pairs} "
        f"--per-block {args.per_block}"
    )
    socket_dir = tempfile.mkdtemp(dir="/tmp", prefix="tm-bench-rows-")
    endpoint = f"ipc://{socket_dir}/in"
    close_hub = _hub_stand_in(endpoint)
    os.environ.update(TM_AGENT="1", TM_AGENT_ENDPOINT=endpoint, TM_LAUNCHER_PID=str(os.getpid()))
    import torch

    import trainmeter_agent
    from trainmeter_agent._outbox import Outbox

    agent = trainmeter_agent._start()
    _, model, optimizer, batches = made_here(torch)

    def block(n: int) -> float:
        started = time.process_time()
        for _ in range(n):
            (x,) = next(batches)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
            loss.backward()
            optimizer.step()
        return (time.process_time() - started) / n * 1e6

    real_step, real_phase, real_flush = Outbox.put_step, Outbox.put_phase, Outbox._flush
    flushes = [0.0, 0]

    def timed_flush(self) -> None:
        started = time.process_time()
        real_flush(self)
        flushes[0] += time.process_time() - started
        flushes[1] += 1

    def no_row(self, *row) -> None:
        pass

    Outbox._flush = timed_flush
    block(1000)  # warm: lazy inits, hello, the counted FLOP step
    real, none = [], []
    flushes[:] = [0.0, 0]
    for _ in range(args.pairs):
        Outbox.put_step, Outbox.put_phase = real_step, real_phase
        real.append(block(args.per_block))
        Outbox.put_step, Outbox.put_phase = no_row, no_row
        none.append(block(args.per_block))
    Outbox.put_step, Outbox.put_phase = real_step, real_phase
    real_iterations = args.pairs * args.per_block
    added = [a - b for a, b in zip(real, none, strict=True)]
    print(
        f"tight loop under the agent: rows real {statistics.median(real):.1f} µs CPU per iteration, no-op "
        f"{statistics.median(none):.1f}; the rows add {statistics.median(added):.2f} µs (median of {args.pairs} pairs "
        f"of {args.per_block}), of which flushes {flushes[0] / real_iterations * 1e6:.2f} µs ({flushes[1]} windows)"
    )

    spent = {"put_step": [0, 0], "put_phase": [0, 0]}

    def timed(name, function):
        def call(self, *row) -> None:
            started = perf_counter_ns()
            function(self, *row)
            entry = spent[name]
            entry[0] += perf_counter_ns() - started
            entry[1] += 1

        return call

    Outbox.put_step, Outbox.put_phase = timed("put_step", real_step), timed("put_phase", real_phase)
    sleeps = [0]
    real_sleep = time.sleep

    def counted_sleep(seconds: float) -> None:
        if threading.current_thread().name == "tm-agent-flush":
            sleeps[0] += 1
        real_sleep(seconds)

    time.sleep = counted_sleep
    windows, started = agent.outbox.windows, time.monotonic()
    block(5000)
    elapsed_s, windows = time.monotonic() - started, agent.outbox.windows - windows
    time.sleep = real_sleep
    Outbox.put_step, Outbox.put_phase = real_step, real_phase
    print(
        "each row timed inside the loop (flushes included): "
        + ", ".join(f"{name} {total / calls / 1000:.2f} µs" for name, (total, calls) in spent.items())
    )
    print(
        f"flush thread: {sleeps[0]} sleeps in {elapsed_s:.1f} s while the loop sent {windows} windows itself"
    )
    agent.at_exit()
    close_hub()


if __name__ == "__main__":
    main()
