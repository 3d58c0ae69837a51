"""Where the paid GPU time went, in one summary like Slurm's ``seff``: GPU-hours allocated and used, the GPUs that sat
idle, each GPU's peak memory, the energy, the money and the goodput. Each figure is the engine's where the engine has
it (the final snapshot) or the run's own GPU samples' (``GpuUsage``); one that cannot be told is absent with the
reason, never a zero.

Pure: the caller reads the snapshot and the samples (``runlog/gpu_usage``). Money is a view: the price is given by
whoever looks (``Price``), never read from the run, and without one money is absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from trainmeter_core.model import money, passport, records

#: A GPU whose GPU-Util averaged below this over the run did nothing the run paid it for: an idle GPU.
IDLE_UTIL = 0.05
#: Joules in a kilowatt-hour.
J_PER_KWH = 3.6e6


class GpuUse(msgspec.Struct):
    """One GPU over the run, from its ``sample.gpu`` records."""

    util_sum: float = 0.0
    util_samples: int = 0
    peak_mem_b: int | None = None
    mem_total_b: int | None = None

    def mean_util(self) -> float | None:
        return self.util_sum / self.util_samples if self.util_samples else None


class GpuUsage(msgspec.Struct):
    """Every sampled GPU of the node(s), by key (``<host>/gpu<index>``, the rig's device key). Fed in any order."""

    gpus: dict[str, GpuUse] = msgspec.field(default_factory=dict)

    def feed(self, sample: records.SampleGpu) -> None:
        use = self.gpus.setdefault(f"{sample.host}/gpu{sample.index}", GpuUse())
        if sample.util_gpu is not None:
            use.util_sum += sample.util_gpu
            use.util_samples += 1
        if sample.mem_used_b is not None and (use.peak_mem_b is None or sample.mem_used_b > use.peak_mem_b):
            use.peak_mem_b = sample.mem_used_b
        if sample.mem_total_b is not None:
            use.mem_total_b = sample.mem_total_b


# The price is money.py's: given by whoever looks, never stored.
Price = money.Price
NO_PRICE = money.NO_PRICE


def run_gpus(snapshot: records.Snapshot) -> list[str]:
    """The GPUs the run computes on: its ranks' devices that are GPUs (``<host>/gpu<i>``), each once, in order."""
    return list(dict.fromkeys(r.device for r in snapshot.ranks if r.device and "/gpu" in r.device))


def _known(snapshot: records.Snapshot, key: str) -> tuple[float | None, str | None]:
    """A metric's value, or None and its reason."""
    metric = snapshot.metrics.get(key)
    if metric is None:
        return None, f"the snapshot has no {key}"
    if metric.value is None:
        return None, metric.absent or "not known"
    return metric.value, None


def _figure(value: Any = None, absent: str | None = None, **more: Any) -> dict[str, Any]:
    return {"value": value, **more} if absent is None else {"absent": absent}


def paid_time(
    snapshot: records.Snapshot, usage: GpuUsage | None, price: Price | None = None
) -> dict[str, dict[str, Any]]:
    """Every figure of the summary as plain data: ``{"value": ...}`` (with its unit or detail), or ``{"absent":
    reason}``. ``usage`` is None where the run's samples were not read (then the figures made from them say so)."""
    gpus = run_gpus(snapshot)
    allocated, allocated_why = _known(snapshot, "gpu_hours")
    out: dict[str, dict[str, Any]] = {
        "gpus": _figure(gpus, None if gpus else allocated_why or "no rank reported a GPU"),
        "allocated_gpu_hours": _figure(allocated, allocated_why, unit="h"),
    }
    means: dict[str, float] = {}
    usage_why = None
    if not gpus:
        usage_why = out["gpus"]["absent"]
    elif usage is None:
        usage_why = "the run's GPU samples were not read"
    else:
        for key in gpus:
            mean = usage.gpus[key].mean_util() if key in usage.gpus else None
            if mean is None:
                usage_why = f"no GPU-Util sample of {key} in the run's log"
                break
            means[key] = mean
    if usage_why is not None:
        out["used_gpu_hours"] = _figure(absent=usage_why)
        out["idle_gpus"] = _figure(absent=usage_why)
    else:
        efficiency = sum(means.values()) / len(means)
        out["used_gpu_hours"] = (
            _figure(allocated * efficiency, unit="h", efficiency=efficiency)
            if allocated is not None
            else _figure(absent=allocated_why)
        )
        idle = [key for key, mean in means.items() if mean < IDLE_UTIL]
        out["idle_gpus"] = _figure(len(idle), of=len(means), which=idle, below=IDLE_UTIL)
    peaks = {}
    for key in gpus:
        use = usage.gpus.get(key) if usage is not None else None
        if use is not None and use.peak_mem_b is not None:
            peaks[key] = {"peak_b": use.peak_mem_b, "total_b": use.mem_total_b}
    if not gpus or usage is None:
        out["peak_memory"] = _figure(
            absent=out["gpus"].get("absent") or "the run's GPU samples were not read"
        )
    else:
        out["peak_memory"] = _figure(
            peaks, None if peaks else "no GPU memory reading of the run's GPUs in its log"
        )
    energy, energy_why = _known(snapshot, "energy_j")
    out["energy_j"] = _figure(energy, energy_why, unit="J")
    if price is None:
        out["money"] = _figure(absent=NO_PRICE)
    elif allocated is None:
        out["money"] = _figure(absent=f"GPU-hours unknown: {allocated_why}")
    else:
        out["money"] = _figure(
            allocated * price.per_gpu_hour,
            source=price.source,
            per_gpu_hour=price.per_gpu_hour,
            currency=price.currency,
        )
    goodput, goodput_why = _known(snapshot, "goodput")
    out["goodput"] = _figure(goodput, goodput_why)
    return out


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _hours(h: float) -> str:
    return f"{h:.4g} h"


def energy_text(joules: float) -> str:
    """``10.24 kJ (0.002845 kWh)``: joules with their SI prefix and the kilowatt-hours a bill counts."""
    return f"{passport.rate_text(joules, 'J')} ({joules / J_PER_KWH:.4g} kWh)"


def money_text(figure: Mapping[str, Any]) -> str:
    currency = figure.get("currency") or ""
    return (
        f"{figure['value']:.2f}{' ' + currency if currency else ''} "
        f"({figure['per_gpu_hour']:g} per GPU-hour, from {figure['source']})"
    )


def lines(figures: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The summary as ``seff`` prints it: one ``Name: value`` line a figure, ``n/a (reason)`` where unknown."""

    def say(name: str, text: str | None, key: str) -> str:
        return f"{name}: {text if text is not None else 'n/a (' + figures[key]['absent'] + ')'}"

    def known(key: str) -> Mapping[str, Any] | None:
        figure = figures[key]
        return None if "absent" in figure else figure

    gpus, allocated, used = known("gpus"), known("allocated_gpu_hours"), known("used_gpu_hours")
    idle, peaks, energy = known("idle_gpus"), known("peak_memory"), known("energy_j")
    money, goodput = known("money"), known("goodput")
    out = [say("GPUs", f"{len(gpus['value'])} ({', '.join(gpus['value'])})" if gpus else None, "gpus")]
    out.append(
        say("GPU-hours allocated", _hours(allocated["value"]) if allocated else None, "allocated_gpu_hours")
    )
    out.append(
        say(
            "GPU-hours used",
            f"{_hours(used['value'])} (GPU efficiency {used['efficiency']:.1%}: the run's mean GPU-Util)"
            if used
            else None,
            "used_gpu_hours",
        )
    )
    idle_text = None
    if idle:
        which = f": {', '.join(idle['which'])}" if idle["which"] else ""
        idle_text = f"{idle['value']} of {idle['of']} (mean GPU-Util under {idle['below']:.0%}){which}"
    out.append(say("Idle GPUs", idle_text, "idle_gpus"))
    peak_text = None
    if peaks:
        peak_text = "; ".join(
            f"{key} {_gib(p['peak_b'])}" + (f" of {_gib(p['total_b'])}" if p.get("total_b") else "")
            for key, p in peaks["value"].items()
        )
    out.append(say("Peak memory per GPU", peak_text, "peak_memory"))
    out.append(say("Energy", energy_text(energy["value"]) if energy else None, "energy_j"))
    out.append(say("Money", money_text(money) if money else None, "money"))
    out.append(say("Goodput", f"{goodput['value']:.1%}" if goodput else None, "goodput"))
    return out


def markdown(figures: Mapping[str, Mapping[str, Any]]) -> str:
    """The summary as a section of the passport's Markdown (the report shows it after the passport)."""
    return "\n".join(["## Paid time", "", *(f"- {x}" for x in lines(figures))]) + "\n"


def end_words(snapshot: records.Snapshot, price: Price | None = None) -> list[str]:
    """The phrases the end of a run's one summary line gains where known: the energy, and the money where a price
    was given."""
    words = []
    energy, _ = _known(snapshot, "energy_j")
    if energy is not None:
        words.append(f"energy {passport.rate_text(energy, 'J')}")
    allocated, _ = _known(snapshot, "gpu_hours")
    if price is not None and allocated is not None:
        currency = f" {price.currency}" if price.currency else ""
        words.append(f"money {allocated * price.per_gpu_hour:.2f}{currency} (price from {price.source})")
    return words
