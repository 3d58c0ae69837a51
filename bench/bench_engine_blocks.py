"""The engine's CPU per step for a rank-0 loop sent as blocks, by what the loop sends between its steps: nothing but
its data waits and losses; a learning rate it emits every 10 steps; the collective probe's row after every step (a
data-parallel loop's rank 0). Each a synthetic run of 20,000 steps (``tests/blocks.py``: ``training_run``, a tick every
4,000 steps as the tight loop makes them, and ``blockify``, blocks of at most 750 records), fed to a fresh ``Engine``
with its history, best of 5.

``--baseline DIR`` runs the same in another checkout (its own ``trainmeter_core`` and ``tests/blocks.py``) in the same
run, alternated, and prints both. Prints figures; asserts nothing.

Run: ``.venv/bin/python bench/bench_engine_blocks.py [--baseline /path/to/another/checkout] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEPS = 20_000

# Runs in a fresh process whose PYTHONPATH is the checkout measured: prints {shape: µs per step}.
_WORKER = """
import json, sys, time
import msgspec
from blocks import WALL0, blockify, training_run
from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.model.history import History
STEPS = int(sys.argv[1])
AGENT = {"source": "agent", "host": "h", "pid": 7, "rank": 0}
def numbered(rows):
    for seq, record in enumerate(rows, start=1):
        record.seq, record.wall = seq, WALL0 + record.t
    return rows
def run(lr, collectives):
    out = []
    for record in training_run(STEPS, tick_every=4000):
        if type(record) is records.Metric and record.origin == "emit" and not lr:
            continue
        out.append(msgspec.structs.replace(record))
        if collectives and type(record) is records.Step:
            values = {"collective_wait_s": 0.001, "coll.all_reduce.2.bytes": 4096.0, "coll.all_reduce.2.count": 1.0}
            out.append(records.Metric(values=values, origin="collectives", step=record.step, t=record.t + 1e-4,
                                      **AGENT))
    return numbered(out)
shapes = {"data waits and losses only": run(False, False), "a learning rate emitted every 10 steps": run(True, False),
          "the collective probe's row after every step": run(False, True)}
out = {}
for name, rows in shapes.items():
    blocked = blockify(rows, at_most=750)
    best = float("inf")
    for _ in range(5):
        engine = Engine(history=History())
        started = time.process_time()
        for record in blocked:
            engine.feed(record)
        best = min(best, time.process_time() - started)
    out[name] = best / STEPS * 1e6
print(json.dumps(out))
"""


def measure(tree: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(tree / "tests")]))
    # cwd: ``python -c`` puts the working folder first on sys.path, before PYTHONPATH
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, str(STEPS)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", type=Path, help="another checkout, measured in the same run")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trees = {"this checkout": REPO}
    if args.baseline:
        trees["baseline " + str(args.baseline)] = args.baseline
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            results[name].append(measure(tree))
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"engine CPU per step, rank 0's blocks, {STEPS:,} steps, best of 5 per round (load average {load})")
    for name, rounds in results.items():
        for shape in rounds[0]:
            figures = sorted(r[shape] for r in rounds)
            print(
                f"  {name}: {shape}: {figures[len(figures) // 2]:.2f} µs (rounds {figures[0]:.2f} to {figures[-1]:.2f})"
            )
    baseline = " --baseline " + str(args.baseline) if args.baseline else ""
    print(f"  reproduce: {sys.executable} bench/bench_engine_blocks.py --rounds {args.rounds}{baseline}")


if __name__ == "__main__":
    main()
