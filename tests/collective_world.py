"""A synthetic data-parallel world for the straggler's tests: each rank waits for its data, computes, then meets the
others in an all_reduce that starts once the last rank arrives. Every rank reports what the collective probe and the
agent would (its data_wait phase, its step, its ``collectives`` metric record), each measured on the rank's own clock.

Pure (a seeded ``random.Random``), so a test's numbers are the same on every machine."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from trainmeter_core.model import records

RANKS = 4
#: One rank's share of the gradients, in bytes, and the all_reduce's time once every rank is in it.
GRAD_B = 25_000_000
ALL_REDUCE_S = 0.02


class World:
    """``RANKS`` ranks on ``hosts`` (rank r on ``hosts[r % len(hosts)]``, each host its own clock offset)."""

    def __init__(
        self,
        seed: int = 1,
        compute_s: float = 0.1,
        jitter_s: float = 0.01,
        data_s: float = 0.005,
        hosts: tuple[str, ...] = ("n1",),
    ) -> None:
        self.random = random.Random(seed)
        self.compute_s, self.jitter_s, self.data_s = compute_s, jitter_s, data_s
        self.hosts = hosts
        # Different hosts, different clocks: a rank's times are its host's own (never compared across hosts).
        self.offset_s = {host: 1000.0 * i for i, host in enumerate(hosts)}
        self.now_s = 100.0  # the world's true time
        self.step = 0
        self.slow_compute: dict[int, float] = {}
        self.slow_data: dict[int, float] = {}
        self.ticks = 0

    def host(self, rank: int) -> str:
        return self.hosts[rank % len(self.hosts)]

    def steps(self, count: int) -> Iterator[records.Record]:
        """The records of ``count`` more steps of every rank, in the order a hub would take them."""
        for _ in range(count):
            yield from self._one_step()

    def _one_step(self) -> Iterator[records.Record]:
        self.step += 1
        start = self.now_s
        data = {
            r: self.random.expovariate(1 / self.data_s) + self.slow_data.get(r, 0.0) for r in range(RANKS)
        }
        arrive = {
            r: start
            + data[r]
            + max(0.0, self.random.gauss(self.compute_s, self.jitter_s))
            + self.slow_compute.get(r, 0.0)
            for r in range(RANKS)
        }
        last = max(arrive.values())
        end = last + ALL_REDUCE_S
        for r in range(RANKS):
            host = self.host(r)
            shift = self.offset_s[host]
            wait = end - arrive[r]  # blocked from its arrival to the collective's end: none of it overlapped
            yield records.Phase(
                phase="data_wait",
                start_t=start + shift,
                end_t=start + data[r] + shift,
                host=host,
                rank=r,
                t=start + data[r] + shift,
            )
            yield records.Metric(
                values={
                    "collective_wait_s": wait,
                    f"coll.all_reduce.{RANKS}.bytes": float(GRAD_B),
                    f"coll.all_reduce.{RANKS}.time_s": wait,
                    f"coll.all_reduce.{RANKS}.count": 1.0,
                },
                origin="collectives",
                step=self.step,
                host=host,
                rank=r,
                t=end + shift,
            )
            yield records.Step(step=self.step, host=host, rank=r, t=end + shift)
        self.now_s = end


def feed_world(engine: Any, world: World, steps: int, every: int = 5) -> list[records.Snapshot]:
    """``steps`` steps of the world into ``engine``, a tick (a snapshot) every ``every`` steps."""
    snapshots: list[records.Snapshot] = []
    for done in range(steps):
        for record in world.steps(1):
            snapshots.extend(engine.feed(record))
        if (done + 1) % every == 0:
            world.ticks += 1
            t = world.now_s + world.offset_s[world.hosts[0]]
            snapshots.extend(engine.feed(records.Tick(t=t, n=world.ticks, interval_s=1.0)))
    return snapshots


def straggler_run(run_dir: Path) -> None:
    """A finished run of 4 ranks in an all_reduce; rank 2 computes 200 ms longer from step 60 on."""
    world = World(seed=12)
    logged: list[records.Record] = [
        records.RunStart(t=world.now_s - 1.0, wall=1.7e9, host="n1", run_id=run_dir.name, name="ddp",
                         run_dir=str(run_dir), command=["torchrun"], cwd="/", tm_version="0", python="3.11",
                         platform="linux"),
    ]  # fmt: skip
    logged += world.steps(60)
    world.slow_compute[2] = 0.2
    logged += world.steps(60)
    logged.append(records.Tick(t=world.now_s, host="n1", n=1, interval_s=1.0))
    logged.append(
        records.RunEnd(t=world.now_s + 0.1, host="n1", status=0, reason="exited", exit_code=0, elapsed_s=30.0)
    )
    run_dir.mkdir()
    lines = []
    for seq, record in enumerate(logged, 1):
        record.seq, record.v, record.source = seq, records.SCHEMA_VERSION, record.source or "agent"
        record.wall = record.wall or 1.7e9 + record.t
        lines.append(records.to_log_line(msgspec.to_builtins(record)))
    (run_dir / "events-0001.jsonl").write_bytes(b"".join(lines))
    (run_dir / "meta.json").write_text(json.dumps({"run_id": run_dir.name, "name": "ddp", "host": "n1"}))
