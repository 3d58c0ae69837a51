"""The job hub's engine: its CPU per rank-step for a job of 4, 16 and 64 nodes of 8 ranks (a synthetic job: each
node's clock mapped, every rank's step records in blocks of its node's ten steps, a tick every ten steps), fed to a
fresh ``Engine`` with its history. What it must stay near as a job grows: a figure that grows with the job's size
makes the engine's work per step grow as its square.

``--baseline DIR`` runs the same in another checkout in the same run, alternated. Prints figures; asserts nothing.

Run: ``.venv/bin/python bench/bench_engine_job.py [--baseline /path/to/another/checkout] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAPES = ((4, 8), (16, 8), (64, 8))
STEPS = 40

# Runs in a fresh process whose PYTHONPATH is the checkout measured: prints {"NxR": µs per rank-step}.
_WORKER = """
import json, sys, time
from blocks import blockify
from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.model.history import History
STEPS = int(sys.argv[1])
def job(nodes, per_node):
    out = []
    def add(record):
        record.seq = len(out) + 1
        out.append(record)
    place = records.JobPlace(id="j", node_rank=0, nnodes=nodes, hub="10.0.0.1:1", found_by="torchrun flags")
    add(records.RunStart(t=100.0, host="node0", run_id="r0", name="job", run_dir="/r0", command=["torchrun"], cwd="/",
                         tm_version="0", python="3.11", platform="linux", job=place))
    for k in range(1, nodes):
        add(records.ClockMap(t=100.5, host="node0", node_rank=k, node_host=f"node{k}", offset_s=0.0,
                             basis="round_trip", uncertainty_s=1e-4))
        add(records.NodeEvent(t=100.5, host="node0", node_rank=k, node_host=f"node{k}", event="joined"))
    t, pending, world = 102.0, [], nodes * per_node
    for step in range(1, STEPS + 1):
        t += 0.1
        for k in range(nodes):
            for local in range(per_node):
                rank = k * per_node + local
                pending.append(records.Step(step=step, step_time_s=0.1, optimizers=1, micro_batches=1, tokens=1024,
                                            tokens_source="input_ids", dp=world, tokens_global=1024 * world,
                                            t=t + rank * 1e-6, host=f"node{k}", rank=rank, source="agent",
                                            pid=10 + local))
        if step % 10 == 0:
            pending.sort(key=lambda r: (r.host, r.rank, r.t))
            for record in pending:
                add(record)
            pending.clear()
            add(records.Tick(t=t + 0.01, host="node0", n=step // 10, interval_s=1.0))
    for record in out:
        record.wall = 1.7e9 + record.t
    return out
result = {}
for nodes, per_node in json.loads(sys.argv[2]):
    blocked = blockify(job(nodes, per_node), at_most=1000, rewall=True)
    best = float("inf")
    for _ in range(3):
        engine = Engine(history=History())
        started = time.process_time()
        for record in blocked:
            engine.feed(record)
        best = min(best, time.process_time() - started)
    result[f"{nodes} nodes x {per_node} ranks"] = best / (STEPS * nodes * per_node) * 1e6
print(json.dumps(result))
"""


def measure(tree: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(tree / "tests")]))
    # cwd: ``python -c`` puts the working folder first on sys.path, before PYTHONPATH
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, str(STEPS), json.dumps(SHAPES)],
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
    print(
        f"the job hub's engine, CPU per rank-step, {STEPS} steps, best of 3 per round (load average {load})"
    )
    for name, rounds in results.items():
        for shape in rounds[0]:
            figures = sorted(r[shape] for r in rounds)
            middle = figures[len(figures) // 2]
            print(f"  {name}: {shape}: {middle:.1f} µs (rounds {figures[0]:.1f} to {figures[-1]:.1f})")
    baseline = " --baseline " + str(args.baseline) if args.baseline else ""
    print(f"  reproduce: {sys.executable} bench/bench_engine_job.py --rounds {args.rounds}{baseline}")


if __name__ == "__main__":
    main()
