"""The samplers' records into the engine's state: a GPU's latest readings, energy (``energy``), OFU and health, and every counter
over the training window (a GPU's and the host's). Pure: no I/O, no clock; the engine calls these in hub order."""

from __future__ import annotations

import math

from trainmeter_core.model import formulas, records
from trainmeter_core.model.engine import attempts, energy, training_window
from trainmeter_core.model.engine.derived import Derived
from trainmeter_core.model.engine.state import GPU_WINDOW_FIELDS, EngineState, GpuState
from trainmeter_core.model.platform_adapters import GPU_LOST

# The sample fields the engine uses, with the largest value that makes sense (fractions 0..1, a generous ceiling
# else); each is also kept as history, one line per GPU in the dashboard's GPUs part.
GPU_FIELDS = (
    ("util_gpu", 1.0),
    ("sm_active", 1.0),
    ("tensor_active", 1.0),
    ("dram_active", 1.0),
    ("power_w", 1e5),
    ("clock_sm_mhz", 1e5),
)
# The host counters averaged over the training window: each the snapshot key it shows under and the sample field it
# reads.
HOST_WINDOW_FIELDS = (
    ("host_cpu_cores", "cpu_cores"),
    ("host_rss_b", "rss_b"),
)
NODE_WINDOW_FIELDS = (
    ("node_cpu_iowait", "cpu_iowait"),
    ("node_mem_available_b", "mem_available_b"),
)


def take_gpu_sample(
    state: EngineState, gpu: GpuState, record: records.SampleGpu, derived: Derived, key: str
) -> list[float | None]:
    """One GPU sample into its state: the latest readings (a reading out of range is absent, never a number), energy,
    OFU × window for observed FLOPs (its clock basis from the rig's device ``key``), health, and each counter over the
    training window. Returns the readings of ``GPU_FIELDS`` for the history."""
    absent = record.absent
    values: list[float | None] = []
    for name, upper in GPU_FIELDS:
        value = getattr(record, name)
        # A reading outside its range is a sampler bug: shown absent with the reading, never used as a number.
        if value is not None and not (0.0 <= value <= upper):
            absent = dict(absent) if absent is record.absent else absent
            absent[name] = f"{name} {value!r} from the sampler is outside 0..{upper:g}"
            value = None
        values.append(value)
    util_gpu, sm_active, tensor_active, dram_active, power_w, clock_sm_mhz = values
    previous_t = attempts.previous_reading(state, gpu.t)  # no sample spans a resume's gap
    energy.take_energy(state, gpu, record, power_w, previous_t)
    clock_max = record.clock_sm_max_mhz
    if clock_max is not None and not 0.0 < clock_max <= 1e5:
        clock_max = None  # out of range: no basis for OFU
    gpu.uuid = record.uuid
    gpu.t = record.t
    gpu.util_gpu = util_gpu
    gpu.sm_active = sm_active
    gpu.tensor_active = tensor_active
    gpu.dram_active = dram_active
    gpu.clock_sm_mhz = clock_sm_mhz
    gpu.clock_sm_max_mhz = clock_max
    gpu.power_w = power_w
    gpu.absent = absent
    window_s = record.gpm_window_s
    gpm_start = record.gpm_window_start_t
    if gpm_start is None and window_s is not None and window_s > 0:
        gpm_start = record.t - window_s
    util_window_s = record.util_window_s
    # NVML does not say over what period GPU-Util was measured on most products: the reading then stands for
    # the time since this GPU's previous sample, like the power and the clock.
    util_start = record.t - util_window_s if util_window_s is not None and util_window_s > 0 else previous_t
    gpu.gpm_start_t = gpm_start if gpm_start is not None else previous_t
    gpu.util_start_t = util_start
    gpu.throttle = record.throttle
    if record.xid:
        gpu.xid_count += len(record.xid)
        gpu.xid_last = record.xid[-1]
    gpu.ecc_uncorrected = record.ecc_uncorrected
    gpu.lost = GPU_LOST in absent.values()
    ofu = None
    if window_s is not None and window_s > 0:
        basis, _ = derived.ofu_clock(key, clock_max)
        if basis is not None:
            gpu.ofu_label, gpu.ofu_basis = basis.label, basis.basis
        if tensor_active is not None and clock_sm_mhz is not None and basis is not None:
            ofu = formulas.ofu(tensor_active, clock_sm_mhz, basis.mhz)
            gpu.ofu_s += ofu * window_s
            gpu.ofu_samples += 1
        else:
            gpu.ofu_missed += 1
    span = state.step_spans.get(record.host)
    starts = (
        util_start,
        gpu.gpm_start_t,
        gpu.gpm_start_t,
        gpu.gpm_start_t,
        previous_t,
        previous_t,
        gpu.gpm_start_t,
    )
    readings = (util_gpu, sm_active, tensor_active, dram_active, power_w, clock_sm_mhz, ofu)
    end_t = record.t
    sums = gpu.window
    # A sampler reads after the steps it covers, in a run without pauses: each reading settles at once, as
    # training_window.add_sample settles it (written out here: a GPU sample comes to it seven times)
    at_once = span is not None and end_t <= span.last_t and not span.gaps
    for name, start, value in zip(GPU_WINDOW_FIELDS, starts, readings, strict=True):
        if value is None or start is None:
            continue
        window = sums.get(name) if at_once else None
        if window is None or window.pending or not start < end_t:
            training_window.add_sample(sums, name, start, end_t, value, span)
            continue
        first_t = span.first_t  # type: ignore[union-attr]  # at_once: a span
        overlap = end_t - (start if start >= first_t else first_t)
        if overlap > 0:
            window.weighted += value * overlap
            window.covered_s += overlap
    return values


def take_host_sample(
    state: EngineState,
    record: records.SampleHost | records.SampleNode,
    previous: records.SampleHost | records.SampleNode | None,
    fields: tuple[tuple[str, str], ...],
) -> None:
    """The host counters over the training window: a rate covers its own window, a level the time since the
    previous sample."""
    previous_t = previous.t if previous is not None and previous.host == record.host else None
    previous_t = attempts.previous_reading(state, previous_t)
    window_s = record.window_s
    rate_start = record.t - window_s if window_s is not None and window_s > 0 else previous_t
    span = state.step_spans.get(record.host)
    for key, field in fields:
        value = getattr(record, field)
        start = previous_t if field.endswith("_b") else rate_start
        if value is not None and start is not None and -math.inf < value < math.inf:
            training_window.add_sample(state.host_window, key, start, record.t, float(value), span)
