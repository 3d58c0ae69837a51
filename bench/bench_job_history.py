"""What a job's history weighs in node 0's engine (and in its checkpoint, and in a dashboard's copy): the engine keeps
a series per GPU counter of every node's GPUs (six) and one per rank's step time, so a job of N nodes of 8 GPUs has
about 56 × N series; each is bounded (``History``: at most 12,288 entries), and this prints what that bound comes to.

Two measured factors: the series a job's engine keeps (a synthetic job of ``nodes`` × 8 ranks fed to a fresh
``Engine`` with its history: 20 steps of every rank in its node's blocks, three real H200 GPU samples of each GPU),
and what one series holds after a day of points at a GPU's sampling rate (2 a second: 172,800 points; its arrays'
bytes and its share of the engine's checkpoint, ``History.to_state`` encoded). Their product is the day-long job's
history, printed beside them. A figure, never a pass or fail.

Run: ``PYTHONPATH=. .venv/bin/python bench/bench_job_history.py [--nodes 4,64,256]``
"""

from __future__ import annotations

import argparse
import math
import sys
import tracemalloc
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from blocks import blockify  # noqa: E402
from real_samples import real_gpu_sample  # noqa: E402

from trainmeter_core.model import records  # noqa: E402
from trainmeter_core.model.engine import Engine  # noqa: E402
from trainmeter_core.model.history import History  # noqa: E402

RANKS = 8
STEPS = 20
DAY_POINTS = 24 * 3600 * 2  # a GPU counter's points in a day, at the sampler's 2 a second


def job_records(nodes: int) -> list[records.Record]:
    """A job of ``nodes`` × ``RANKS``: node 0's run start, every other node's clock and join, ``STEPS`` steps of every
    rank and three GPU samples of every GPU (copies of a real H200 one), numbered."""
    place = records.JobPlace(id="j", node_rank=0, nnodes=nodes, hub="10.0.0.1:1", found_by="torchrun flags")
    out: list[records.Record] = [
        records.RunStart(t=100.0, host="node0", run_id="r0", name="job", run_dir="/r0", command=["torchrun"],
                         cwd="/", tm_version="0", python="3.11", platform="linux", job=place)
    ]  # fmt: skip
    for k in range(1, nodes):
        out.append(records.ClockMap(t=100.5, host="node0", node_rank=k, node_host=f"node{k}", offset_s=0.0,
                                    basis="round_trip", uncertainty_s=1e-4))  # fmt: skip
        out.append(
            records.NodeEvent(t=100.5, host="node0", node_rank=k, node_host=f"node{k}", event="joined")
        )
    world = nodes * RANKS
    for k in range(nodes):
        for local in range(RANKS):
            rank = k * RANKS + local
            for step in range(1, STEPS + 1):
                out.append(records.Step(step=step, step_time_s=0.1, optimizers=1, micro_batches=1, tokens=1024,
                                        tokens_source="input_ids", dp=world, tokens_global=1024 * world,
                                        t=102.0 + 0.1 * step + rank * 1e-6, host=f"node{k}", rank=rank,
                                        source="agent", pid=10 + local))  # fmt: skip
    real = real_gpu_sample()
    for k in range(nodes):
        for gpu in range(RANKS):
            for t in (102.5, 103.0, 103.5):
                out.append(msgspec.structs.replace(real, host=f"node{k}", index=gpu, t=t, wall=1.7e9 + t,
                                                   gpm_window_start_t=t - 0.5, seq=None))  # fmt: skip
    for seq, record in enumerate(out, start=1):
        record.seq = seq
        record.wall = record.wall or 1.7e9 + record.t
    return out


def series_of(nodes: int) -> dict[str, int]:
    """The history series a job's engine keeps, by what they follow."""
    engine = Engine(history=History())
    for record in blockify(job_records(nodes), at_most=1000, rewall=True):
        engine.feed(record)
    names = list(engine._history._series)
    gpu = sum(name.startswith("tm:gpu:") for name in names)
    rank = sum(name.startswith("tm:rank:") for name in names)
    return {"all": len(names), "gpu": gpu, "rank": rank}


def a_days_series() -> tuple[float, float]:
    """(bytes held, bytes in the checkpoint) of one series after a day of points at 2 a second."""
    tracemalloc.start()
    history = History()
    for i in range(DAY_POINTS):
        history.add_point("s", float(i), math.nan, math.nan, 1.7e9 + i / 2, 0.5 + (i % 7) * 0.01)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return held, len(msgspec.msgpack.encode(history.to_state()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", default="4,64,256", help="job sizes, in nodes of 8 GPUs and 8 ranks")
    args = parser.parse_args()
    held, saved = a_days_series()
    print(f"one series after a day at 2 points a second ({DAY_POINTS:,} points): {held / 1e6:.2f} MB held, "
          f"{saved / 1e6:.2f} MB in the checkpoint")  # fmt: skip
    for nodes in (int(n) for n in args.nodes.split(",")):
        series = series_of(nodes)
        print(
            f"{nodes:>5} nodes x {RANKS}: {series['all']:,} series ({series['gpu']:,} of GPU counters, "
            f"{series['rank']:,} of ranks' step times); after a day about {series['all'] * held / 1e9:.2f} GB held "
            f"by node 0's engine (and by an open dashboard's copy) and {series['all'] * saved / 1e9:.2f} GB "
            f"written at each of its checkpoints (every 5 minutes)"
        )
    print(f"  reproduce: PYTHONPATH=. {sys.executable} bench/bench_job_history.py --nodes {args.nodes}")


if __name__ == "__main__":
    main()
