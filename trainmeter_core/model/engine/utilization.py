"""Utilization, a metric family: MFU (EMA and training-window average), and what pairs it with the counters (the
MFU-OFU gap, observed FLOPs, arithmetic intensity); energy is its own family (``energy``), put here once the counters
chose the run's GPUs. The counters themselves are ``counters``. Pure."""

from __future__ import annotations

from typing import Any

from trainmeter_core.model import formulas, records
from trainmeter_core.model.engine import energy
from trainmeter_core.model.engine.builder import EI, NO_TOKENS, SnapshotBuilder, join_notes
from trainmeter_core.model.engine.state import (
    GpuState,
)
from trainmeter_core.model.rig import Rig, RigDevice, ofu_clock


def mfu_metrics(snap: SnapshotBuilder) -> None:
    state = snap.state
    rig = snap.derived.rig
    peak_total = rig.peak_total_flop_per_s
    ends = snap.fpt_ends()
    conv = snap.derived.flops.convention
    label = rig.peak_kind
    inputs = _peak_inputs(rig)
    inputs.update(snap.derived.flops.inputs)
    notes = list(rig.notes)
    base: list[str] = []
    if peak_total is None:
        base.append(str(rig.peak_absent))
    if ends is None:
        base.append(str(snap.derived.flops.absent))
    formula = "FLOPs per token × tokens per s (EMA over steps) / (Σ dense peak of the run's devices)"
    reasons = base + ([snap.tps_absent] if snap.tps is None else [])
    if reasons:
        snap.put("mfu", formula, absent="; ".join(reasons), convention=conv, label=label, inputs=inputs)
    else:
        assert ends is not None and peak_total is not None and snap.tps is not None
        inputs["tokens_per_s"] = EI(
            value=snap.tps, unit="tokens/s", source=f"EMA, alpha {formulas.EMA_ALPHA}"
        )
        low = formulas.mfu(ends[0], snap.tps, peak_total)
        high = formulas.mfu(ends[1], snap.tps, peak_total)
        snap.mfu = (low, high)
        if conv is not None:
            snap.put(
                "mfu", formula, value=low, convention=conv, label=label, inputs=inputs, note=join_notes(notes)
            )
        else:
            notes.insert(0, "no convention chosen (pass --convention): the range over the conventions")
            snap.put("mfu", formula, low=low, high=high, label=label, inputs=inputs, note=join_notes(notes))
    formula = "FLOPs per token × tokens in the training window / (Σ dense peak × window seconds)"
    window = None
    if state.first_step_t is not None and state.last_step_t is not None:
        # A resumed run's window leaves out each join (from a last step to the next attempt's first): nothing stepped.
        window = state.last_step_t - state.first_step_t - state.profiled_s - state.resume.join_s
    reasons = list(base)
    if state.steps < 2:
        reasons.append("the training window needs two steps")
    elif state.window_steps_without_tokens:
        reasons.append(NO_TOKENS)
    elif window is None or window <= 0 or state.window_tokens <= 0:
        reasons.append("the training window holds no time or no tokens")
    window_fields = {"window_start_t": state.first_step_t, "window_end_t": state.last_step_t}
    if reasons:
        snap.put("mfu_avg", formula, absent="; ".join(reasons), convention=conv, label=label)
        return
    assert ends is not None and peak_total is not None and window is not None
    window_inputs = {k: v for k, v in inputs.items() if k != "tokens_per_s"}
    window_inputs["window_tokens"] = EI(
        value=state.window_tokens, unit="tokens", source="rank 0 steps after the first"
    )
    source = "first to last step, profiled steps left out"
    if state.resume.join_s:
        source += ", and the time between attempts of a resumed run"
    window_inputs["window_s"] = EI(value=window, unit="s", source=source)
    low = formulas.mfu_window_average(ends[0], state.window_tokens, window, peak_total)
    high = formulas.mfu_window_average(ends[1], state.window_tokens, window, peak_total)
    snap.mfu_avg = (low, high)
    if conv is not None:
        snap.put(
            "mfu_avg",
            formula,
            value=low,
            convention=conv,
            label=label,
            inputs=window_inputs,
            **window_fields,
        )
    else:
        snap.put(
            "mfu_avg",
            formula,
            low=low,
            high=high,
            label=label,
            inputs=window_inputs,
            **window_fields,
            note="no convention chosen (pass --convention): the range over the conventions",
        )


def after_counters(snap: SnapshotBuilder, keys: list[str], why: str | None, latest: list[GpuState]) -> None:
    """The gap, observed FLOPs, arithmetic intensity and energy, once ``counters`` put the ladder and OFU."""
    gap(snap)
    observed(snap, keys, why)
    intensity(snap)
    energy.energy(snap, latest, why)


def gap(snap: SnapshotBuilder) -> None:
    label = f"counters − {snap.derived.rig.peak_kind or 'model'}"
    mfu_key = "mfu_avg" if snap.counters_window else "mfu"
    mfu = snap.mfu_avg if snap.counters_window else snap.mfu
    formula = "OFU − MFU, both over the training window" if snap.counters_window else "OFU − MFU"
    ofu = snap.ofu
    if ofu is not None and mfu is not None:
        low, high = ofu - mfu[1], ofu - mfu[0]
        bounds = {}
        if snap.counters_window:
            window = snap.metrics["ofu"]
            bounds = {"window_start_t": window.window_start_t, "window_end_t": window.window_end_t}
        if low == high:
            snap.put(
                "mfu_ofu_gap",
                formula,
                value=low,
                label=label,
                convention=snap.derived.flops.convention,
                **bounds,
            )
        else:
            snap.put("mfu_ofu_gap", formula, low=low, high=high, label=label, **bounds)
    else:
        missing = "; ".join(m.absent for m in (snap.metrics["ofu"], snap.metrics[mfu_key]) if m.absent)
        snap.put("mfu_ofu_gap", formula, absent=missing or "no MFU range", label=label)


def observed(snap: SnapshotBuilder, keys: list[str], why: str | None) -> None:
    formula = "Σ over the run's GPUs and samples of OFU × sampling window × dense peak"
    total = 0.0
    ofu_s = 0.0
    samples = 0
    reason = why
    for key in keys:
        gpu = snap.state.gpus.get(key)
        device = snap.derived.rig.sampled.get(key)
        peak = device.peak_flop_per_s if device is not None else None
        if gpu is None or not gpu.ofu_samples:
            _, no_basis = ofu_clock(device, gpu.clock_sm_max_mhz if gpu is not None else None)
            reason = reason or no_basis or f"no sample from {key} with tensor activity and an SM clock"
        elif peak is None:
            reason = reason or f"no dense peak for {key}"
        else:
            total += formulas.observed_flop(gpu.ofu_s, peak)
            ofu_s += gpu.ofu_s
            samples += gpu.ofu_samples
    if reason is None and keys:
        inputs = {"ofu_seconds": EI(value=ofu_s, unit="s", source=f"Σ OFU × window over {samples} samples")}
        bases = sorted(
            {str(snap.state.gpus[key].ofu_basis) for key in keys if snap.state.gpus[key].ofu_basis}
        )
        note = "from counters, not a model count: carries no FLOPs-per-token convention"
        if bases:
            note += "; OFU's clock basis: " + "; ".join(bases)
        snap.put(
            "observed_flop",
            formula,
            value=total,
            unit="FLOP",
            label="counters, approximate",
            inputs=inputs,
            note=note,
        )
    else:
        snap.put(
            "observed_flop",
            formula,
            absent=reason or "no GPU sample yet",
            unit="FLOP",
            label="counters, approximate",
        )


def intensity(snap: SnapshotBuilder) -> None:
    formula = "ridge × MFU / DRAM active, ridge = Σ dense peak / Σ memory bandwidth"
    label = "aggregate over the window, not per kernel"
    rig = snap.derived.rig
    bandwidth = 0.0
    reason = None
    for device in rig.devices:
        if device.memory_bandwidth_bps is None:
            reason = f"no memory bandwidth in the spec of {device.key}"
            break
        bandwidth += device.memory_bandwidth_bps
    # Over the same window as the DRAM activity: the EMA MFU with the latest sample, the window's with the window's.
    mfu_key, mfu = ("mfu_avg", snap.mfu_avg) if snap.counters_window else ("mfu", snap.mfu)
    reason = rig.absent or reason or snap.metrics[mfu_key].absent or snap.metrics["dram_active"].absent
    peak = rig.peak_total_flop_per_s
    if reason is not None or mfu is None or peak is None or not snap.dram_active:
        snap.put(
            "arithmetic_intensity",
            formula,
            absent=reason or "DRAM active is 0",
            unit="FLOP/byte",
            label=label,
        )
        return
    low = formulas.arithmetic_intensity(mfu[0], peak, bandwidth, snap.dram_active)
    high = formulas.arithmetic_intensity(mfu[1], peak, bandwidth, snap.dram_active)
    inputs = {
        "ridge_flop_per_byte": EI(value=formulas.ridge_flop_per_byte(peak, bandwidth), unit="FLOP/byte"),
        "dram_active": EI(value=snap.dram_active, source="counters"),
    }
    if low == high:
        snap.put(
            "arithmetic_intensity",
            formula,
            value=low,
            unit="FLOP/byte",
            label=label,
            inputs=inputs,
            convention=snap.derived.flops.convention,
        )
    else:
        snap.put(
            "arithmetic_intensity",
            formula,
            low=low,
            high=high,
            unit="FLOP/byte",
            label=label,
            inputs=inputs,
        )


def _peak_inputs(rig: Rig) -> dict[str, records.ExplainInput]:
    if rig.absent:
        return {}
    inputs = {"n_devices": EI(value=len(rig.devices), source="device facts of ranks")}
    groups: dict[tuple[Any, ...], list[RigDevice]] = {}
    for device in rig.devices:
        groups.setdefault(
            (device.peak_flop_per_s, device.peak_kind, device.peak_source, device.name), []
        ).append(device)
    if len(groups) == 1:
        (peak, kind, source, name), _ = next(iter(groups.items()))
        inputs["peak_flop_per_s_per_device"] = EI(
            value=peak, unit="FLOP/s", source=f"{name}, {kind} peak: {source}"
        )
    else:
        for device in rig.devices:
            inputs[f"peak_flop_per_s {device.key}"] = EI(
                value=device.peak_flop_per_s,
                unit="FLOP/s",
                source=f"{device.name}, {device.peak_kind} peak: {device.peak_source}",
            )
    if rig.peak_total_flop_per_s is not None:
        inputs["peak_total_flop_per_s"] = EI(
            value=rig.peak_total_flop_per_s, unit="FLOP/s", source="Σ over the devices"
        )
    return inputs
