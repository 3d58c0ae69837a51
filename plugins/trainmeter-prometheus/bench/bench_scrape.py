"""What one scrape of /metrics costs the exporter: building every family from the state (the part done under the lock
the bus reader also takes) and writing each exposition, for a node of 8 GPUs and 8 ranks. Prints figures; not a test.

    python plugins/trainmeter-prometheus/bench/bench_scrape.py
"""

from __future__ import annotations

import statistics
import threading
import time

from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from trainmeter_prometheus.exporter import RunCollector, registry_for
from trainmeter_prometheus.families import families
from trainmeter_prometheus.identity import Identity
from trainmeter_prometheus.state import ExporterState

from trainmeter_core.api import records

GPUS = RANKS = 8
ROUNDS = 300


def node_state() -> ExporterState:
    state = ExporterState()
    metrics = {
        "mfu": records.MetricValue(low=0.29, high=0.34, label="datasheet"),
        "mfu_avg": records.MetricValue(low=0.28, high=0.33, label="datasheet"),
        "flop_per_token": records.MetricValue(low=7.4e8, high=8.6e8),
        "spent_flop": records.MetricValue(low=3.6e15, high=4.2e15),
        **{
            f"flop_per_token.{c}": records.MetricValue(value=8e8, convention=c)
            for c in ("titan", "megatron", "hf")
        },
        **{
            k: records.MetricValue(value=1.0)
            for k in ("tokens_per_s", "step_time_s", "ofu", "goodput", "energy_j")
        },
    }
    for i in range(GPUS):
        for prefix in ("gpu_power_throttle", "gpu_thermal_throttle", "gpu_lost", "gpu_xid"):
            metrics[f"{prefix}.n1/gpu{i}"] = records.MetricValue(value=0.0)
    ranks = [
        records.RankStat(rank=r, host="n1", steps=1000, step_time_s=0.4, device=f"n1/gpu{r}")
        for r in range(RANKS)
    ]
    state.feed(
        records.Snapshot(
            tick=100, wall=1.8e9, elapsed_s=100.0, steps=1000, tokens=10**9, metrics=metrics, ranks=ranks
        )
    )
    for i in range(GPUS):
        state.feed(
            records.SampleGpu(
                host="n1",
                index=i,
                uuid=f"GPU-{i}",
                name="NVIDIA H100 80GB HBM3",
                util_gpu=0.97,
                mem_used_b=2**36,
                mem_total_b=2**37,
                power_w=690.0,
                power_limit_w=700.0,
                temp_c=60.0,
                clock_sm_mhz=1980.0,
                sm_active=0.85,
                tensor_active=0.32,
                dram_active=0.43,
                energy_j=5e6,
            ),
            received_s=0.0,
        )
    state.feed(records.BusStats(received=10**6, published=10**6, malformed=0, unknown=0))
    for r in range(RANKS):
        state.feed(records.Step(host="n1", rank=r, step=1, agent_us=40.0))
    return state


def median_us(work) -> float:
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    state, who = node_state(), Identity(job="job", node="n1")
    registry = registry_for(RunCollector(state, threading.Lock(), who, {}, clock=lambda: 0.0))
    text = generate_latest(registry)
    print(
        f"node of {GPUS} GPUs and {RANKS} ranks: {text.count(b'# TYPE ')} families, "
        f"{sum(1 for line in text.splitlines() if not line.startswith(b'#'))} samples, {len(text)} bytes"
    )
    print(
        f"families built under the lock: {median_us(lambda: list(families(state, who, 0.0))):.0f} µs (median)"
    )
    print(f"a scrape, text format 0.0.4:   {median_us(lambda: generate_latest(registry)):.0f} µs")
    print(f"a scrape, OpenMetrics:         {median_us(lambda: generate_openmetrics(registry)):.0f} µs")


if __name__ == "__main__":
    main()
