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

from checkouts import FED_BEST, compare

STEPS = 20_000

# Runs in a fresh process whose PYTHONPATH is the checkout measured: prints {shape: µs per step}.
_WORKER = (
    FED_BEST
    + """
import json, sys, time
import msgspec
from blocks import WALL0, blockify, training_run
from trainmeter_core.model import records
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
    out[name] = fed_best(blockify(rows, at_most=750), 5) / STEPS * 1e6
print(json.dumps(out))
"""
)


def main() -> None:
    compare(
        __doc__,
        _WORKER,
        (str(STEPS),),
        f"engine CPU per step, rank 0's blocks, {STEPS:,} steps, best of 5 per round",
        2,
        "bench_engine_blocks.py",
    )


if __name__ == "__main__":
    main()
