"""The formulas behind every number tm derives: EMA, MFU, OFU, arithmetic intensity, goodput, progress and ETA.

Pure: small functions of numbers, no I/O, no clock, no state. They never invent an input: one that makes a formula
meaningless (a zero peak, no elapsed time) is a ValueError naming it, and the engine shows the metric absent instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = [
    "EMA_ALPHA",
    "arithmetic_intensity",
    "ema",
    "eta_s",
    "gpu_hours",
    "goodput",
    "mean",
    "median",
    "mfu",
    "mfu_window_average",
    "observed_flop",
    "ofu",
    "progress",
    "projected_hours",
    "rate_per_s",
    "ridge_flop_per_byte",
    "straggler_spread",
    "time_split",
]

#: Weight of the newest step in every EMA. 0.1 gives the last 10 steps about 65 % of the weight: smooth enough to
#: read at a glance, quick enough that a slowdown shows within a few tens of steps.
EMA_ALPHA = 0.1


def _positive(name: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _fraction(name: str, value: float) -> None:
    if not (0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be a fraction from 0 to 1, got {value!r}")


def ema(previous: float | None, sample: float, alpha: float = EMA_ALPHA) -> float:
    """Exponential moving average: the first sample starts it, each later one moves it by ``alpha`` of the gap."""
    if previous is None:
        return float(sample)
    return previous + alpha * (sample - previous)


def rate_per_s(amount_ema: float, interval_ema_s: float) -> float:
    """A rate from two EMAs: amount per step over seconds per step (tokens/s = EMA tokens / EMA step interval).

    The ratio of the two EMAs weighs each step by its duration; an EMA of per-step rates would let short steps count
    as much as long ones.
    """
    _positive("the step interval", interval_ema_s)
    return amount_ema / interval_ema_s


def mfu(flop_per_token: float, tokens_per_s: float, peak_total_flop_per_s: float) -> float:
    """Model FLOPs utilization: FLOPs per token × tokens/s / (Σ over devices of the dense peak, FLOP/s)."""
    _positive("the total dense peak", peak_total_flop_per_s)
    return flop_per_token * tokens_per_s / peak_total_flop_per_s


def mfu_window_average(
    flop_per_token: float, window_tokens: float, window_s: float, peak_total_flop_per_s: float
) -> float:
    """MFU over the training window: FLOPs per token × tokens in the window / (total peak × window seconds)."""
    _positive("the training window", window_s)
    _positive("the total dense peak", peak_total_flop_per_s)
    return flop_per_token * window_tokens / (peak_total_flop_per_s * window_s)


def ofu(tensor_active: float, clock_sm_mhz: float, tensor_clock_mhz: float) -> float:
    """Observed FLOPs utilization of one GPU: tensor active × min(SM clock, tensor clock) / tensor clock.

    The tensor clock is the clock the dense peak is stated at, so a GPU boosting above it (1980 MHz on an H100 SXM
    whose peak is stated at 1830) is not credited beyond its tensor activity, and a throttled one is scaled down.
    """
    _fraction("tensor active", tensor_active)
    _positive("the tensor clock", tensor_clock_mhz)
    if not (clock_sm_mhz >= 0 and math.isfinite(clock_sm_mhz)):
        raise ValueError(f"the SM clock must be a finite number of MHz, got {clock_sm_mhz!r}")
    return tensor_active * min(clock_sm_mhz, tensor_clock_mhz) / tensor_clock_mhz


def observed_flop(ofu_seconds: float, peak_flop_per_s: float) -> float:
    """FLOPs the counters saw on one GPU: Σ (OFU × sampling window) × its dense peak. Approximate by nature."""
    return ofu_seconds * peak_flop_per_s


def ridge_flop_per_byte(peak_flop_per_s: float, memory_bandwidth_bps: float) -> float:
    """The roofline's ridge point: peak FLOP/s over memory bandwidth in bytes/s."""
    _positive("the memory bandwidth", memory_bandwidth_bps)
    return peak_flop_per_s / memory_bandwidth_bps


def arithmetic_intensity(
    mfu_fraction: float, peak_flop_per_s: float, memory_bandwidth_bps: float, dram_active: float
) -> float:
    """FLOP per byte of memory traffic over a window: ridge × MFU / DRAM active.

    Achieved FLOP/s is MFU × peak and achieved bytes/s is DRAM active × bandwidth; their ratio is the ridge
    (peak / bandwidth) × MFU / DRAM active. An aggregate over the window, not any one kernel's.
    """
    _positive("DRAM active", dram_active)
    return ridge_flop_per_byte(peak_flop_per_s, memory_bandwidth_bps) * mfu_fraction / dram_active


def goodput(compute_s: float, elapsed_s: float) -> float:
    """The share of the allocated time that trained: productive step time (the steps kept) / elapsed."""
    _positive("elapsed time", elapsed_s)
    return compute_s / elapsed_s


def progress(done: float, budget: float) -> float:
    """Done over budget, 0..1 (a run past its budget reads 1)."""
    _positive("the budget", budget)
    return min(1.0, max(0.0, done / budget))


def eta_s(remaining: float, per_s: float) -> float:
    """Seconds left: what remains of the budget over the current rate (0 once the budget is spent)."""
    _positive("the rate", per_s)
    return max(0.0, remaining) / per_s


def projected_hours(elapsed_s: float, remaining_s: float) -> float:
    """Wall hours the whole run will have taken: elapsed + ETA."""
    return (elapsed_s + remaining_s) / 3600.0


def gpu_hours(elapsed_s: float, n_devices: int) -> float:
    """Device-hours so far: elapsed × devices (a view overlay; the log stores no price)."""
    return elapsed_s * n_devices / 3600.0


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean, summed in the order given (callers order by device key, so results are repeatable)."""
    if not values:
        raise ValueError("a mean needs at least one value")
    total = 0.0
    for value in values:
        total += value
    return total / len(values)


def median(values: Sequence[float]) -> float:
    """The median; the mean of the middle two for an even count."""
    if not values:
        raise ValueError("a median needs at least one value")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def straggler_spread(step_times_s: Sequence[float]) -> tuple[float, int]:
    """(max − min) / median of per-rank step times, and the position of the slowest (the first one on a tie)."""
    if len(step_times_s) < 2:
        raise ValueError("a straggler spread needs at least 2 ranks")
    middle = median(step_times_s)
    _positive("the median step time", middle)
    slowest = max(range(len(step_times_s)), key=lambda i: (step_times_s[i], -i))
    return (max(step_times_s) - min(step_times_s)) / middle, slowest


#: The badput buckets of the time split, in the order a person reads them (docs/metrics.md gives each its formula).
BADPUT_BUCKETS = (
    "startup",
    "compile",
    "data_wait",
    "checkpoint",
    "checkpoint_load",
    "eval",
    "profiler",
    "hang",
    "superseded",
    "down",
    "after_last_step",
    "other",
)
#: Phases the probes report, each its own bucket wherever it lies (a ``startup`` phase joins start-up).
PHASE_BUCKETS = ("startup", "compile", "data_wait", "checkpoint", "checkpoint_load", "eval", "profiler")


def time_split(
    *,
    elapsed_s: float,
    compute_s: float,
    startup_s: float,
    after_last_step_s: float,
    phase_s: Mapping[str, float],
    hang_s: float,
    superseded_s: float,
    down_s: float,
) -> dict[str, float]:
    """Where the allocated time went, in seconds: productive step time (``compute``) and the badput buckets, which add
    up to ``elapsed_s``.

    Each phase a probe reported is its own bucket wherever it lies (before the first step, between steps, after the
    last one); ``startup_s`` and ``after_last_step_s`` are the rest of each attempt's time before its first step and
    after its last one, and ``compute_s`` the rest of the time between steps, less the hangs. ``other`` is what
    none of them holds (phases that overlap, clocks that disagree): named, never hidden, and 0 when all is accounted.
    """
    split = {name: 0.0 for name in BADPUT_BUCKETS}
    for name in PHASE_BUCKETS:
        split[name] += phase_s.get(name, 0.0)
    split["startup"] += startup_s
    split["hang"] = hang_s
    split["superseded"] = superseded_s
    split["down"] = down_s
    split["after_last_step"] = after_last_step_s
    named = compute_s
    for name in BADPUT_BUCKETS:
        named += split[name]
    split["other"] = elapsed_s - named
    split["compute"] = compute_s
    return split
