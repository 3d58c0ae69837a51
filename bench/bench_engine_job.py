"""The job hub's engine: its CPU per rank-step for a job of 4, 16, 64 and 256 nodes of 8 ranks (a synthetic job: each
node's clock mapped, every rank's records of a step as its agent sends them (its data wait, the loss read at
``backward()``, the step) in blocks of ten steps, a tick every ten steps), fed to a
fresh ``Engine`` with its history. What it must stay near as a job grows: a figure that grows with the job's size
makes the engine's work per step grow as its square. Twice: from the job's start, and its steps after the first tick
alone (the first ten steps of every rank fed first, untimed): the engine hears of a job's ranks one node's block at a
time, and until it knows them all each host's report of a step may end that step's comparison, which makes the first
figure's start grow with the job (a job's first seconds, once).

``--baseline DIR`` runs the same in another checkout in the same run, alternated. Prints figures; asserts nothing.

Run: ``.venv/bin/python bench/bench_engine_job.py [--baseline /path/to/another/checkout] [--rounds 3]``
"""

from __future__ import annotations

import json

from checkouts import FED_BEST, compare

SHAPES = ((4, 8), (16, 8), (64, 8), (256, 8))
STEPS = 40

# Runs in a fresh process whose PYTHONPATH is the checkout measured: prints {"NxR": µs per rank-step}.
_WORKER = (
    FED_BEST
    + """
import json, sys, time
from blocks import blockify
from trainmeter_core.model import records
STEPS = int(sys.argv[1])
WARM = sys.argv[3] == 'warm'
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
                # what a rank's agent sends a step: its data wait, the loss read at backward(), the step
                at = t + rank * 1e-6
                pending.append(records.Phase(phase="data_wait", start_t=at - 0.002, end_t=at - 0.001,
                                             step=step - 1 or None, probe="dataloader", t=at - 0.001,
                                             host=f"node{k}", rank=rank, source="agent", pid=10 + local))
                pending.append(records.Metric(values={"train_loss": 3.0 / step}, step=step, origin="backward",
                                              t=at - 0.0005, host=f"node{k}", rank=rank, source="agent",
                                              pid=10 + local))
                pending.append(records.Step(step=step, step_time_s=0.1, optimizers=1, micro_batches=1, tokens=1024,
                                            tokens_source="input_ids", dp=world, tokens_global=1024 * world,
                                            t=at, host=f"node{k}", rank=rank, source="agent",
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
def warm_best(blocked, times):
    # The records up to the first tick (every rank's first ten steps: ranks heard from one node at a time) fed first,
    # untimed; the CPU of the rest, the best of ``times`` fresh engines
    warm = next(i for i, record in enumerate(blocked) if isinstance(record, records.Tick)) + 1
    best = float("inf")
    for _ in range(times):
        engine = Engine(history=History())
        for record in blocked[:warm]:
            engine.feed(record)
        started = time.process_time()
        for record in blocked[warm:]:
            engine.feed(record)
        best = min(best, time.process_time() - started)
    return best
result = {}
for nodes, per_node in json.loads(sys.argv[2]):
    blocked = blockify(job(nodes, per_node), at_most=1000, rewall=True)
    if WARM:
        best, steps = warm_best(blocked, 3), STEPS - 10
    else:
        best, steps = fed_best(blocked, 3), STEPS
    result[f"{nodes} nodes x {per_node} ranks"] = best / (steps * nodes * per_node) * 1e6
print(json.dumps(result))
"""
)


def main() -> None:
    compare(
        __doc__,
        _WORKER,
        (str(STEPS), json.dumps(SHAPES), "whole"),
        f"the job hub's engine, CPU per rank-step, {STEPS} steps from the job's start, best of 3 per round",
        1,
        "bench_engine_job.py",
    )
    compare(
        __doc__,
        _WORKER,
        (str(STEPS), json.dumps(SHAPES), "warm"),
        f"the same, its last {STEPS - 10} steps alone (every rank known), best of 3 per round",
        1,
        "bench_engine_job.py",
    )


if __name__ == "__main__":
    main()
