"""The communication families from the engine's own snapshot: four ranks in an all_reduce, rank 1 late by 200 ms of
data wait each step (its records as the collective probe and the agent send them, into a real engine), exported;
promtool (Prometheus' own checker) accepts the exposition, and every rank's waits and bus bandwidth and the straggler's
rank, host and cause are there."""

from __future__ import annotations

import subprocess

from prometheus_testing import WHO, key, require_prometheus, samples, text
from trainmeter_prometheus.state import ExporterState

from trainmeter_core.api import records
from trainmeter_core.model.engine import Engine

RANKS = 4


def late_rank_1(steps: int = 30) -> list[records.Record]:
    """Each step: every rank's data wait (rank 1's 200 ms longer), 100 ms of compute, then a 20 ms all_reduce that
    starts once rank 1 arrives; each rank's data_wait phase, collectives record and step."""
    out: list[records.Record] = []
    now = 100.0
    for step in range(1, steps + 1):
        data = {r: 0.21 if r == 1 else 0.01 for r in range(RANKS)}
        end = now + max(data.values()) + 0.1 + 0.02
        for r in range(RANKS):
            wait = end - (now + data[r] + 0.1)
            values = {"collective_wait_s": wait, "coll.all_reduce.4.bytes": 25e6, "coll.all_reduce.4.time_s": wait,
                      "coll.all_reduce.4.count": 1.0}  # fmt: skip
            out += [
                records.Phase(
                    phase="data_wait", start_t=now, end_t=now + data[r], host=WHO.node, rank=r, t=now
                ),
                records.Metric(values=values, origin="collectives", step=step, host=WHO.node, rank=r, t=end),
                records.Step(step=step, host=WHO.node, rank=r, t=end),
            ]
        now = end
    out.append(records.Tick(t=now, n=1, interval_s=1.0))
    return out


def test_the_engines_straggler_and_each_ranks_communication_pass_promtool():
    _, promtool = require_prometheus()
    engine = Engine()
    (snapshot,) = [s for record in late_rank_1() for s in engine.feed(record)]
    state = ExporterState()
    state.feed(snapshot)
    exposition = text(state)
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=exposition, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    got = samples(exposition)
    assert got[key("trainmeter_straggler_rank", host=WHO.node, cause="data wait")] == 1.0
    assert 0.15 < got[key("trainmeter_straggler_wait_seconds")] < 0.25  # the 200 ms rank 1 is late
    for rank in range(RANKS):
        bandwidth = key(
            "trainmeter_rank_bus_bandwidth_bytes_per_second", rank=str(rank), op="all_reduce", group_size="4"
        )
        assert got[bandwidth] > 0
        assert got[key("trainmeter_rank_collective_wait_seconds", rank=str(rank), device="")] > 0
    assert got[key("trainmeter_rank_data_wait_seconds", rank="1", device="")] > 0.15
