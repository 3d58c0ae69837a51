"""What the live engine's history journal costs: the tight loop under ``tm --no-web`` for ``--steps`` steps, then its
log fed to a ``LiveEngine`` in this process, as the engine component feeds it, with a journal (every point kept for
the next ``history`` delta, as while a dashboard holds a copy) and without (the engine component until the first
``history.request``), each delta and snapshot encoded as the bus would send it. Alternated ``--rounds`` times; the
median CPU time of each, per second of the run (its ticks) and per step, and the bytes it would publish.

usage: python bench/bench_history_journal.py [--steps 30000] [--rounds 5]
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_tree import LOOP, REPO

sys.path.insert(0, REPO)

from trainmeter_core.components.engine import LiveEngine  # noqa: E402
from trainmeter_core.model import records  # noqa: E402
from trainmeter_core.runlog.reader import read_log  # noqa: E402


def feed(logged: list, journal: bool) -> tuple[float, int]:
    """CPU seconds to feed the log live and encode what the engine publishes; the bytes published."""
    live = LiveEngine(journal=journal)
    sent = 0
    started = time.thread_time()
    for record in logged:
        for out in live.feed(record):
            sent += len(records.encode(out))
    return time.thread_time() - started, sent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(
        f"reproduce: {sys.executable} bench/bench_history_journal.py --steps {args.steps} --rounds {args.rounds}"
    )
    runs = tempfile.mkdtemp(prefix="tm-bench-journal-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TM_") and k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", TM_RUNS_DIR=runs, PYTHONPATH=REPO)
    tm = os.path.join(os.path.dirname(sys.executable), "tm")
    argv = [tm, "-q", "--no-web", "--", sys.executable, "-c", LOOP, str(args.steps)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"the tight loop under tm failed ({done.returncode}): {done.stderr[-2000:]}")
    (run_dir,) = glob.glob(os.path.join(runs, "*", ""))
    logged = list(read_log(run_dir, blocks=True))
    ticks = sum(1 for record in logged if records.kind_of(record) == "tick")
    print(f"the run: {args.steps} steps, {ticks} ticks, {len(logged)} records in the log (blocks whole)")
    times: dict[bool, list[float]] = {True: [], False: []}
    sent: dict[bool, int] = {}
    for _ in range(args.rounds):
        for journal in (True, False):
            cpu_s, sent[journal] = feed(logged, journal)
            times[journal].append(cpu_s)
    for journal in (True, False):
        median = statistics.median(times[journal])
        print(
            f"{'with a journal   ' if journal else 'without a journal'}: {median * 1e3:.1f} ms "
            f"(rounds {', '.join(f'{t * 1e3:.1f}' for t in times[journal])}), {median / ticks * 1e3:.2f} ms a tick, "
            f"{median / args.steps * 1e6:.2f} µs a step; published {sent[journal] / 1e6:.2f} MB"
        )
    saved = statistics.median(times[True]) - statistics.median(times[False])
    print(f"the journal costs {saved * 1e3:.1f} ms: {saved / ticks * 1e3:.2f} ms a tick (a second)")


if __name__ == "__main__":
    main()
