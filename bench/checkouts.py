"""What the benches that compare two checkouts share: a worker script run in a fresh process of each checkout (its
own ``trainmeter_core`` and ``tests`` helpers), in rounds alternated, and the medians printed side by side."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: For a worker: the least CPU time of ``times`` fresh engines (with their history) fed ``blocked`` whole.
FED_BEST = """
import time
from trainmeter_core.model.engine import Engine
from trainmeter_core.model.history import History
def fed_best(blocked, times):
    best = float("inf")
    for _ in range(times):
        engine = Engine(history=History())
        started = time.process_time()
        for record in blocked:
            engine.feed(record)
        best = min(best, time.process_time() - started)
    return best
"""


def measure(tree: Path, worker: str, *args: str) -> dict[str, float]:
    """``python -c worker args`` in a fresh process of the checkout ``tree``; the JSON mapping it prints."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(tree / "tests")]))
    # cwd: ``python -c`` puts the working folder first on sys.path, before PYTHONPATH
    done = subprocess.run(
        [sys.executable, "-c", worker, *args], env=env, cwd=tree, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def compare(
    description: str, worker: str, args: tuple[str, ...], title: str, digits: int, script: str
) -> None:
    """Parse ``--baseline`` and ``--rounds``, run ``worker`` in this checkout and the baseline's, alternated, and
    print each figure's median over the rounds (``title`` heads them; ``digits`` after the point)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--baseline", type=Path, help="another checkout, measured in the same run")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    trees = {"this checkout": REPO}
    if options.baseline:
        trees["baseline " + str(options.baseline)] = options.baseline
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(options.rounds):
        for name, tree in trees.items():
            results[name].append(measure(tree, worker, *args))
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"{title} (load average {load})")
    for name, rounds in results.items():
        for figure in rounds[0]:
            values = sorted(r[figure] for r in rounds)
            middle, low, high = values[len(values) // 2], values[0], values[-1]
            print(
                f"  {name}: {figure}: {middle:.{digits}f} µs (rounds {low:.{digits}f} to {high:.{digits}f})"
            )
    baseline = " --baseline " + str(options.baseline) if options.baseline else ""
    print(f"  reproduce: {sys.executable} bench/{script} --rounds {options.rounds}{baseline}")
