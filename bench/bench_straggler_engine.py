"""The straggler's engine side, on synthetic per-rank records (``tests/collective_world.py``: 4 ranks, each waits for
its data, computes, then meets the others in an all_reduce): how often it names the right rank and cause, how many
steps it takes, and how often a clean run that jitters names a rank or fires the alert.

``--cases`` straggler cases, each with a rank k and a cause (its forward, or its DataLoader, 200 ms per step) drawn at
random, after 60 clean steps; named right when the snapshot 50 steps later names rank k with that cause. Then
``--clean`` clean runs of 1,000 steps per jitter. The same case under torchrun, with the collective probe, is the
issue's own benchmark (the lead's, once the probe is merged). Prints figures; never fails.
usage: python bench/bench_straggler_engine.py [--cases 20] [--clean 10] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from collective_world import RANKS, World, feed_world  # noqa: E402

from trainmeter_core.model.alerts.episodes import Alerter, rule_config  # noqa: E402
from trainmeter_core.model.alerts.training import Straggler  # noqa: E402
from trainmeter_core.model.engine import Engine  # noqa: E402

SLOW_S = 0.2


def one_case(rng: random.Random, compute_s: float) -> tuple[bool, int | None]:
    """(named right 50 steps after the slowdown, the steps until first named right)."""
    rank, cause = rng.randrange(RANKS), rng.choice(("compute", "data wait"))
    engine, world = (
        Engine(),
        World(seed=rng.randrange(1 << 30), compute_s=compute_s, jitter_s=0.1 * compute_s),
    )
    feed_world(engine, world, 60)
    (world.slow_compute if cause == "compute" else world.slow_data)[rank] = SLOW_S
    snapshots = feed_world(engine, world, 50, every=1)

    def right(snapshot) -> bool:
        metrics = snapshot.metrics
        return metrics["straggler_rank"].value == rank and metrics["straggler_wait_s"].label == cause

    first = next((i + 1 for i, s in enumerate(snapshots) if right(s)), None)
    return right(snapshots[-1]), first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--clean", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    for compute_s in (0.1, 0.5, 1.0):
        results = [one_case(rng, compute_s) for _ in range(args.cases)]
        right = sum(ok for ok, _ in results)
        steps = sorted(first for _, first in results if first is not None)
        print(
            f"compute {compute_s:g} s per step (jitter σ 10%), a rank slowed {SLOW_S * 1e3:.0f} ms: named with the "
            f"right cause {right} of {args.cases}; steps to name it: median {steps[len(steps) // 2] if steps else '-'}"
            f", most {steps[-1] if steps else '-'}"
        )
    for jitter in (0.01, 0.02, 0.03):
        runs_fired = snapshots_named = total = 0
        for _ in range(args.clean):
            engine, world = Engine(), World(seed=rng.randrange(1 << 30), jitter_s=jitter)
            alerts = Alerter([Straggler()], {"straggler": rule_config(Straggler(), {})})
            fired = 0
            for snapshot in feed_world(engine, world, 1000):
                total += 1
                snapshots_named += snapshot.metrics["straggler_rank"].value is not None
                fired += sum(a.state == "fired" for a in alerts.observe(snapshot))
            runs_fired += fired > 0
        print(
            f"clean, compute 0.1 s ± {jitter * 1e3:.0f} ms: runs of 1,000 steps with a straggler alert {runs_fired} of "
            f"{args.clean}; snapshots naming a rank {snapshots_named} of {total}"
        )


if __name__ == "__main__":
    main()
