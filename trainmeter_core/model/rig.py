"""The rig: which devices the ranks compute on, and the one resolved peak and tensor clock of each (and of every
sampled GPU).

Pure: no I/O, no clock. Every consumer of a peak or a tensor clock (MFU, OFU, observed FLOPs, the roofline) reads it
from here, so they can never disagree about it. Precedence: a declared peak beats the datasheet's, which beats one
measured on the node (``tm peak``); a measured figure is used only where no datasheet gives one and is shown beside it
otherwise, and only the one measured with the dtype (and, on a CPU, the threads) the device's rank computes with. A
run is never scored against a device no rank reported, nor against a sparse figure. The tensor clock is the spec's,
else derived from the device's SM count and the architecture's per-SM rate, else OFU scales to the max SM clock the
device reports; the basis is always named, never implied.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

from trainmeter_core.model.device_specs import derived_tensor_clock_mhz
from trainmeter_core.model.facts import NO_RANK_DEVICE, FactTable, format_number, number, peak_variant, whole
from trainmeter_core.model.records import Fact

__all__ = ["PEAK_FLAG", "ClockBasis", "Rig", "RigDevice", "ofu_clock", "resolve_rig"]

#: What a user passes to give a device a peak.
PEAK_FLAG = "pass --peak-tflops X --peak-source TEXT"


class RigDevice(msgspec.Struct, frozen=True):
    """One device: a rank's (``ranks`` non-empty) or a sampled GPU no rank claimed (``ranks`` empty).

    ``peak_flop_per_s`` is the dense FLOP/s every metric uses, or None with ``peak_absent`` saying why;
    ``peak_beside`` names the other figures known for the device (a measured peak beside the datasheet's).
    ``tensor_clock_mhz`` is the clock the dense peak is stated at (the spec's, or derived), with ``tensor_clock_basis``
    saying which; None with ``tensor_clock_absent`` saying why (OFU then scales to the max SM clock, see ofu_clock).
    """

    key: str  # "node1/gpu0" (mapped to a gpu fact), "node1/cuda:1" (not mapped), "node1/cpu/rank3"
    host: str
    kind: str  # "cuda", "cpu", or what the rank said
    ranks: tuple[int, ...]
    gpu_key: str | None  # the gpu fact's device, when the device maps to one
    name: str
    peak_flop_per_s: float | None
    peak_kind: str | None  # "declared", "datasheet", "measured"
    peak_source: str | None
    peak_absent: str | None
    peak_beside: tuple[str, ...]
    tensor_clock_mhz: float | None
    memory_bandwidth_bps: float | None
    mapped_by: str  # how a CUDA device found its gpu fact: "uuid", "index", "visible devices", or "none"
    tensor_clock_basis: str | None = (
        None  # "the 1830 MHz tensor clock of the device spec", "… derived from 132 SMs"
    )
    tensor_clock_absent: str | None = None


class ClockBasis(msgspec.Struct, frozen=True):
    """The clock OFU scales a GPU's tensor-pipe activity to: its MHz, the basis in words, and the label's words."""

    mhz: float
    basis: str  # for explain: "the 1980 MHz max SM clock NVML reports (the spec gives no tensor clock …)"
    label: str  # for the metric's label: "scaled to the 1980 MHz max SM clock"


# A derived or stated tensor clock above the device's own max SM clock means a wrong SM count or rate: the device's
# clock is then the basis (1 MHz of slack for a clock written as a whole MHz).
_CLOCK_SLACK_MHZ = 1.0


def ofu_clock(
    device: RigDevice | None, clock_sm_max_mhz: float | None
) -> tuple[ClockBasis | None, str | None]:
    """The clock basis of OFU for one sampled GPU, or None and why.

    OFU is a share of the dense peak, so a GPU without one has none. The basis is the tensor clock the rig resolved
    (stated or derived); without one it is the max SM clock the device reports in its samples, which is all a log
    recorded before SM counts were kept can give. Either way the basis is part of the number.
    """
    if device is None:
        return None, "no gpu fact describes this GPU, so its dense peak is unknown"
    if device.peak_flop_per_s is None:
        return None, f"OFU is a share of the dense peak, and there is none: {device.peak_absent}"
    max_mhz = clock_sm_max_mhz if clock_sm_max_mhz is not None and clock_sm_max_mhz > 0 else None
    clock = device.tensor_clock_mhz
    if clock is not None and (max_mhz is None or clock <= max_mhz + _CLOCK_SLACK_MHZ):
        return ClockBasis(
            clock, str(device.tensor_clock_basis), f"scaled to the {clock:.0f} MHz tensor clock"
        ), None
    if max_mhz is not None:
        if clock is not None:
            why = f"{device.tensor_clock_basis} is above it, so an SM count or per-SM rate is wrong"
        else:
            why = str(device.tensor_clock_absent)
        basis = f"the {max_mhz:.0f} MHz max SM clock NVML reports ({why})"
        return ClockBasis(max_mhz, basis, f"scaled to the {max_mhz:.0f} MHz max SM clock"), None
    return None, f"{device.tensor_clock_absent}, and the sampler reported no max SM clock"


class Rig(msgspec.Struct, frozen=True):
    """The run's devices, ordered by key. ``absent`` is set when no rank reported its device.

    ``sampled`` holds every sampled GPU (``<host>/gpu<index>``) with its peak resolved the same way, whether a rank
    claimed it or not: counter metrics over the sampled GPUs read their peak and tensor clock from there.
    """

    devices: tuple[RigDevice, ...] = ()
    absent: str | None = NO_RANK_DEVICE
    notes: tuple[str, ...] = ()
    gpus: tuple[RigDevice, ...] = ()  # the devices that map to a sampled GPU
    sampled: Mapping[str, RigDevice] = msgspec.field(default_factory=dict)

    @property
    def peak_total_flop_per_s(self) -> float | None:
        """Σ of the devices' peaks (so a mix of peaks divides by their sum); None when any device has none."""
        if not self.devices or any(d.peak_flop_per_s is None for d in self.devices):
            return None
        total = 0.0
        for device in self.devices:
            total += device.peak_flop_per_s  # type: ignore[operator]
        return total

    @property
    def peak_absent(self) -> str | None:
        """Why the run has no total peak: no device, or the first device (by key) without one."""
        if self.absent:
            return self.absent
        for device in self.devices:
            if device.peak_flop_per_s is None:
                return f"{device.peak_absent} ({device.key})"
        return None

    @property
    def peak_kind(self) -> str | None:
        kinds = sorted({d.peak_kind for d in self.devices if d.peak_kind})
        return "+".join(kinds) if kinds else None


def resolve_rig(facts: FactTable, visible_devices: Mapping[str, tuple[str, ...]] | None = None) -> Rig:
    """The run's devices from the ranks' ``device`` facts, each with its peak, and every sampled GPU with its peak.

    ``visible_devices`` maps a host to its CUDA_VISIBLE_DEVICES entries, through which a rank's CUDA index maps to
    an NVML index (or a UUID) when the rank reported no UUID. Never falls back to the GPUs the sampler sees.
    """
    gpu_facts = facts.scoped("gpu")
    by_key: dict[str, list[Any]] = {}
    notes: list[str] = []
    for fact in facts.scoped("device"):
        value = fact.value if isinstance(fact.value, Mapping) else {}
        kind = str(value.get("type") or "unknown")
        rank = fact.rank or 0
        host = fact.host
        cuda_index = value.get("index") if kind == "cuda" else None
        if kind == "cuda":
            gpu, mapped_by = _map_cuda(host, value, gpu_facts, (visible_devices or {}).get(host))
            if gpu is not None:
                key = str(gpu.device)
            else:
                ident = value.get("uuid") or value.get("index")
                key = f"{host}/cuda:{ident}"
                notes.append(f"rank {rank}'s cuda device {ident} on {host} matches no sampled GPU")
        else:
            gpu, mapped_by = None, "none"
            key = f"{host}/{kind}/rank{rank}"  # one CPU device per rank
        # What the device computes with (the first rank's word for it): a measured peak must match it.
        compute = _Compute(_dtype(value.get("dtype")), whole(value.get("threads")))
        entry = by_key.setdefault(key, [host, kind, [], gpu, mapped_by, cuda_index, compute])
        entry[2].append(rank)
    devices = tuple(
        _device(key, host, kind, tuple(sorted(ranks)), gpu, mapped_by, cuda_index, facts, compute)
        for key, (host, kind, ranks, gpu, mapped_by, cuda_index, compute) in sorted(by_key.items())
    )
    claimed = {d.gpu_key: d for d in devices if d.gpu_key is not None}
    sampled = {}
    for gpu in gpu_facts:
        key = str(gpu.device)
        host = key.rsplit("/gpu", 1)[0]
        sampled[key] = claimed.get(key) or _device(key, host, "cuda", (), gpu, "none", None, facts)
    for device in devices:
        notes.extend(device.peak_beside)
    if not devices:
        return Rig(sampled=sampled)
    return Rig(
        devices=devices,
        absent=None,
        notes=tuple(notes),
        gpus=tuple(claimed.values()),
        sampled=sampled,
    )


def _map_cuda(
    host: str, value: Mapping[str, Any], gpu_facts: list[Fact], visible: tuple[str, ...] | None
) -> tuple[Fact | None, str]:
    on_host = [g for g in gpu_facts if str(g.device).rsplit("/gpu", 1)[0] == host]
    uuid = value.get("uuid")
    if uuid:
        for gpu in on_host:
            if isinstance(gpu.value, Mapping) and gpu.value.get("uuid") == uuid:
                return gpu, "uuid"
    index = value.get("index")
    if isinstance(index, bool) or not isinstance(index, int):
        return None, "none"
    mapped_by, nvml_index, nvml_uuid = "index", index, None
    if visible:
        if index >= len(visible):
            return None, "none"
        entry = visible[index].strip()
        mapped_by = "visible devices"
        if entry.isdigit():
            nvml_index = int(entry)
        elif entry.startswith("GPU-"):
            nvml_index, nvml_uuid = None, entry
        else:
            return None, "none"  # a MIG instance or a name this mapping does not know
    for gpu in on_host:
        gval = gpu.value if isinstance(gpu.value, Mapping) else {}
        if nvml_uuid is not None and str(gval.get("uuid") or "").startswith(nvml_uuid):
            return gpu, mapped_by
        if nvml_index is not None and gval.get("index") == nvml_index:
            return gpu, mapped_by
    return None, "none"


class _Peak(msgspec.Struct, frozen=True):
    flop_per_s: float | None
    kind: str | None
    source: str | None
    absent: str | None


class _Compute(msgspec.Struct, frozen=True):
    """What a rank's device computes with, as its device fact says: a measured peak scores it only where they match.
    None where the rank did not say (logs recorded before it did), which matches only a peak that does not say
    either."""

    dtype: str | None
    threads: int | None

    def words(self, kind: str) -> str:
        parts = [self.dtype or "an unreported dtype"]
        if kind == "cpu":
            threads = self.threads
            parts.append(
                "an unreported thread count" if threads is None else f"{threads} thread{'s' * (threads != 1)}"
            )
        return ", ".join(parts)


def _dtype(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _device(
    key: str,
    host: str,
    kind: str,
    ranks: tuple[int, ...],
    gpu: Fact | None,
    mapped_by: str,
    cuda_index: Any,
    facts: FactTable,
    compute: _Compute | None = None,
) -> RigDevice:
    gval: Mapping[str, Any] = gpu.value if gpu is not None and isinstance(gpu.value, Mapping) else {}
    name = str(gval.get("display_name") or gval.get("name") or ("CPU" if kind == "cpu" else kind))
    declared, measured = _peak_facts(host, kind, gpu, cuda_index, facts, compute)
    datasheet = _datasheet_peak(gpu, gval, name)
    if declared is not None:
        used = declared
    elif datasheet is not None and datasheet.flop_per_s is not None:
        used = datasheet
    elif measured is not None:
        used = measured
    elif datasheet is not None:
        used = datasheet  # absent, with the spec's reason
    elif kind == "cuda":
        used = _Peak(
            None, None, None, f"no GPU sample describes this device, so it has no datasheet peak: {PEAK_FLAG}"
        )
    else:
        used = _Peak(
            None,
            None,
            None,
            f"no peak for a {kind} device: {PEAK_FLAG} (or measure one with {_peak_command(kind, cuda_index, compute)})",
        )
    beside = tuple(
        f"{key}: the {other.kind} peak {format_number(other.flop_per_s)} FLOP/s ({other.source}) is shown beside "
        f"the {used.kind} one in use"
        for other in (declared, datasheet, measured)
        if other is not None
        and other is not used
        and other.flop_per_s is not None
        and used.flop_per_s is not None
    )
    bandwidth = number(gval.get("memory_bandwidth_bps"))
    clock, clock_basis, clock_absent = _tensor_clock(gval, name) if gpu is not None else (None, None, None)
    if gpu is None:
        clock_absent = "no GPU sample describes this device"
    return RigDevice(
        key=key,
        host=host,
        kind=kind,
        ranks=ranks,
        gpu_key=str(gpu.device) if gpu is not None else None,
        name=name,
        peak_flop_per_s=used.flop_per_s,
        peak_kind=used.kind,
        peak_source=used.source,
        peak_absent=used.absent,
        peak_beside=beside,
        tensor_clock_mhz=clock,
        memory_bandwidth_bps=bandwidth if bandwidth and bandwidth > 0 else None,
        mapped_by=mapped_by,
        tensor_clock_basis=clock_basis,
        tensor_clock_absent=clock_absent,
    )


def _tensor_clock(gval: Mapping[str, Any], name: str) -> tuple[float | None, str | None, str | None]:
    """The clock the datasheet's dense peak is stated at: the spec's figure, else dense peak / (SMs × per-SM rate)."""
    stated = number(gval.get("tensor_clock_mhz"))
    if stated is not None and stated > 0:
        return stated, f"the {stated:g} MHz tensor clock of the device spec", None
    sm_count = whole(gval.get("sm_count"))
    per_sm = whole(gval.get("dense_bf16_flop_per_clock_per_sm"))
    dense = number(gval.get("dense_bf16_flop_per_s"))
    missing = []
    if dense is None or dense <= 0:
        missing.append("a dense peak")
    if per_sm is None or per_sm <= 0:
        missing.append("its architecture's dense BF16 FLOP per clock per SM")
    if sm_count is None or sm_count <= 0:
        missing.append("an SM count")
    if missing:
        # Logs recorded before SM counts were kept hold none of this, whatever today's spec says.
        return (
            None,
            None,
            f"no tensor clock for {name}: its gpu fact states none, nor {' and '.join(missing)} to derive one",
        )
    assert dense is not None and per_sm is not None and sm_count is not None
    mhz = derived_tensor_clock_mhz(dense / 1e12, sm_count, per_sm)
    source = gval.get("sm_count_source") or "the gpu fact"
    basis = (
        f"the {mhz:.0f} MHz tensor clock derived as the dense peak {format_number(dense)} FLOP/s / ({sm_count} SMs "
        f"({source}) × {per_sm} FLOP per clock per SM)"
    )
    return mhz, basis, None


def _datasheet_peak(gpu: Fact | None, gval: Mapping[str, Any], name: str) -> _Peak | None:
    """The spec's dense figure carried by the gpu fact (it carries no sparse one to confuse it with)."""
    if gpu is None:
        return None
    peak = number(gval.get("dense_bf16_flop_per_s"))
    if peak is not None and peak > 0:
        return _Peak(peak, "datasheet", str(gval.get("peak_source") or "the device spec"), None)
    return _Peak(None, None, None, str(gval.get("peak_absent") or f"no dense BF16 peak for {name}"))


def _peak_facts(
    host: str, kind: str, gpu: Fact | None, cuda_index: Any, facts: FactTable, compute: _Compute | None
) -> tuple[_Peak | None, _Peak | None]:
    """The first declared ``peak`` fact for this device, scoped to it before unscoped, and the first measured one that
    matches what the device computes with (``compute``; None takes the first); a measured peak where only others
    were measured is absent, naming them and the command that measures the right one."""
    keys = []
    if gpu is not None:
        keys.append(f"peak@{gpu.device}")
    if kind == "cuda" and isinstance(cuda_index, int) and not isinstance(cuda_index, bool):
        keys.append(f"peak@{host}/cuda:{cuda_index}")  # tm peak --device cuda:N names the torch index
    if kind != "cuda":
        keys.append(f"peak@{host}/{kind}")
    keys.append("peak")
    declared = measured = None
    others: list[str] = []
    for fact in _each_fact(facts, keys):
        if not isinstance(fact.value, Mapping):
            continue
        if fact.device is None and fact.value.get("device_type") not in (None, kind):
            continue
        label = fact.value.get("label")
        if label not in ("declared", "measured"):
            label = "declared" if fact.provenance == "declared" else "measured"
        if (declared if label == "declared" else measured) is not None:
            continue
        if label == "measured" and compute is not None and not _matches(fact.value, kind, compute):
            others.append(
                peak_variant(fact.value).removeprefix(", ") or "an unrecorded dtype and thread count"
            )
            continue
        flop_per_s = number(fact.value.get("flop_per_s"))
        if flop_per_s is None or flop_per_s <= 0:
            peak = _Peak(
                None, None, None, f"the peak fact from {fact.origin} holds no positive FLOP/s: {PEAK_FLAG}"
            )
        else:
            peak = _Peak(flop_per_s, label, str(fact.value.get("source") or fact.origin), None)
        if label == "declared":
            declared = peak
        else:
            measured = peak
    if measured is None and others and compute is not None:
        stored = "; ".join(dict.fromkeys(others))
        measured = _Peak(
            None,
            None,
            None,
            f"no peak measured on {host} with what the run computes with ({compute.words(kind)}), only with "
            f"{stored}: measure one with {_peak_command(kind, cuda_index, compute)}, or {PEAK_FLAG}",
        )
    return declared, measured


def _matches(value: Mapping[str, Any], kind: str, compute: _Compute) -> bool:
    """A measured peak scores a device only if it was measured with the device's dtype (and, on a CPU, its threads)."""
    if _dtype(value.get("dtype")) != compute.dtype:
        return False
    return kind != "cpu" or whole(value.get("threads")) == compute.threads


def _peak_command(kind: str, cuda_index: Any, compute: _Compute | None) -> str:
    """The ``tm peak`` that measures the peak this device needs: its threads on a CPU, its index on a GPU, its dtype
    where that is not tm peak's default."""
    words = ["tm peak"]
    if kind == "cuda":
        index = cuda_index if isinstance(cuda_index, int) and not isinstance(cuda_index, bool) else 0
        words.append(f"--device cuda:{index}")
    default = "bfloat16" if kind == "cuda" else "float32"
    if compute is not None and kind == "cpu" and compute.threads is not None:
        words.append(f"--threads {compute.threads}")
    if compute is not None and compute.dtype and compute.dtype != default:
        words.append(f"--dtype {compute.dtype}")
    return " ".join(words)


def _each_fact(facts: FactTable, keys: list[str]) -> Iterator[Fact]:
    """Every fact under these keys and their measured variants (``peak@vm/cpu, float32, 1 thread``), the winner of
    each key first, then the values it beat."""
    for key in keys:
        variants = [k for k in sorted(facts.winners) if k.startswith(key + ", ")] if "@" in key else []
        for each in (key, *variants):
            winner = facts.get(each)
            if winner is not None:
                yield winner
            yield from facts.losers.get(each, {}).values()
