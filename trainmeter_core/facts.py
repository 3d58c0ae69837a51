"""Facts with provenance, and what they say about the run: its devices and their peaks, its FLOPs per token.

Pure: no I/O, no clock, no globals. Precedence is declared > emitted > detected > assumed; a losing value is kept and
warned about, never dropped. It must never score a run against a device no rank reported, nor use a sparse figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from trainmeter_core.flops import CONVENTIONS, flops_per_token_absent_reasons, flops_per_token_all
from trainmeter_core.records import ExplainInput, Fact

__all__ = [
    "NO_RANK_DEVICE",
    "PRECEDENCE",
    "FactTable",
    "ModelFlops",
    "Rig",
    "RigDevice",
    "fact_key",
    "format_number",
    "model_flops",
    "number",
    "resolve_rig",
    "whole",
]

#: Higher wins. A user's word beats the code's, which beats what tm sees, which beats a fallback.
PRECEDENCE: Mapping[str, int] = {"declared": 3, "emitted": 2, "detected": 1, "assumed": 0}
#: Why MFU is absent when no rank said which device it computes on (SPEC.md, "Facts and provenance").
NO_RANK_DEVICE = "no rank reported its device: pass --gpus"
_PEAK_FLAG = "pass --peak-tflops X --peak-source TEXT"
# Facts that exist once per rank though they carry no device field: the header rank scopes them.
_PER_RANK = frozenset({"device"})
# No honest count reaches 2**63; a larger one (1e300 from a broken emitter) is refused rather than overflowing.
_MAX_COUNT = 2**63
# The shape facts and the flops.py argument each one feeds.
_SHAPE_FACTS = (
    ("params", "n_params"),
    ("embedding_params", "embedding_params"),
    ("layers", "layers"),
    ("d_model", "d_model"),
    ("seq_len", "seq_len"),
)


def fact_key(fact: Fact) -> str:
    """Where a fact competes: its name, or ``name@scope`` for a per-device (``device`` field) or per-rank fact."""
    if fact.device:
        return f"{fact.name}@{fact.device}"
    if fact.name in _PER_RANK:
        return f"{fact.name}@rank{fact.rank or 0}"
    return fact.name


def number(value: Any) -> float | None:
    """A fact's value as a finite float, or None when it is not a number (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    result = float(value)
    return result if math.isfinite(result) else None


def format_number(value: Any) -> str:
    """A number as a person writes it in a warning: 1.2e9, 0.45, 8; anything else as short text."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, Mapping) and number(value.get("flops")) is not None:
            return format_number(value["flops"]) + " FLOP/s"
        text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
        return text if len(text) <= 60 else text[:57] + "..."
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        mantissa, exponent = f"{value:.4g}".split("e") if "e" in f"{value:.4g}" else (f"{value:.4g}", "0")
        return f"{mantissa}e{int(exponent)}"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class FactTable(msgspec.Struct, kw_only=True):
    """Every fact by ``fact_key``: the winner, and the latest value of each losing provenance.

    A msgspec Struct, so the engine's checkpoint carries it as it is. ``version`` grows with every change, so a
    reader can cache what it derives from the table.
    """

    winners: dict[str, Fact] = {}
    losers: dict[str, dict[str, Fact]] = {}
    version: int = 0

    def add(self, fact: Fact) -> None:
        """Take one fact: it wins over a lower provenance, replaces the same one, and is kept when it loses."""
        key = fact_key(fact)
        current = self.winners.get(key)
        self.version += 1
        rank = PRECEDENCE.get(fact.provenance, -1)
        if current is None:
            self.winners[key] = fact
            return
        current_rank = PRECEDENCE.get(current.provenance, -1)
        if rank >= current_rank:
            self.winners[key] = fact
            if rank > current_rank:
                self.losers.setdefault(key, {})[current.provenance] = current
            return
        self.losers.setdefault(key, {})[fact.provenance] = fact

    def get(self, key: str) -> Fact | None:
        """The winning fact under ``key`` (a name, or ``name@scope``)."""
        return self.winners.get(key)

    def value(self, key: str) -> Any:
        fact = self.winners.get(key)
        return None if fact is None else fact.value

    def scoped(self, name: str) -> list[Fact]:
        """The winning facts of a per-device or per-rank name, ordered by their key."""
        prefix = name + "@"
        return [self.winners[k] for k in sorted(self.winners) if k.startswith(prefix)]

    def warnings(self) -> list[str]:
        """One line per disagreement (the winner and each losing value), then every winner's own warning."""
        lines: list[str] = []
        for key in sorted(self.winners):
            winner = self.winners[key]
            label = key.replace("@", " on ", 1)
            losing = self.losers.get(key, {})
            for provenance in sorted(losing, key=lambda p: -PRECEDENCE.get(p, -1)):
                loser = losing[provenance]
                if loser.value != winner.value:
                    lines.append(
                        f"{label} {winner.provenance} {format_number(winner.value)} but {provenance} "
                        f"{format_number(loser.value)}: using the {winner.provenance} value"
                    )
            if winner.warning:
                lines.append(f"{label}: {winner.warning}")
        return lines


# ----------------------------------------------------------------------------------------------------------------------
# The rig: which devices the ranks compute on, and the peak of each


@dataclass(frozen=True)
class RigDevice:
    """One device a rank reported. ``peak_flops`` is dense FLOP/s, or None with ``peak_absent`` saying why."""

    key: str  # "node1/gpu0" (mapped to a gpu fact), "node1/cuda:1" (not mapped), "node1/cpu/rank3"
    host: str
    kind: str  # "cuda", "cpu", or what the rank said
    ranks: tuple[int, ...]
    gpu_key: str | None  # the gpu fact's device, when the device maps to one
    name: str
    peak_flops: float | None
    peak_kind: str | None  # "datasheet", "declared", "measured"
    peak_source: str | None
    peak_absent: str | None
    tensor_clock_mhz: float | None
    memory_bandwidth_bps: float | None
    mapped_by: str  # how a CUDA device found its gpu fact: "uuid", "index", "visible devices", or "none"


@dataclass(frozen=True)
class Rig:
    """The run's devices, ordered by key. ``absent`` is set when no rank reported its device."""

    devices: tuple[RigDevice, ...] = ()
    absent: str | None = NO_RANK_DEVICE
    notes: tuple[str, ...] = ()
    gpus: tuple[RigDevice, ...] = field(default=())  # the devices that map to a sampled GPU

    @property
    def peak_total_flops(self) -> float | None:
        """Σ of the devices' peaks (so a mix of peaks divides by their sum); None when any device has none."""
        if not self.devices or any(d.peak_flops is None for d in self.devices):
            return None
        total = 0.0
        for device in self.devices:
            total += device.peak_flops  # type: ignore[operator]
        return total

    @property
    def peak_absent(self) -> str | None:
        """Why the run has no total peak: no device, or the first device (by key) without one."""
        if self.absent:
            return self.absent
        for device in self.devices:
            if device.peak_flops is None:
                return f"{device.peak_absent} ({device.key})"
        return None

    @property
    def peak_kind(self) -> str | None:
        kinds = sorted({d.peak_kind for d in self.devices if d.peak_kind})
        return "+".join(kinds) if kinds else None


def resolve_rig(facts: FactTable, visible_devices: Mapping[str, tuple[str, ...]] | None = None) -> Rig:
    """The run's devices from the ranks' ``device`` facts, each with its peak.

    ``visible_devices`` maps a host to its CUDA_VISIBLE_DEVICES entries, through which a rank's CUDA index maps to
    an NVML index (or a UUID) when the rank reported no UUID. Never falls back to the GPUs the sampler sees.
    """
    rank_facts = facts.scoped("device")
    if not rank_facts:
        return Rig()
    gpu_facts = facts.scoped("gpu")
    by_key: dict[str, list[Any]] = {}
    notes: list[str] = []
    for fact in rank_facts:
        value = fact.value if isinstance(fact.value, Mapping) else {}
        kind = str(value.get("type") or "unknown")
        rank = fact.rank or 0
        host = fact.host
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
        entry = by_key.setdefault(key, [host, kind, [], gpu, mapped_by])
        entry[2].append(rank)
    devices = tuple(
        _device(key, host, kind, tuple(sorted(ranks)), gpu, mapped_by, facts)
        for key, (host, kind, ranks, gpu, mapped_by) in sorted(by_key.items())
    )
    return Rig(
        devices=devices,
        absent=None,
        notes=tuple(notes),
        gpus=tuple(d for d in devices if d.gpu_key is not None),
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


def _device(
    key: str,
    host: str,
    kind: str,
    ranks: tuple[int, ...],
    gpu: Fact | None,
    mapped_by: str,
    facts: FactTable,
) -> RigDevice:
    gval: Mapping[str, Any] = gpu.value if gpu is not None and isinstance(gpu.value, Mapping) else {}
    name = str(gval.get("display_name") or gval.get("name") or ("CPU" if kind == "cpu" else kind))
    peak, peak_kind, source, absent = _declared_peak(key, host, kind, gpu, facts)
    if peak is None and gpu is not None and absent is None:
        # Only the dense figure is ever a peak; the gpu fact carries no sparse one to confuse it with.
        peak = number(gval.get("dense_bf16_flops"))
        if peak is not None and peak > 0:
            peak_kind = "datasheet"
            source = str(gval.get("peak_source") or "the device spec")
        else:
            peak = None
            absent = str(gval.get("peak_absent") or f"no dense BF16 peak for {name}")
    elif peak is None and absent is None:
        if kind == "cuda":
            absent = f"no GPU sample describes this device, so it has no datasheet peak: {_PEAK_FLAG}"
        else:
            absent = f"no peak for a {kind} device: {_PEAK_FLAG} (or measure one with tm peak)"
    bandwidth = number(gval.get("memory_bandwidth_bps"))
    return RigDevice(
        key=key,
        host=host,
        kind=kind,
        ranks=ranks,
        gpu_key=str(gpu.device) if gpu is not None else None,
        name=name,
        peak_flops=peak,
        peak_kind=peak_kind,
        peak_source=source,
        peak_absent=absent,
        tensor_clock_mhz=number(gval.get("tensor_clock_mhz")),
        memory_bandwidth_bps=bandwidth if bandwidth and bandwidth > 0 else None,
        mapped_by=mapped_by,
    )


def _declared_peak(
    key: str, host: str, kind: str, gpu: Fact | None, facts: FactTable
) -> tuple[float | None, str | None, str | None, str | None]:
    """A ``peak`` fact for this device (scoped to it, else unscoped for its kind): flops, kind, source, problem."""
    scoped = facts.get(f"peak@{gpu.device}") if gpu is not None else facts.get(f"peak@{host}/{kind}")
    candidates = [scoped, facts.get("peak")]
    for fact in candidates:
        if fact is None or not isinstance(fact.value, Mapping):
            continue
        device_type = fact.value.get("device_type")
        if fact is candidates[1] and device_type not in (None, kind):
            continue
        flops = number(fact.value.get("flops"))
        if flops is None or flops <= 0:
            return (
                None,
                None,
                None,
                f"the peak fact from {fact.origin} holds no positive FLOP/s: {_PEAK_FLAG}",
            )
        label = fact.value.get("label")
        if label not in ("declared", "measured"):
            label = "declared" if fact.provenance == "declared" else "measured"
        source = str(fact.value.get("source") or fact.origin)
        return flops, label, source, None
    return None, None, None, None


# ----------------------------------------------------------------------------------------------------------------------
# FLOPs per token from the facts


@dataclass(frozen=True)
class ModelFlops:
    """FLOPs per token as the facts give it: one value under ``convention``, or a range over the four.

    ``convention`` is the chosen one, the provenance of a declared figure ("declared"), or None for a range.
    """

    value: float | None = None
    low: float | None = None
    high: float | None = None
    convention: str | None = None
    absent: str | None = None
    per_convention: Mapping[str, int | None] = field(default_factory=dict)
    reasons: Mapping[str, str] = field(default_factory=dict)
    inputs: Mapping[str, ExplainInput] = field(default_factory=dict)
    note: str | None = None

    @property
    def known(self) -> bool:
        return self.value is not None or self.low is not None


def model_flops(facts: FactTable) -> ModelFlops:
    """FLOPs per token: a declared figure, else the chosen convention, else a range over the computable ones."""
    shape: dict[str, int | None] = {}
    inputs: dict[str, ExplainInput] = {}
    for fact_name, argument in _SHAPE_FACTS:
        fact = facts.get(fact_name)
        count = whole(fact.value) if fact is not None else None
        # A value that is not a whole count goes through as it is, so flops.py names the flag and the problem.
        shape[argument] = count if count is not None or fact is None else fact.value
        if fact is not None:
            inputs[fact_name] = ExplainInput(value=fact.value, unit=fact.unit, source=_source(fact))
    per_convention = flops_per_token_all(shape)
    reasons = flops_per_token_absent_reasons(shape)
    declared = facts.get("flops_per_token")
    chosen = facts.get("convention")
    chosen_value = chosen.value if chosen is not None else None
    chosen_name = chosen_value if isinstance(chosen_value, str) and chosen_value in CONVENTIONS else None
    note = None
    if chosen is not None and chosen_name is None:
        note = f"convention {chosen.value!r} is not one of {', '.join(CONVENTIONS)}: ignored"
    declared_value = number(declared.value) if declared is not None else None
    if declared_value is not None and declared_value > 0:
        inputs = {
            "flops_per_token": ExplainInput(value=declared_value, unit="FLOP/token", source=_source(declared))
        }
        if chosen_name is not None:
            note = f"a declared figure is used; the chosen convention {chosen_name} is shown beside it"
        return ModelFlops(
            value=declared_value,
            convention=declared.provenance,
            per_convention=per_convention,
            reasons=reasons,
            inputs=inputs,
            note=note,
        )
    if chosen_name is not None:
        inputs["convention"] = ExplainInput(value=chosen_name, source=_source(chosen))
        chosen_value = per_convention[chosen_name]
        return ModelFlops(
            value=None if chosen_value is None else float(chosen_value),
            convention=chosen_name,
            absent=None
            if chosen_value is not None
            else f"{reasons[chosen_name]} (or pass --flops-per-token)",
            per_convention=per_convention,
            reasons=reasons,
            inputs=inputs,
            note=note,
        )
    known = [float(v) for v in per_convention.values() if v is not None]
    if not known:
        phrases: list[str] = []
        for reason in reasons.values():
            phrases.extend(p for p in reason.split("; ") if p not in phrases)
        absent = "; ".join(phrases) + " (or pass --flops-per-token)"
        return ModelFlops(
            absent=absent, per_convention=per_convention, reasons=reasons, inputs=inputs, note=note
        )
    if len(known) < len(per_convention):
        missing = ", ".join(sorted(reasons))
        note = (note + "; " if note else "") + f"the range leaves out {missing}, whose inputs are unknown"
    return ModelFlops(
        low=min(known),
        high=max(known),
        per_convention=per_convention,
        reasons=reasons,
        inputs=inputs,
        note=note,
    )


def whole(value: Any) -> int | None:
    # Counts may arrive as floats (1.2e9 through JSON); only a whole number is a count.
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and abs(value) < _MAX_COUNT:
        return value
    if isinstance(value, float) and abs(value) < _MAX_COUNT and value.is_integer():
        return int(value)
    return None


def _source(fact: Fact) -> str:
    return f"{fact.provenance} ({fact.origin})"
