"""What the collective probe (``trainmeter_agent/_collectives.py``) costs, measured: reading torch's flight recorder
by the ring's fill (with and without Python frames, pg_status alone), whether a read holds the training thread
(a thread counting while another reads), ``saw_batch`` per step, and whole two-rank DDP runs under the real ``tm`` with
the probe on and off (``TM_NO_COLLECTIVES=1``), each rank's CPU seconds per step by the slope between a short and a
long run (every thread of the process counted: the probe's own too). Prints figures; asserts nothing.

Run: ``PYTHONPATH=. .venv/bin/python bench/bench_collectives.py [--short 200 --long 1200]``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "agent_scripts" / "ddp_collectives.py"
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def recorder_reads() -> None:
    """One process, a one-rank gloo world: the ring filled to 100, 500 and 2000 entries, each read timed."""
    import torch
    import torch.distributed as dist
    from torch._C import _distributed_c10d

    from trainmeter_agent._collective_rows import step_rows

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    done = 0
    for fill in (100, 500, 2000):
        while done < fill:
            dist.all_reduce(torch.ones(2344))
            done += 1
        held = len(pickle.loads(_distributed_c10d._dump_fr_trace(includeStackTraces=False))["entries"])
        for label, kwargs in (
            ("entries, no frames", {"includeStackTraces": False}),
            ("entries and frames", {}),
            ("pg_status only", {"includeCollectives": False}),
        ):
            times = []
            for _ in range(20):
                started = time.perf_counter()
                pickle.loads(_distributed_c10d._dump_fr_trace(**kwargs))
                times.append(time.perf_counter() - started)
            print(
                f"recorder read, {held:5d} entries held, {label:20s}: {statistics.median(times) * 1e3:8.3f} ms"
            )
        entries = pickle.loads(_distributed_c10d._dump_fr_trace(includeStackTraces=False))["entries"]
        offset = time.time() - time.monotonic()
        boundaries = [(i, e["time_created_ns"] / 1e9 - offset + 1e-6) for i, e in enumerate(entries)]
        started = time.perf_counter()
        step_rows(entries, boundaries, offset)
        print(f"step_rows over {held} entries (one per step): {(time.perf_counter() - started) * 1e3:.3f} ms")
    # Does a read hold the GIL? A thread counts for 1 s while another reads the full ring in a loop.
    counted = []

    def count(seconds: float) -> None:
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            n += 1
        counted.append(n)

    count(1.0)
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            pickle.loads(_distributed_c10d._dump_fr_trace(includeStackTraces=False))

    reader = threading.Thread(target=read)
    reader.start()
    count(1.0)
    stop.set()
    reader.join()
    print(
        f"a counting thread alone: {counted[0]}; with a thread reading the full ring meanwhile: {counted[1]}"
    )
    dist.destroy_process_group()


def saw_batch_cost() -> None:
    """``saw_batch`` on a block of 50 steps, as the agent's send path hands it over."""
    from trainmeter_agent._collectives import CollectiveProbe
    from trainmeter_core.model import records

    class Agent:
        pass

    probe = CollectiveProbe(Agent())
    probe._thread = threading.current_thread()  # no thread to start
    steps = list(range(1, 51))
    block = records.Block(rows=50, order="s" * 50, step=steps, step_t=[float(s) for s in steps])
    n = 20000
    started = time.perf_counter()
    for _ in range(n):
        probe.saw_batch([block])
    per_step_us = (time.perf_counter() - started) / n / 50 * 1e6
    print(f"saw_batch: {per_step_us:.3f} µs per step (blocks of 50 steps)")


def backward_wrapper_cost() -> None:
    """The probe's timing wrapper of ``torch.autograd.backward`` around a function that does nothing: what it adds
    to each backward() call (best of 5 rounds of 200,000 calls)."""
    import types

    import torch.autograd as autograd

    from trainmeter_agent._collectives import CollectiveProbe

    original = autograd.backward
    autograd.backward = lambda *args, **kwargs: None
    try:
        probe = CollectiveProbe(types.SimpleNamespace())
        probe._time_backward()
        wrapped = autograd.backward
        figures = {}
        for name, function in (("plain", wrapped.__wrapped__), ("wrapped", wrapped)):
            best = float("inf")
            for _ in range(5):
                started = time.perf_counter()
                for _ in range(200_000):
                    function()
                best = min(best, (time.perf_counter() - started) / 200_000 * 1e6)
                probe._backwards.clear()
            figures[name] = best
        print(f"backward() timing wrapper: +{figures['wrapped'] - figures['plain']:.3f} µs per call")
    finally:
        autograd.backward = original


def run_cpu(steps: int, probe_on: bool, out: Path) -> list[float]:
    env = dict(os.environ, STEPS=str(steps), PAUSE_S="0", CPU_OUT=str(out / "cpu"), OMP_NUM_THREADS="1")
    env["TM_RUNS_DIR"] = str(out / "runs")
    env["TM_DISABLE_COMPONENTS"] = "web"
    if not probe_on:
        env["TM_NO_COLLECTIVES"] = "1"
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(SCRIPT),
    ]
    subprocess.run([str(BIN / "tm"), "--", *torchrun], env=env, check=True, capture_output=True, cwd=out)
    return [float((out / f"cpu.rank{rank}").read_text()) for rank in (0, 1)]


def loop_slopes(short: int, long: int, rounds: int) -> None:
    for round_ in range(rounds):
        figures = {}
        for probe_on in (False, True):
            with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
                cpu_short = run_cpu(short, probe_on, Path(a))
                cpu_long = run_cpu(long, probe_on, Path(b))
            figures[probe_on] = [
                (y - x) / (long - short) * 1e6 for x, y in zip(cpu_short, cpu_long, strict=True)
            ]
        added = [on - off for on, off in zip(figures[True], figures[False], strict=True)]
        print(
            f"round {round_ + 1}: CPU µs per DDP step, ranks 0 and 1: probe off "
            + ", ".join(f"{v:.0f}" for v in figures[False])
            + "; on "
            + ", ".join(f"{v:.0f}" for v in figures[True])
            + "; added "
            + ", ".join(f"{v:+.1f}" for v in added)
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--short", type=int, default=200)
    parser.add_argument("--long", type=int, default=1200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-loops", action="store_true")
    args = parser.parse_args()
    recorder_reads()
    saw_batch_cost()
    backward_wrapper_cost()
    if not args.skip_loops:
        loop_slopes(args.short, args.long, args.rounds)


if __name__ == "__main__":
    main()
