"""The GPU counters, a metric family: the utilization ladder (GPU-Util, SM, tensor, DRAM active) and OFU, from the
latest sample while the run lives and over the training window once it has ended. Pure: no I/O, no clock."""

from __future__ import annotations

import msgspec

from trainmeter_core.model import formulas, records
from trainmeter_core.model.engine import training_window
from trainmeter_core.model.engine.builder import EI, SnapshotBuilder
from trainmeter_core.model.engine.state import GPU_WINDOW_FIELDS, GpuState

# Every number says in its label which window it covers (the latest sample or the training window) and OFU also the
# clock it is scaled to; a number that lacks a sample is absent with the reason, and a node without a GPU has no GPU
# number at all.

LATEST = "latest sample"
WINDOW = "training window"
_LADDER = ("util_gpu", "sm_active", "tensor_active", "dram_active")
_UNITS = {"power_w": "W", "clock_sm_mhz": "MHz"}
_WINDOW_FORMULA = (
    "Σ value × overlap / Σ overlap, over the samples whose own measurement window overlaps the training window "
    "(its host's first step to its last)"
)
_UTIL_NOTE = (
    "NVML does not say over what period it measured GPU-Util on most products: each reading stands for the time "
    "since the GPU's previous sample"
)


class _Window(msgspec.Struct):
    """One GPU's average of one counter over its training window, or why there is none."""

    value: float | None
    covered_s: float
    start_t: float | None
    end_t: float | None
    absent: str | None


def counter_gpus(snap: SnapshotBuilder) -> tuple[list[str], str | None]:
    """The sampled GPUs counter metrics average over, or none and why."""
    rig = snap.derived.rig
    state = snap.state
    if rig.absent:
        if not state.gpus:
            return [], no_gpu_reason(snap)
        return sorted(state.gpus), None
    if not rig.gpus:
        return (
            [],
            "the run's devices are not sampled GPUs (a CPU run is never scored against the node's GPUs)",
        )
    return [str(d.gpu_key) for d in rig.gpus], None


def no_gpu_reason(snap: SnapshotBuilder) -> str:
    absent = snap.state.gpu_absent
    return f"no GPU on this node: {absent}" if absent else "no GPU sample yet"


def counters(snap: SnapshotBuilder) -> tuple[list[str], str | None, list[GpuState]]:
    """The ladder and OFU (latest, window, per GPU); returns the GPUs they cover for the families that follow."""
    state = snap.state
    keys, why = counter_gpus(snap)
    scope = (
        "the GPUs the ranks reported"
        if not snap.derived.rig.absent
        else "every sampled GPU (no rank reported its device)"
    )
    latest: list[GpuState] = []
    for key in keys:
        gpu = state.gpus.get(key)
        if gpu is None:
            why = why or f"no sample from {key} yet"
        else:
            latest.append(gpu)
    gpus = latest if why is None else []
    if snap.lean:  # history keeps the live ladder and OFU only
        for name in _LADDER:
            shown = _ladder_latest(snap, name, gpus, why, scope, put=True)
            if name == "dram_active":
                snap.dram_active = shown
        snap.ofu = _ofu_latest(snap, gpus, why, _ofu_bases(snap, gpus), put=True)
        return keys, why, latest
    windows = {(_key(gpu), name): _window(snap, gpu, name) for gpu in gpus for name in GPU_WINDOW_FIELDS}
    # Once the run has ended, its numbers are the training window's; while it runs, the latest sample's. A run that
    # never stepped (tm attach) has no window, so its last numbers stay the latest sample's, and say so.
    use_window = snap.final and any(w.start_t is not None for w in windows.values())
    snap.counters_window = use_window
    bases = _ofu_bases(snap, gpus)
    for name in _LADDER:
        shown = _ladder_latest(snap, name, gpus, why, scope, put=not use_window)
        averaged = _put_window_mean(snap, name, gpus, why, windows, key=f"{name}_avg")
        if use_window:
            _copy(snap, f"{name}_avg", name)
        if name == "dram_active":
            snap.dram_active = averaged if use_window else shown
    shown = _ofu_latest(snap, gpus, why, bases, put=not use_window)
    averaged = _put_window_mean(snap, "ofu", gpus, why, windows, key="ofu_avg", bases=bases)
    if use_window:
        _copy(snap, "ofu_avg", "ofu")
    snap.ofu = averaged if use_window else shown
    for name in ("power_w", "clock_sm_mhz"):
        _put_window_mean(snap, name, gpus, why, windows, key=f"{name}_avg")
    if snap.final:  # each GPU's own window average is the finished run's, per device; live, the mean suffices
        for (key, name), window in windows.items():
            _put_gpu_window(snap, key, name, window, bases.get(key))
    return keys, why, latest


def _copy(snap: SnapshotBuilder, source: str, key: str) -> None:
    snap.metrics[key] = snap.metrics[source]
    if source in snap.explain:
        snap.explain[key] = snap.explain[source]


def _key(gpu: GpuState) -> str:
    return f"{gpu.host}/gpu{gpu.index}"


def _window(snap: SnapshotBuilder, gpu: GpuState, name: str) -> _Window:
    span = snap.state.step_spans.get(gpu.host)
    if span is None:
        return _Window(
            None, 0.0, None, None, f"no training step on {gpu.host} yet: its training window is not open"
        )
    result = training_window.average(gpu.window.get(name), span)
    if result is None:
        reason = gpu.absent.get("tensor_active" if name == "ofu" else name)
        if name == "ofu" and reason is None:
            reason = gpu.absent.get("clock_sm_mhz")
        why = reason or f"no sample from {_key(gpu)} covers its training window yet"
        return _Window(None, 0.0, span.first_t, span.last_t, why)
    return _Window(result[0], result[1], span.first_t, span.last_t, None)


def _label(window: str, basis: str | None = None) -> str:
    return ", ".join(part for part in ("counters", window, basis) if part)


def _ladder_latest(
    snap: SnapshotBuilder, name: str, gpus: list[GpuState], why: str | None, scope: str, put: bool
) -> float | None:
    formula = f"mean of the latest {name} over {scope}"
    label = _label(LATEST)
    values: list[float] = []
    reason = why if why is not None else (None if gpus else "no GPU sample yet")
    for gpu in gpus if reason is None else []:
        value = getattr(gpu, name)
        if value is None:
            reason = gpu.absent.get(name) or f"{name} not reported by {_key(gpu)}"
            break
        values.append(value)
    if reason is not None:
        if put:
            snap.put(name, formula, absent=reason, label=label)
        return None
    mean = formulas.mean(values)
    if put:
        starts = [gpu.util_start_t if name == "util_gpu" else gpu.gpm_start_t for gpu in gpus]
        bounds = _bounds([s for s in starts if s is not None], [gpu.t for gpu in gpus if gpu.t is not None])
        # Per-GPU values are the dashboard's GPUs part (history); the explain says what was averaged.
        inputs = {"gpus": EI(value=len(values), source=", ".join(_key(g) for g in gpus))}
        note = _UTIL_NOTE if name == "util_gpu" else None
        snap.put(name, formula, value=mean, label=label, inputs=inputs, note=note, **bounds)
    return mean


def _bounds(starts: list[float], ends: list[float]) -> dict[str, float]:
    bounds = {}
    if starts:
        bounds["window_start_t"] = min(starts)
    if ends:
        bounds["window_end_t"] = max(ends)
    return bounds


def _ofu_bases(
    snap: SnapshotBuilder, gpus: list[GpuState]
) -> dict[str, tuple[str | None, str | None, str | None]]:
    """Per GPU: (the label's words for its clock basis, the explain's, or why OFU has none)."""
    bases = {}
    for gpu in gpus:
        key = _key(gpu)
        basis, reason = snap.derived.ofu_clock(key, gpu.clock_sm_max_mhz)
        if basis is None:
            bases[key] = (gpu.ofu_label, gpu.ofu_basis, reason)
        else:
            bases[key] = (basis.label, basis.basis, None)
    return bases


def _joined_basis(bases: dict[str, tuple[str | None, str | None, str | None]]) -> str | None:
    """The clock bases of the GPUs, as the label says them ("scaled to the 1830 MHz tensor clock")."""
    return " / ".join(sorted({label for label, _, _ in bases.values() if label})) or None


def _ofu_latest(
    snap: SnapshotBuilder,
    gpus: list[GpuState],
    why: str | None,
    bases: dict[str, tuple[str | None, str | None, str | None]],
    put: bool,
) -> float | None:
    formula = (
        "tensor active × min(SM clock, clock basis) / clock basis, per GPU, averaged over the run's GPUs"
    )
    reason = why if why is not None else (None if gpus else "no GPU sample yet")
    ofus: list[float] = []
    inputs: dict[str, records.ExplainInput] = {}
    for gpu in gpus if reason is None else []:
        key = _key(gpu)
        basis, _ = snap.derived.ofu_clock(key, gpu.clock_sm_max_mhz)
        if gpu.tensor_active is None:
            reason = gpu.absent.get("tensor_active") or f"no tensor-pipe counter (GPM) from {key}"
        elif gpu.clock_sm_mhz is None:
            reason = gpu.absent.get("clock_sm_mhz") or f"no SM clock from {key}"
        elif basis is None:
            reason = bases[key][2]
        if reason is not None:
            break
        assert basis is not None and gpu.clock_sm_mhz is not None
        ofus.append(formulas.ofu(gpu.tensor_active, gpu.clock_sm_mhz, basis.mhz))
        inputs[key] = EI(value=ofus[-1], source="sample.gpu")
        inputs[f"{key} tensor_active"] = EI(value=gpu.tensor_active, source="sample.gpu (GPM)")
        inputs[f"{key} clock_sm_mhz"] = EI(value=gpu.clock_sm_mhz, unit="MHz", source="sample.gpu")
        inputs[f"{key} clock_basis_mhz"] = EI(value=basis.mhz, unit="MHz", source=basis.basis)
    if reason is not None or not ofus:
        if put:
            snap.put("ofu", formula, absent=reason or "no GPU sample yet", label=_label(LATEST))
        return None
    ofu = formulas.mean(ofus)
    if put:
        bounds = _bounds(
            [g.gpm_start_t for g in gpus if g.gpm_start_t is not None], [g.t for g in gpus if g.t is not None]
        )
        snap.put(
            "ofu",
            formula,
            value=ofu,
            label=_label(LATEST, _joined_basis(bases)),
            inputs=inputs,
            note="a counter metric: shown beside MFU, never in its place; the clock basis is part of the number",
            **bounds,
        )
    return ofu


def _put_window_mean(
    snap: SnapshotBuilder,
    name: str,
    gpus: list[GpuState],
    why: str | None,
    windows: dict[tuple[str, str], _Window],
    key: str,
    bases: dict[str, tuple[str | None, str | None, str | None]] | None = None,
) -> float | None:
    """The mean over the run's GPUs of each one's average over its training window, put under ``key``."""
    formula = f"mean over the run's GPUs of each GPU's {name} over its training window: {_WINDOW_FORMULA}"
    basis = _joined_basis(bases) if bases is not None else None
    label = _label(WINDOW, basis)
    unit = _UNITS.get(name)
    reason = why if why is not None else (None if gpus else "no GPU sample yet")
    values: list[float] = []
    inputs: dict[str, records.ExplainInput] = {}
    starts: list[float] = []
    ends: list[float] = []
    for gpu in gpus if reason is None else []:
        key_of_gpu = _key(gpu)
        window = windows[(key_of_gpu, name)]
        if name == "ofu" and window.value is None and bases is not None and bases[key_of_gpu][2] is not None:
            reason = bases[key_of_gpu][2]
        elif window.value is None:
            reason = window.absent
        if reason is not None:
            break
        assert window.value is not None and window.start_t is not None and window.end_t is not None
        values.append(window.value)
        starts.append(window.start_t)
        ends.append(window.end_t)
        inputs[key_of_gpu] = EI(value=window.value, unit=unit, source=f"{window.covered_s:.6g} s of samples")
    if reason is not None or not values:
        snap.put(key, formula, absent=reason or "no GPU sample yet", unit=unit, label=label)
        return None
    mean = formulas.mean(values)
    note = _UTIL_NOTE if name == "util_gpu" else None
    if name == "ofu" and bases is not None:
        explained = sorted({text for k, (_, text, _) in bases.items() if text and k in inputs})
        note = "clock basis: " + "; ".join(explained) if explained else None
    snap.put(
        key,
        formula,
        value=mean,
        unit=unit,
        label=label,
        inputs=inputs,
        note=note,
        window_start_t=min(starts),
        window_end_t=max(ends),
    )
    return mean


def _put_gpu_window(
    snap: SnapshotBuilder,
    key: str,
    name: str,
    window: _Window,
    basis: tuple[str | None, str | None, str | None] | None,
) -> None:
    formula = f"{name} of {key} over its training window: {_WINDOW_FORMULA}"
    unit = _UNITS.get(name)
    label = _label(WINDOW, basis[0] if basis is not None and name == "ofu" else None)
    if window.value is None:
        reason = window.absent
        if name == "ofu" and basis is not None and basis[2] is not None:
            reason = basis[2]
        snap.put(f"{name}_avg.{key}", formula, absent=reason or "no sample yet", unit=unit, label=label)
        return
    inputs = {"covered_s": EI(value=window.covered_s, unit="s", source="samples overlapping the window")}
    snap.put(
        f"{name}_avg.{key}",
        formula,
        value=window.value,
        unit=unit,
        label=label,
        inputs=inputs,
        window_start_t=window.start_t,
        window_end_t=window.end_t,
    )
