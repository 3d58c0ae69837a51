"""What the GPU sampler says once per GPU at start: its identity, the device spec it matches, and the dense peak.

It reads spec files (built-in and the plugins' ``trainmeter_device_specs``) and never hands out another card's peak:
no match, or a spec without a dense figure, gives no peak and the reason. A MIG device gets its share of the SMs. The
SM count comes from the device where NVML tells it, else from the spec; the engine's rig derives the tensor clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainmeter_core.model import records
from trainmeter_core.model.device_specs import (
    DeviceSpec,
    SpecError,
    dense_peak_flop_per_s,
    match_spec,
    sm_count_from_cores,
)
from trainmeter_core.run.specstore import load_specs
from trainmeter_sources.gpu.nvml import DeviceInfo

SOURCE = "sampler:nvml"


def plugin_spec_paths(plugins: Any) -> list[Path]:
    """The spec files and folders every loaded plugin ships through ``trainmeter_device_specs``."""
    paths: list[Path] = []
    for _name, result in plugins.per_plugin("trainmeter_device_specs"):
        paths.extend(Path(p) for p in result)
    return paths


def read_specs(extra: Sequence[Path]) -> tuple[list[DeviceSpec], str | None]:
    """Every spec, or none and the one-line reason (a broken spec file must not pass silently)."""
    try:
        return load_specs(extra), None
    except SpecError as exc:
        return [], f"device specs could not be read: {exc}"


def gpu_fact_value(
    device: DeviceInfo, specs: Sequence[DeviceSpec], fake: bool, specs_error: str | None
) -> dict:
    """The ``gpu`` fact's value (the engine turns it into MFU and OFU): spec, dense peak, tensor clock, bandwidth, and
    the SM count and per-SM rate from which the engine derives a tensor clock the spec does not state."""
    value: dict[str, Any] = {
        "index": device.index,
        "uuid": device.uuid,
        "name": device.name,
        "fake": fake,
        "spec_id": None,
        "display_name": None,
        "dense_bf16_flop_per_s": None,
        "peak_absent": None,
        "tensor_clock_mhz": None,
        "memory_bandwidth_bps": None,
        "sm_count": device.mig_sm_count,
        "sm_count_source": "NVML: the MIG device's multiprocessorCount" if device.mig_sm_count else None,
        "dense_bf16_flop_per_clock_per_sm": None,
        "peak_source": None,
    }
    spec = match_spec(device.name, specs) if device.name else None
    if spec is None:
        if specs_error:
            value["peak_absent"] = specs_error
        else:
            value["peak_absent"] = (
                f"no device spec matches {device.name!r}: pass --peak-tflops X --peak-source TEXT, or add a spec "
                "(docs/specs.md)"
            )
        return value
    value["spec_id"] = spec.id
    value["display_name"] = spec.display_name
    value["tensor_clock_mhz"] = spec.tensor_clock_mhz.value
    per_sm = spec.dense_bf16_flop_per_clock_per_sm.value
    value["dense_bf16_flop_per_clock_per_sm"] = int(per_sm) if per_sm is not None else None
    if not device.is_mig:
        value["sm_count"], value["sm_count_source"] = whole_gpu_sm_count(device, spec)
        bandwidth_gbps = spec.memory_bandwidth_gbps.value
        value["memory_bandwidth_bps"] = bandwidth_gbps * 1e9 if bandwidth_gbps is not None else None
    if device.is_mig and device.mig_sm_count is None:
        value["peak_absent"] = (
            "the MIG device's SM count could not be read, so its share of the peak is unknown"
        )
        return value
    try:
        peak_flop_per_s, reason = dense_peak_flop_per_s(spec, device.mig_sm_count if device.is_mig else None)
    except ValueError as exc:  # NVML reported more SMs for a slice than the spec gives the whole GPU
        peak_flop_per_s, reason = None, f"MIG device disagrees with spec {spec.id}: {exc}"
    value["dense_bf16_flop_per_s"] = peak_flop_per_s
    value["peak_absent"] = reason
    sources = spec.dense_bf16_tflop_per_s.sources
    value["peak_source"] = sources[0].url if peak_flop_per_s is not None and sources else None
    return value


def whole_gpu_sm_count(device: DeviceInfo, spec: DeviceSpec) -> tuple[int | None, str | None]:
    """A whole GPU's SM count and where it comes from: NVML's SM count, else its cores / the spec's cores per SM,
    else the spec's SM count; None and None when none of them knows."""
    if device.sm_count:
        return device.sm_count, "NVML: nvmlDeviceGetAttributes multiprocessorCount"
    if device.core_count:
        sm_count, _ = sm_count_from_cores(device.core_count, spec)
        if sm_count is not None:
            per_sm = int(spec.fp32_cores_per_sm.value)  # type: ignore[arg-type]
            return sm_count, f"NVML: {device.core_count} FP32 cores / {per_sm} per {spec.architecture} SM"
    if spec.sm_count.value is not None:
        return int(spec.sm_count.value), f"device spec {spec.id}"
    return None, None


def gpu_fact(device: DeviceInfo, value: dict, host: str) -> records.Fact:
    note = None
    if device.is_mig:
        note = (
            f"MIG device of {device.mig_parent_uuid}: the peak is the whole GPU's times its share of the SMs; "
            "a slice's memory bandwidth is on no datasheet"
        )
    return records.Fact(
        name="gpu",
        value=value,
        provenance="detected",
        origin=SOURCE,
        device=f"{host}/{device.label}",
        note=note,
    )


def spec_adapter(device: DeviceInfo, specs: Sequence[DeviceSpec]) -> str | None:
    spec = match_spec(device.name, specs) if device.name else None
    return spec.adapter if spec is not None else None
