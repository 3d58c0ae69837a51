"""The metric families on /metrics, built from what the exporter knows (``ExporterState``) at one instant.

Pure: no I/O, no clock (the caller gives ``now_s``). A number the snapshot holds as absent is left out of /metrics,
never written as 0. A FLOPs number without one chosen convention is a range and is exported as its two ends, labelled
``convention="range"`` and ``bound="low"`` / ``bound="high"``; with a convention it is one sample, ``bound="value"``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from trainmeter_core.api import MetricValue, SampleGpu, Snapshot, is_loss, money
from trainmeter_prometheus import __version__, communication
from trainmeter_prometheus.identity import Identity
from trainmeter_prometheus.money_families import money_families
from trainmeter_prometheus.state import ExporterState

RUN = ["job", "node"]
FLOP_LABELS = [*RUN, "convention", "bound"]
#: A GPU whose latest sample is older than this drops out (the engine's health keys use the same 30 s).
GPU_MAX_AGE_S = 30.0
RUN_STATES = ("starting", "running", "finished", "lost")
CONVENTIONS = ("titan", "megatron", "hf", "all_params", "counted")

# snapshot metric key -> (family name, help, unit) for plain numbers of the run
RUN_GAUGES = {
    "tokens_per_s": (
        "trainmeter_tokens_per_second",
        "Tokens per second: EMA of rank 0's tokens per step over its step intervals.",
        "",
    ),
    "step_time_s": ("trainmeter_step_time_seconds", "EMA of rank 0's step interval.", "seconds"),
    "step_time_median_s": (
        "trainmeter_step_time_median_seconds",
        "Median of rank 0's latest 21 step intervals.",
        "seconds",
    ),
    "since_step_s": ("trainmeter_since_step_seconds", "Seconds since rank 0's latest step.", "seconds"),
    "progress": ("trainmeter_progress_ratio", "Share of the declared budget done, 0 to 1.", ""),
    "eta_s": (
        "trainmeter_eta_seconds",
        "Seconds left to the declared budget at the current rate.",
        "seconds",
    ),
    "ofu": (
        "trainmeter_ofu_ratio",
        "Observed FLOPs utilization from the GPU counters (tensor active, clock-scaled), averaged over the run's GPUs.",
        "",
    ),
    "observed_flop": (
        "trainmeter_observed_flop",
        "FLOPs the GPU counters observed (approximate: counter-based, no model convention).",
        "",
    ),
    "goodput": ("trainmeter_goodput_ratio", "Productive step time (the steps kept) / elapsed.", ""),
    "straggler_spread": (
        "trainmeter_straggler_spread_ratio",
        "(max - min) / median of the per-rank step-time EMAs.",
        "",
    ),
    "energy_j": (
        "trainmeter_energy_joules",
        "Energy of the run's GPUs: NVML's energy counter (sampled power over time where a GPU has none).",
        "joules",
    ),
    "host_cpu_cores": ("trainmeter_host_cpu_cores", "CPU cores busy in the run's process tree.", ""),
    "host_rss_b": ("trainmeter_host_rss_bytes", "Resident memory of the run's process tree.", "bytes"),
    "child_alive": ("trainmeter_training_alive", "1 while the training process lives, 0 after.", ""),
}

# snapshot metric key -> (family name, help) for FLOPs numbers, each with its convention
FLOP_GAUGES = {
    "flop_per_token": (
        "trainmeter_flop_per_token",
        "FLOPs per token under the run's convention (or the range over the conventions).",
    ),
    "spent_flop": ("trainmeter_spent_flop", "FLOPs spent so far: FLOPs per token x tokens seen."),
    "required_flop": ("trainmeter_required_flop", "FLOPs the declared budget requires."),
}

# sample.gpu field -> (family name, help, unit, factor to the base unit)
GPU_GAUGES = {
    "util_gpu": ("trainmeter_gpu_utilization_ratio", "GPU-Util: share of time a kernel ran.", "", 1.0),
    "util_mem": (
        "trainmeter_gpu_memory_utilization_ratio",
        "Share of time the memory controller was busy.",
        "",
        1.0,
    ),
    "mem_used_b": ("trainmeter_gpu_memory_used_bytes", "GPU memory used.", "bytes", 1.0),
    "mem_total_b": ("trainmeter_gpu_memory_total_bytes", "GPU memory in total.", "bytes", 1.0),
    "power_w": ("trainmeter_gpu_power_watts", "GPU power draw.", "watts", 1.0),
    "power_limit_w": ("trainmeter_gpu_power_limit_watts", "GPU power limit.", "watts", 1.0),
    "temp_c": ("trainmeter_gpu_temperature_celsius", "GPU temperature.", "celsius", 1.0),
    "clock_sm_mhz": ("trainmeter_gpu_sm_clock_hertz", "SM clock.", "hertz", 1e6),
    "clock_sm_max_mhz": ("trainmeter_gpu_sm_clock_max_hertz", "Maximum SM clock.", "hertz", 1e6),
    "clock_mem_mhz": ("trainmeter_gpu_memory_clock_hertz", "Memory clock.", "hertz", 1e6),
    "sm_active": ("trainmeter_gpu_sm_active_ratio", "GPM: share of SM cycles with a warp resident.", "", 1.0),
    "sm_occupancy": ("trainmeter_gpu_sm_occupancy_ratio", "GPM: warps resident / the SMs' maximum.", "", 1.0),
    "tensor_active": (
        "trainmeter_gpu_tensor_active_ratio",
        "GPM: share of cycles a tensor pipe was busy.",
        "",
        1.0,
    ),
    "dram_active": (
        "trainmeter_gpu_dram_active_ratio",
        "GPM: share of cycles the memory interface was busy.",
        "",
        1.0,
    ),
    "pcie_tx_bps": ("trainmeter_gpu_pcie_transmit_bytes_per_second", "PCIe bytes sent per second.", "", 1.0),
    "pcie_rx_bps": (
        "trainmeter_gpu_pcie_receive_bytes_per_second",
        "PCIe bytes received per second.",
        "",
        1.0,
    ),
    "nvlink_tx_bps": (
        "trainmeter_gpu_nvlink_transmit_bytes_per_second",
        "NVLink bytes sent per second.",
        "",
        1.0,
    ),
    "nvlink_rx_bps": (
        "trainmeter_gpu_nvlink_receive_bytes_per_second",
        "NVLink bytes received per second.",
        "",
        1.0,
    ),
    "ecc_corrected": ("trainmeter_gpu_ecc_corrected_errors", "Volatile corrected ECC error count.", "", 1.0),
    "ecc_uncorrected": (
        "trainmeter_gpu_ecc_uncorrected_errors",
        "Volatile uncorrected ECC error count.",
        "",
        1.0,
    ),
}

# snapshot per-GPU health key prefix -> (family name, help)
GPU_HEALTH = {
    "gpu_power_throttle": ("trainmeter_gpu_power_throttled", "1 while the GPU is slowed for power, else 0."),
    "gpu_thermal_throttle": (
        "trainmeter_gpu_thermal_throttled",
        "1 while the GPU is slowed for heat, else 0.",
    ),
    "gpu_lost": ("trainmeter_gpu_lost", "1 while NVML says the GPU fell off the bus, else 0."),
}


def families(
    state: ExporterState,
    who: Identity,
    now_s: float,
    about: Mapping[str, str] | None = None,
    price: money.Price | None = None,
) -> Iterator[Metric]:
    """Every family with its samples, in a stable order; families with no sample are left out. ``about`` describes
    the run (``run_id``, ``run_name``, ``tm_version``, and the scheduler's ids: ``identity.scheduler_labels``) for
    ``trainmeter_run_info``; ``price`` (the exporter's setting, else the run's) puts money on /metrics."""
    run = [who.job, who.node]
    info = InfoMetricFamily(
        "trainmeter_run",
        "The run: its id, name, tm's version, the exporter's; the Slurm and Kubernetes ids it read.",
        labels=RUN,
    )
    info.add_metric(run, {**{k: v for k, v in (about or {}).items() if v}, "exporter_version": __version__})
    yield info
    snapshot = state.snapshot
    if snapshot is not None:
        yield from _run(snapshot, run)
        yield from _losses(snapshot, run)
        yield from _flops(snapshot, run)
        yield from _ranks(snapshot, who)
        yield from communication.families(snapshot, who, RUN)
        yield from _gpu_health(snapshot, who)
        yield from money_families(snapshot, RUN, run, price)
    yield from _gpus(state.fresh_gpus(now_s, GPU_MAX_AGE_S), who)
    yield from _alerts(state, run)
    yield from _overhead(state, who, run)


def _kept(families: list[Metric]) -> Iterator[Metric]:
    return (f for f in families if f.samples)


def _known(snapshot: Snapshot, key: str) -> MetricValue | None:
    value = snapshot.metrics.get(key)
    if value is None or value.absent is not None:
        return None
    return value


def _ends(value: MetricValue) -> list[tuple[str, str, float]]:
    """(convention, bound, number): one under a convention, the two ends of a range without one."""
    if value.value is not None:
        return [(value.convention or "", "value", value.value)]
    if value.low is not None and value.high is not None:
        return [("range", "low", value.low), ("range", "high", value.high)]
    return []


def _run(snapshot: Snapshot, run: list[str]) -> Iterator[Metric]:
    tick = GaugeMetricFamily(
        "trainmeter_snapshot_tick",
        "The tick of the engine's snapshot every number here comes from.",
        labels=RUN,
    )
    tick.add_metric(run, snapshot.tick)
    stamp = GaugeMetricFamily(
        "trainmeter_snapshot_timestamp_seconds",
        "Wall time of that snapshot, seconds since the epoch (stale numbers show here).",
        labels=RUN,
        unit="seconds",
    )
    if snapshot.wall:
        stamp.add_metric(run, snapshot.wall)
    states = GaugeMetricFamily(
        "trainmeter_run_state",
        "The run's state: 1 for the current one, 0 for the others.",
        labels=[*RUN, "state"],
    )
    for name in RUN_STATES:
        states.add_metric([*run, name], 1.0 if snapshot.state == name else 0.0)
    elapsed = GaugeMetricFamily(
        "trainmeter_elapsed_seconds", "Seconds since the run started.", labels=RUN, unit="seconds"
    )
    if snapshot.elapsed_s is not None:
        elapsed.add_metric(run, snapshot.elapsed_s)
    steps = CounterMetricFamily("trainmeter_steps", "Training steps of rank 0 (the step clock).", labels=RUN)
    steps.add_metric(run, snapshot.steps)
    tokens = CounterMetricFamily("trainmeter_tokens", "Tokens seen: the sum of tokens per step.", labels=RUN)
    if snapshot.tokens is not None:
        tokens.add_metric(run, snapshot.tokens)
    out: list[Metric] = [tick, stamp, states, elapsed, steps, tokens]
    for key, (name, help_text, unit) in RUN_GAUGES.items():
        family = GaugeMetricFamily(name, help_text, labels=RUN, unit=unit)
        value = _known(snapshot, key)
        if value is not None and value.value is not None:
            family.add_metric(run, value.value)
        out.append(family)
    yield from _kept(out)


def _losses(snapshot: Snapshot, run: list[str]) -> Iterator[Metric]:
    """Each loss the loop reports (the catalog says which series are losses), at its latest value, with the origin it
    came from. A NaN or infinite loss is exported as such: it is a value the loop reported, and the one to alert on."""
    loss = GaugeMetricFamily(
        "trainmeter_loss",
        "The latest value of each loss the loop reports: train, validation, and any series whose name has the word "
        "loss; origin says where it came from (emit, backward, a tracker such as wandb).",
        labels=[*RUN, "series", "origin"],
    )
    for name, point in sorted(snapshot.series.items()):
        if is_loss(name):
            loss.add_metric([*run, name, point.origin or ""], point.value)
    nonfinite = CounterMetricFamily(
        "trainmeter_loss_nonfinite", "train_loss values that were NaN or infinite, over the run.", labels=RUN
    )
    value = _known(snapshot, "loss_nonfinite")
    if value is not None and value.value is not None:
        nonfinite.add_metric(run, value.value)
    yield from _kept([loss, nonfinite])


def _flops(snapshot: Snapshot, run: list[str]) -> Iterator[Metric]:
    out: list[Metric] = []
    for key, name, help_text in (
        (
            "mfu",
            "trainmeter_mfu_ratio",
            "Model FLOPs utilization now: FLOPs per token x tokens/s / dense peak.",
        ),
        (
            "mfu_avg",
            "trainmeter_mfu_window_ratio",
            "MFU of the run over its training window: the figure to quote at its end.",
        ),
    ):
        family = GaugeMetricFamily(name, help_text, labels=[*FLOP_LABELS, "peak"])
        value = _known(snapshot, key)
        if value is not None:
            for convention, bound, number in _ends(value):
                family.add_metric([*run, convention, bound, value.label or ""], number)
        out.append(family)
    for key, (name, help_text) in FLOP_GAUGES.items():
        family = GaugeMetricFamily(name, help_text, labels=FLOP_LABELS)
        value = _known(snapshot, key)
        if value is not None:
            for convention, bound, number in _ends(value):
                family.add_metric([*run, convention, bound], number)
        out.append(family)
    each = GaugeMetricFamily(
        "trainmeter_convention_flop_per_token",
        "FLOPs per token under each convention that can be computed, and counted (FlopCounterMode, one real step).",
        labels=[*RUN, "convention"],
    )
    for convention in CONVENTIONS:
        value = _known(snapshot, f"flop_per_token.{convention}")
        if value is not None and value.value is not None:
            each.add_metric([*run, convention], value.value)
    out.append(each)
    yield from _kept(out)


def _device(key: str | None, host: str) -> str:
    """``<host>/gpu0`` -> ``gpu0``; ``<host>/cpu/rank1`` -> ``cpu/rank1``: the node is a label of its own."""
    if not key:
        return ""
    return key[len(host) + 1 :] if host and key.startswith(host + "/") else key


def _ranks(snapshot: Snapshot, who: Identity) -> Iterator[Metric]:
    labels = [*RUN, "rank", "device"]
    step_time = GaugeMetricFamily(
        "trainmeter_rank_step_time_seconds",
        "EMA of each rank's step interval.",
        labels=labels,
        unit="seconds",
    )
    steps = CounterMetricFamily("trainmeter_rank_steps", "Training steps of each rank.", labels=labels)
    for rank in snapshot.ranks:
        node = who.node_of(rank.host)
        values = [who.job, node, str(rank.rank), _device(rank.device, rank.host)]
        steps.add_metric(values, rank.steps)
        if rank.step_time_s is not None:
            step_time.add_metric(values, rank.step_time_s)
    yield from _kept([step_time, steps])


def _gpu_key(key: str) -> tuple[str, str]:
    """``gpu_lost.<host>/gpu<i>`` -> (host, ``gpu<i>``)."""
    device = key.split(".", 1)[1]
    host, _, name = device.rpartition("/")
    return host, name


def _gpu_health(snapshot: Snapshot, who: Identity) -> Iterator[Metric]:
    labels = [*RUN, "device"]
    out: list[Metric] = []
    for prefix, (name, help_text) in GPU_HEALTH.items():
        family = GaugeMetricFamily(name, help_text, labels=labels)
        for key in sorted(k for k in snapshot.metrics if k.startswith(prefix + ".")):
            value = _known(snapshot, key)
            if value is not None and value.value is not None:
                host, device = _gpu_key(key)
                family.add_metric([who.job, who.node_of(host), device], value.value)
        out.append(family)
    xid = CounterMetricFamily(
        "trainmeter_gpu_xid_errors", "Xid events the GPU reported over the run.", labels=labels
    )
    for key in sorted(k for k in snapshot.metrics if k.startswith("gpu_xid.")):
        value = _known(snapshot, key)
        if value is not None and value.value is not None:
            host, device = _gpu_key(key)
            xid.add_metric([who.job, who.node_of(host), device], value.value)
    out.append(xid)
    yield from _kept(out)


def _gpus(samples: list[SampleGpu], who: Identity) -> Iterator[Metric]:
    labels = [*RUN, "device"]
    info = InfoMetricFamily(
        "trainmeter_gpu",
        "Each sampled GPU: its UUID, its name, the platform adapter, and whether it is a fake (tests and demos).",
        labels=labels,
    )
    gauges = {
        field: GaugeMetricFamily(name, help_text, labels=labels, unit=unit)
        for field, (name, help_text, unit, _) in GPU_GAUGES.items()
    }
    energy = CounterMetricFamily(
        "trainmeter_gpu_energy_joules", "GPU energy since the driver loaded.", labels=labels, unit="joules"
    )
    for sample in samples:
        values = [who.job, who.node_of(sample.host), f"gpu{sample.index}"]
        described = {"uuid": sample.uuid or "", "name": sample.name or "", "adapter": sample.adapter}
        if sample.fake:
            described["fake"] = "true"
        info.add_metric(values, described)
        for field, (_, _, _, factor) in GPU_GAUGES.items():
            number = getattr(sample, field)
            if number is not None:
                gauges[field].add_metric(values, number * factor)
        if sample.energy_j is not None:
            energy.add_metric(values, sample.energy_j)
    yield from _kept([info, *gauges.values(), energy])


def _alerts(state: ExporterState, run: list[str]) -> Iterator[Metric]:
    firing = GaugeMetricFamily(
        "trainmeter_alert_firing",
        "1 for each alert episode that fired and has not cleared.",
        labels=[*RUN, "rule", "severity", "subject"],
    )
    for (rule, subject), alert in sorted(state.firing.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        firing.add_metric([*run, rule, alert.severity, subject or ""], 1.0)
    fired = CounterMetricFamily(
        "trainmeter_alerts_fired",
        "Alert episodes fired over the run, per rule.",
        labels=[*RUN, "rule", "severity"],
    )
    for (rule, severity), count in sorted(state.fired.items()):
        fired.add_metric([*run, rule, severity], count)
    yield from _kept([firing, fired])


def _overhead(state: ExporterState, who: Identity, run: list[str]) -> Iterator[Metric]:
    out: list[Metric] = []
    stats = state.bus_stats
    if stats is not None:
        for name, help_text, number in (
            ("trainmeter_bus_received_records", "Records the hub accepted.", stats.received),
            (
                "trainmeter_bus_dropped_records",
                "Records producers dropped rather than block (a full bus), as they last reported.",
                stats.dropped_total,
            ),
            (
                "trainmeter_bus_malformed_records",
                "Malformed messages the hub counted and dropped.",
                stats.malformed,
            ),
            (
                "trainmeter_bus_unknown_records",
                "Records of a kind or field this tm does not know.",
                stats.unknown,
            ),
            (
                "trainmeter_log_queue_dropped_records",
                "Records the recorder could not take (its queue was full).",
                stats.log_queue_dropped,
            ),
            (
                "trainmeter_log_reserve_skipped_records",
                "Records left out of the log to keep the disk's free-space reserve.",
                stats.log_reserve_skipped,
            ),
        ):
            family = CounterMetricFamily(name, help_text, labels=RUN)
            family.add_metric(run, number)
            out.append(family)
        size = GaugeMetricFamily(
            "trainmeter_log_size_bytes", "Bytes of the run log.", labels=RUN, unit="bytes"
        )
        size.add_metric(run, stats.log_bytes)
        out.append(size)
    labels = [*RUN, "rank"]
    agent_s = CounterMetricFamily(
        "trainmeter_agent_seconds",
        "The agent's own time inside the training process, summed over steps (since this exporter started).",
        labels=labels,
        unit="seconds",
    )
    agent_steps = CounterMetricFamily(
        "trainmeter_agent_steps",
        "Steps that carried the agent's own time (since this exporter started).",
        labels=labels,
    )
    for (host, rank), cost in sorted(state.agent.items()):
        values = [who.job, who.node_of(host), str(rank)]
        agent_s.add_metric(values, cost.seconds)
        agent_steps.add_metric(values, cost.steps)
    crashes = CounterMetricFamily(
        "trainmeter_component_crashes",
        "Crashes of each tm component (each restarted with backoff).",
        labels=[*RUN, "component"],
    )
    for name, count in sorted(state.crashes.items()):
        crashes.add_metric([*run, name], count)
    yield from _kept([*out, agent_s, agent_steps, crashes])
