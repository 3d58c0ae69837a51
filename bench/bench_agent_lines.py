"""Where the agent's time goes inside issue 16's tight loop, line by line, sampled from outside: py-spy records a
process that runs the loop with the agent started in it (as ``bench_agent.py --breakdown-only`` starts it: a hub stand-in
in another process that drains what the agent sends), and each sample of the training thread counts at the agent's
line when the agent's frame is the innermost Python frame (its own bytecode, or C code it called). A sampler from
outside adds nothing to the loop it measures, where timing a hook from inside adds its own calls, each of which the
loop's cold caches make cost about as much as a line of the hook (docs/performance.md, "The columns' token instead of a
lock").

Prints the agent's share of the training thread's samples, by function and by line; asserts nothing. A share of n
samples is good to about its square root: at the defaults a line of 0.1% of the loop is 30 samples, give or take 5.

usage: PYTHONPATH=. .venv/bin/python bench/bench_agent_lines.py --py-spy /path/to/py-spy [--seconds 90] [--rate 300]
(py-spy is not one of tm's dependencies: ``pip install py-spy`` into a venv of its own, and run this as root or with
ptrace allowed.)
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time

AGENT = "trainmeter_agent/"
FLUSH_THREAD = "Outbox._run"  # the agent's flush thread: asleep, or sending a window the loop left open


def loop(seconds: float) -> None:
    """The tight loop with the agent in this process, for ``seconds`` after 500 iterations of warm-up."""
    import bench_agent
    from tight_loop import made_here

    socket_dir = tempfile.mkdtemp(dir="/tmp", prefix="tm-lines-")
    endpoint = f"ipc://{socket_dir}/in"
    close_hub = bench_agent._hub_stand_in(endpoint)
    os.environ.update(TM_AGENT="1", TM_AGENT_ENDPOINT=endpoint)
    import trainmeter_agent
    import trainmeter_agent._bootstrap  # noqa: F401  (as bench_agent imports it: the agent's start is its own)

    agent = trainmeter_agent._start()
    import torch

    _, model, optimizer, source = made_here(torch)

    def run(n: int) -> None:
        for _ in range(n):
            (x,) = next(source)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
            loss.backward()
            optimizer.step()

    run(500)
    iterations = 0
    started = time.perf_counter()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        run(1000)
        iterations += 1000
    per_iteration_us = (time.perf_counter() - started) / iterations * 1e6
    print(f"{iterations:,} iterations at {per_iteration_us:.1f} µs each (wall, under the sampler)")
    agent.at_exit()
    close_hub()


def report(raw_path: str, top: int) -> None:
    """The agent's samples among the training thread's, from py-spy's raw output (a stack and its count a line)."""
    training = 0
    by_function: collections.Counter = collections.Counter()
    by_line: collections.Counter = collections.Counter()
    with open(raw_path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            if any(FLUSH_THREAD in frame for frame in frames):
                continue
            n = int(count)
            training += n
            innermost = frames[-1]
            if AGENT not in innermost:
                continue
            function, _, where = innermost.partition(" (")
            path = where.rstrip(")")
            by_line[f"{function} ({path[path.find(AGENT) :]})"] += n
            by_function[f"{function} ({path[path.find(AGENT) :].rpartition(':')[0]})"] += n
    own = sum(by_function.values())
    if not training:
        print("no samples of the training thread")
        return
    print(
        f"the training thread: {training:,} samples; the agent's own lines {own:,} = {own / training * 100:.2f}%"
    )
    print("by function:")
    for name, n in by_function.most_common():
        print(f"  {n:6,} {n / training * 100:5.2f}%  {name}")
    print(f"the {top} lines with the most samples:")
    for name, n in by_line.most_common(top):
        print(f"  {n:6,} {n / training * 100:5.2f}%  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--py-spy", default=os.environ.get("PY_SPY", "py-spy"), help="the py-spy executable")
    parser.add_argument("--seconds", type=float, default=90.0, help="how long the sampled loop runs")
    parser.add_argument(
        "--rate", type=int, default=300, help="samples a second (py-spy falls behind at 1000 here)"
    )
    parser.add_argument("--top", type=int, default=25, help="lines to print")
    parser.add_argument("--loop", action="store_true", help=argparse.SUPPRESS)  # the sampled process itself
    args = parser.parse_args()
    if args.loop:
        loop(args.seconds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "samples.txt")
        here = os.path.dirname(os.path.abspath(__file__))
        command = [args.py_spy, "record", "--format", "raw", "--rate", str(args.rate), "--output", raw, "--"]
        command += [sys.executable, os.path.abspath(__file__), "--loop", "--seconds", str(args.seconds)]
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")]),
        )
        subprocess.run(command, check=True, env=env)
        report(raw, args.top)
    print(
        f"  reproduce: PYTHONPATH=. {sys.executable} bench/bench_agent_lines.py --py-spy {args.py_spy} "
        f"--seconds {args.seconds:g} --rate {args.rate}"
    )


if __name__ == "__main__":
    main()
