"""Device specs: a GPU's dense BF16 peak, the tensor clock it is stated at (or the per-SM rate that derives it from
the device's own SM count), and which NVML names a spec matches.

Pure: no file I/O and no clock (``specstore`` reads the files). It must never hand out another card's peak: an
unmatched name has no spec, a spec without a dense figure has no peak, and both say why.
"""

from __future__ import annotations

import datetime
import functools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

__all__ = [
    "DERIVED_CLOCK_TOLERANCE_MHZ",
    "SPARSE_HALF_TOLERANCE",
    "DeviceSpec",
    "Derivation",
    "Figure",
    "Source",
    "SpecError",
    "dense_peak_flop_per_s",
    "derived_tensor_clock_mhz",
    "sm_count_from_cores",
    "match_spec",
    "parse_spec",
]

# A derived tensor clock is written as a whole MHz, so it may sit up to 1 MHz from the formula's exact result.
DERIVED_CLOCK_TOLERANCE_MHZ = 1.0
# NVIDIA prints dense and sparse figures rounded separately (the L40S page prints 362.05 | 733, 1.2 % off an exact
# half), so "dense is half the sparse figure" is checked to 2 %. What it must catch is the 2x error: a sparse headline
# copied in as the dense peak halves MFU.
SPARSE_HALF_TOLERANCE = 0.02

_FIGURE_NAMES = (
    "sm_count",
    "dense_bf16_tflop_per_s",
    "tensor_clock_mhz",
    "memory_gb",
    "memory_bandwidth_gbps",
)
# Architecture figures a spec may give (older and plugin spec files do not): the whitepaper's dense BF16 FLOP per clock
# per SM, which turns an SM count the device reports into the clock the dense peak is stated at, and its FP32 CUDA
# cores per SM, which turns the core count NVML reports for a whole GPU into SMs.
_OPTIONAL_FIGURE_NAMES = ("dense_bf16_flop_per_clock_per_sm", "fp32_cores_per_sm")
_NOT_GIVEN = "not given in this spec file"
_TEXT_NAMES = ("id", "display_name", "architecture", "adapter", "memory_kind", "checked")
_TOP_KEYS = frozenset(_TEXT_NAMES + _FIGURE_NAMES + _OPTIONAL_FIGURE_NAMES + ("match", "exclude"))
_REQUIRED_KEYS = _TOP_KEYS - frozenset(_OPTIONAL_FIGURE_NAMES)
_FIGURE_KEYS = frozenset(("value", "sources", "note", "derived", "sparse_tflop_per_s"))
_SOURCE_KEYS = frozenset(("url", "quote", "where"))
#: Keys of spec files written before FLOP/s had its own name (``tflops`` read as a count or a rate alike); a plugin's
#: older spec file is read under the new names.
RENAMED_SPEC_KEYS = {"dense_bf16_tflops": "dense_bf16_tflop_per_s", "sparse_tflops": "sparse_tflop_per_s"}
_DERIVED_KEYS = frozenset(("formula", "flop_per_clock_per_sm"))
_ID_RE = re.compile(r"[a-z0-9][a-z0-9-]*")
_SPARSE_WORD_RE = re.compile(r"sparsity|sparse", re.IGNORECASE)


class SpecError(ValueError):
    """A spec file was refused; the message is one line naming the file and the problem."""

    def __init__(self, origin: str, problem: str) -> None:
        self.origin = origin
        self.problem = problem
        super().__init__(f"{origin}: {problem}")


class Source(msgspec.Struct, frozen=True):
    """Where a figure comes from: the document's address and the exact words (``where`` names table and column)."""

    url: str
    quote: str
    where: str | None = None


class Derivation(msgspec.Struct, frozen=True):
    """How a tensor clock was derived: dense peak / (SMs x dense BF16 FLOP per clock per SM)."""

    formula: str
    flop_per_clock_per_sm: int


class Figure(msgspec.Struct, frozen=True):
    """One number of a spec with its sources; ``value`` is None when no datasheet gives it, and ``note`` says so."""

    value: float | None
    sources: tuple[Source, ...]
    note: str | None = None
    derived: Derivation | None = None
    # The with-sparsity figure NVIDIA headlines, kept so a test can prove the dense value is its half.
    sparse_tflop_per_s: float | None = None


class DeviceSpec(msgspec.Struct, frozen=True):
    """One GPU model as a spec file describes it; ``origin`` is the file it was read from."""

    id: str
    display_name: str
    architecture: str
    adapter: str
    match: tuple[str, ...]
    exclude: tuple[str, ...]
    sm_count: Figure
    dense_bf16_tflop_per_s: Figure
    tensor_clock_mhz: Figure
    memory_kind: str
    memory_gb: Figure
    memory_bandwidth_gbps: Figure
    checked: str
    origin: str
    dense_bf16_flop_per_clock_per_sm: Figure = Figure(value=None, sources=(), note=_NOT_GIVEN)
    fp32_cores_per_sm: Figure = Figure(value=None, sources=(), note=_NOT_GIVEN)


# ---------------------------------------------------------------------------------------------------------------------
# Parsing and validation


def _renamed(data: Mapping[str, Any]) -> Mapping[str, Any]:
    if not any(old in data for old in RENAMED_SPEC_KEYS):
        return data
    renamed = {RENAMED_SPEC_KEYS.get(key, key): value for key, value in data.items()}
    figure = renamed.get("dense_bf16_tflop_per_s")
    if isinstance(figure, Mapping) and "sparse_tflops" in figure:
        renamed["dense_bf16_tflop_per_s"] = {RENAMED_SPEC_KEYS.get(k, k): v for k, v in figure.items()}
    return renamed


def parse_spec(data: Mapping[str, Any], origin: str) -> DeviceSpec:
    """Validate one decoded spec file and build its :class:`DeviceSpec`; raise :class:`SpecError` on any problem.

    Checks: the known keys only, every figure with a value cites a source with url and quote, a null carries a note,
    patterns compile and cannot match empty text, a figure quoting "sparsity" records the sparse figure and holds its
    half, and a derived tensor clock agrees with its formula within 1 MHz. Unique ids are the store's job.
    """
    if not isinstance(data, Mapping):
        raise SpecError(origin, f"a spec file holds one JSON object, not {type(data).__name__}")
    data = _renamed(data)
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise SpecError(origin, f"unknown key {unknown[0]!r}; the keys are {', '.join(sorted(_TOP_KEYS))}")
    missing = sorted(_REQUIRED_KEYS - set(data))
    if missing:
        raise SpecError(origin, f"missing key {missing[0]!r}")

    texts = {name: _text(data[name], name, origin) for name in _TEXT_NAMES}
    if not _ID_RE.fullmatch(texts["id"]):
        raise SpecError(origin, f"id {texts['id']!r} must be lower-case letters, digits and dashes")
    try:
        datetime.date.fromisoformat(texts["checked"])
    except ValueError:
        raise SpecError(origin, f"checked {texts['checked']!r} is not a date written YYYY-MM-DD") from None

    match = _patterns(data["match"], "match", origin, allow_empty=False)
    exclude = _patterns(data["exclude"], "exclude", origin, allow_empty=True)
    figures = {name: _figure(data[name], name, origin) for name in _FIGURE_NAMES}
    for name in _OPTIONAL_FIGURE_NAMES:
        if name in data:
            figures[name] = _figure(data[name], name, origin)

    for name in ("sm_count", *_OPTIONAL_FIGURE_NAMES):
        if name in figures:
            _check_whole(figures[name], name, origin)
    _check_sparse_half(figures["dense_bf16_tflop_per_s"], origin)
    for name, figure in figures.items():
        if figure.derived is not None and name != "tensor_clock_mhz":
            raise SpecError(origin, f"{name}: only tensor_clock_mhz may be derived")
        if figure.sparse_tflop_per_s is not None and name != "dense_bf16_tflop_per_s":
            raise SpecError(origin, f"{name}: only dense_bf16_tflop_per_s carries sparse_tflop_per_s")
    _check_derived_clock(figures, origin)

    return DeviceSpec(
        id=texts["id"],
        display_name=texts["display_name"],
        architecture=texts["architecture"],
        adapter=texts["adapter"],
        match=match,
        exclude=exclude,
        memory_kind=texts["memory_kind"],
        checked=texts["checked"],
        origin=origin,
        **figures,
    )


def _text(value: object, name: str, origin: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SpecError(origin, f"{name} must be a non-empty string")
    return value


def _number(value: object, name: str, origin: str) -> float:
    # bool is an int in Python; a `true` in a figure is a typo, never a number.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(origin, f"{name} must be a number or null, not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise SpecError(origin, f"{name} must be a positive finite number, not {value!r}")
    return float(value)


def _patterns(value: object, name: str, origin: str, *, allow_empty: bool) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise SpecError(origin, f"{name} must be a list of regular expressions")
    if not value and not allow_empty:
        raise SpecError(origin, f"{name} needs at least one pattern, or the spec can never be used")
    for pattern in value:
        try:
            compiled = _compiled(pattern)
        except re.error as exc:
            raise SpecError(origin, f"{name} pattern {pattern!r} does not compile: {exc}") from None
        # A pattern that matches empty text would match every device name.
        if compiled.fullmatch("") is not None:
            raise SpecError(origin, f"{name} pattern {pattern!r} matches the empty string")
    return tuple(value)


def _figure(value: object, name: str, origin: str) -> Figure:
    if not isinstance(value, Mapping):
        raise SpecError(origin, f"{name} must be an object with value, sources and note")
    unknown = sorted(set(value) - _FIGURE_KEYS)
    if unknown:
        raise SpecError(
            origin, f"{name}: unknown key {unknown[0]!r}; a figure has {', '.join(sorted(_FIGURE_KEYS))}"
        )
    if "value" not in value:
        raise SpecError(origin, f"{name}: missing value (write null with a note when no datasheet gives it)")
    raw_sources = value.get("sources", [])
    if not isinstance(raw_sources, list):
        raise SpecError(origin, f"{name}: sources must be a list")
    sources = tuple(_source(s, f"{name} source {i + 1}", origin) for i, s in enumerate(raw_sources))
    note = value.get("note")
    if note is not None and (not isinstance(note, str) or not note.strip()):
        raise SpecError(origin, f"{name}: note must be a non-empty string")

    number = None if value["value"] is None else _number(value["value"], name, origin)
    if number is None and note is None:
        raise SpecError(origin, f"{name} is null without a note; say why no datasheet gives it")
    if number is not None and not sources:
        raise SpecError(origin, f"{name} = {value['value']} cites no source; add the datasheet url and quote")

    derived = None
    if value.get("derived") is not None:
        derived = _derivation(value["derived"], name, origin)
    sparse = None
    if value.get("sparse_tflop_per_s") is not None:
        sparse = _number(value["sparse_tflop_per_s"], f"{name} sparse_tflop_per_s", origin)
    return Figure(value=number, sources=sources, note=note, derived=derived, sparse_tflop_per_s=sparse)


def _source(value: object, name: str, origin: str) -> Source:
    if not isinstance(value, Mapping):
        raise SpecError(origin, f"{name} must be an object with url and quote")
    unknown = sorted(set(value) - _SOURCE_KEYS)
    if unknown:
        raise SpecError(origin, f"{name}: unknown key {unknown[0]!r}; a source has url, quote and where")
    url = value.get("url")
    if not isinstance(url, str) or not url.startswith(("https://", "http://")):
        raise SpecError(origin, f"{name} needs a url starting with https://")
    quote = value.get("quote")
    if not isinstance(quote, str) or not quote.strip():
        raise SpecError(origin, f"{name} needs the quoted words from the document")
    where = value.get("where")
    if where is not None and (not isinstance(where, str) or not where.strip()):
        raise SpecError(origin, f"{name}: where must be a non-empty string")
    return Source(url=url, quote=quote, where=where)


def _derivation(value: object, name: str, origin: str) -> Derivation:
    if not isinstance(value, Mapping) or set(value) != _DERIVED_KEYS:
        raise SpecError(origin, f"{name}: derived must hold exactly formula and flop_per_clock_per_sm")
    formula = value["formula"]
    if not isinstance(formula, str) or not formula.strip():
        raise SpecError(origin, f"{name}: derived formula must be a non-empty string")
    per_sm = value["flop_per_clock_per_sm"]
    if isinstance(per_sm, bool) or not isinstance(per_sm, int) or per_sm <= 0:
        raise SpecError(origin, f"{name}: flop_per_clock_per_sm must be a positive whole number")
    return Derivation(formula=formula, flop_per_clock_per_sm=per_sm)


def _check_whole(figure: Figure, name: str, origin: str) -> None:
    if figure.value is not None and not figure.value.is_integer():
        raise SpecError(origin, f"{name} must be a whole number, not {figure.value}")


def _check_sparse_half(figure: Figure, origin: str) -> None:
    quotes_sparsity = any(_SPARSE_WORD_RE.search(s.quote) for s in figure.sources)
    if quotes_sparsity and figure.value is not None and figure.sparse_tflop_per_s is None:
        raise SpecError(
            origin,
            "dense_bf16_tflop_per_s quotes a with-sparsity figure; record it as sparse_tflop_per_s and give its half as value",
        )
    if figure.value is None or figure.sparse_tflop_per_s is None:
        return
    half = figure.sparse_tflop_per_s / 2
    if abs(figure.value - half) > SPARSE_HALF_TOLERANCE * half:
        raise SpecError(
            origin,
            f"dense_bf16_tflop_per_s {figure.value:g} is not half the sparse {figure.sparse_tflop_per_s:g}; "
            "peaks are dense (NVIDIA's 2:4 sparse headline is twice the dense figure)",
        )


def derived_tensor_clock_mhz(
    dense_bf16_tflop_per_s: float, sm_count: int, flop_per_clock_per_sm: int
) -> float:
    """The clock a dense peak is stated at: peak / (SMs x FLOP per clock per SM), in MHz."""
    return dense_bf16_tflop_per_s * 1e12 / (sm_count * flop_per_clock_per_sm) / 1e6


def _check_derived_clock(figures: Mapping[str, Figure], origin: str) -> None:
    clock = figures["tensor_clock_mhz"]
    if clock.derived is None:
        return
    per_sm = figures.get("dense_bf16_flop_per_clock_per_sm")
    if (
        per_sm is not None
        and per_sm.value is not None
        and per_sm.value != clock.derived.flop_per_clock_per_sm
    ):
        raise SpecError(
            origin,
            f"tensor_clock_mhz is derived with {clock.derived.flop_per_clock_per_sm} FLOP per clock per SM but "
            f"dense_bf16_flop_per_clock_per_sm gives {per_sm.value:g}",
        )
    if clock.value is None:
        raise SpecError(origin, "tensor_clock_mhz is derived but its value is null")
    sm_count = figures["sm_count"].value
    dense = figures["dense_bf16_tflop_per_s"].value
    if sm_count is None or dense is None:
        raise SpecError(origin, "tensor_clock_mhz is derived but sm_count or dense_bf16_tflop_per_s is null")
    # The formula needs the datasheet for the peak and the whitepaper for the per-SM rate.
    if len(clock.sources) < 2:
        raise SpecError(
            origin, "a derived tensor_clock_mhz cites both the datasheet and the architecture whitepaper"
        )
    exact_mhz = derived_tensor_clock_mhz(dense, int(sm_count), clock.derived.flop_per_clock_per_sm)
    if abs(clock.value - exact_mhz) > DERIVED_CLOCK_TOLERANCE_MHZ:
        raise SpecError(
            origin,
            f"tensor_clock_mhz {clock.value:g} disagrees with its formula: {dense:g} TFLOPS / "
            f"({int(sm_count)} SMs x {clock.derived.flop_per_clock_per_sm} FLOP/clock) = {exact_mhz:.1f} MHz",
        )


def sm_count_from_cores(core_count: int, spec: DeviceSpec) -> tuple[int | None, str | None]:
    """The SMs of a whole GPU from the FP32 CUDA cores NVML counts on it and the spec's cores per SM; else the reason.

    NVML names no SM count for a whole GPU (``nvmlDeviceGetAttributes`` answers for MIG devices only), but it counts
    cores; a count that is not a whole number of SMs is refused rather than rounded.
    """
    per_sm = spec.fp32_cores_per_sm.value
    if per_sm is None:
        return None, f"the spec of {spec.display_name} gives no FP32 cores per SM"
    if isinstance(core_count, bool) or not isinstance(core_count, int) or core_count <= 0:
        return None, f"NVML's core count {core_count!r} is not a positive whole number"
    if core_count % int(per_sm):
        return None, f"NVML's {core_count} cores are not a whole number of {int(per_sm)}-core SMs"
    return core_count // int(per_sm), None


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


# ---------------------------------------------------------------------------------------------------------------------
# Matching and peaks


def match_spec(nvml_name: str, specs: Sequence[DeviceSpec]) -> DeviceSpec | None:
    """The spec whose pattern matches the longest stretch of ``nvml_name``; None when none matches.

    Patterns are case-insensitive regular expressions searched in the name; any ``exclude`` match vetoes that spec
    (so "NVIDIA H200 NVL" is never the H200 SXM). Two specs tied for the longest match is an ambiguity between spec
    files, and ambiguity also gives None: handing out either card's peak could be the wrong card's.
    """
    best: DeviceSpec | None = None
    best_length = 0
    tied = False
    for spec in specs:
        if any(_compiled(p).search(nvml_name) for p in spec.exclude):
            continue
        length = max(
            (len(m.group(0)) for p in spec.match if (m := _compiled(p).search(nvml_name))), default=0
        )
        if length == 0:
            continue
        if length > best_length:
            best, best_length, tied = spec, length, False
        elif length == best_length:
            tied = True
    return None if tied else best


def dense_peak_flop_per_s(
    spec: DeviceSpec, slice_sm_count: int | None = None
) -> tuple[float | None, str | None]:
    """The dense BF16 peak in FLOP/s, or None with the reason; a MIG slice gets the peak x its share of the SMs."""
    tflops = spec.dense_bf16_tflop_per_s.value
    if tflops is None:
        return None, f"no dense BF16 figure on the datasheet for {spec.display_name}"
    peak_flop_per_s = tflops * 1e12
    if slice_sm_count is None:
        return peak_flop_per_s, None
    if isinstance(slice_sm_count, bool) or not isinstance(slice_sm_count, int) or slice_sm_count <= 0:
        raise ValueError(f"slice_sm_count must be a positive whole number of SMs, not {slice_sm_count!r}")
    full_sm_count = spec.sm_count.value
    if full_sm_count is None:
        return (
            None,
            f"SM count of {spec.display_name} is not on its datasheet, so a MIG slice's share is unknown",
        )
    if slice_sm_count > full_sm_count:
        raise ValueError(
            f"slice_sm_count {slice_sm_count} exceeds the {int(full_sm_count)} SMs of {spec.display_name}"
        )
    return peak_flop_per_s * slice_sm_count / full_sm_count, None
