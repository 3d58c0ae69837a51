"""The engine's CPU per GPU sample, on the real H200 run's records (``tests/fixtures/real/h200-nanogpt-kill``: one
H200 sampled twice a second by the real NVML sampler, each record about 1.1 KB with its GPM window, reaching past
the steps the agent had sent when it came, so each reading waits until a later step settles it), fed in log order to
a fresh ``Engine`` without history (a replay's final snapshot, ``replay.final_snapshot``) and with it (the live engine,
the job hub's). Only the time of the ``sample.gpu`` records' feeds is counted; the other records are fed untimed
between them. Best of 40 passes a round.

Why it matters: a real node sends 8 GPUs × 2 samples a second against about one block of steps a second, so in the
replay of a real run's log, and in a job hub's engine (every node's samples), the GPU samples are most of the
engine's records; ``bench_replay.py``'s synthetic log samples each GPU once a second, after its steps.

``--baseline DIR`` runs the same in another checkout in the same run, alternated. Prints figures; asserts nothing.

Run: ``.venv/bin/python bench/bench_engine_samples.py [--baseline /path/to/another/checkout] [--rounds 3]``
"""

from __future__ import annotations

from checkouts import compare

# Runs in a fresh process whose PYTHONPATH is the checkout measured (its own fixture): prints {figure: µs}.
_WORKER = """
import json, time
from pathlib import Path
from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.model.history import History, NoHistory
from trainmeter_core.runlog.reader import read_log
run = list(read_log(Path("tests/fixtures/real/h200-nanogpt-kill")))
gpu = records.SampleGpu
n = sum(type(record) is gpu for record in run)
def best(history_type):
    least = float("inf")
    for _ in range(40):
        feed = Engine(history=history_type()).feed
        spent = 0.0
        for record in run:
            if type(record) is gpu:
                started = time.perf_counter()
                feed(record)
                spent += time.perf_counter() - started
            else:
                feed(record)
        least = min(least, spent)
    return least / n * 1e6
print(json.dumps({"a sample.gpu, no history (a replay)": best(NoHistory),
                  "a sample.gpu, with history (live)": best(History)}))
"""


def main() -> None:
    compare(
        __doc__,
        _WORKER,
        (),
        "engine CPU per real H200 GPU sample, best of 40 passes per round",
        2,
        "bench_engine_samples.py",
    )


if __name__ == "__main__":
    main()
