"""HTA's rules (HolisticTraceAnalysis 0.5.0: ``get_temporal_breakdown`` and ``get_gpu_kernel_breakdown`` with memory
kernels), reimplemented from its documented behaviour so that tm's numbers can be checked against the reference
analyser: which GPU work it keeps, how it rounds, how it merges, and how it names overlaps.

Pure: no I/O, no clock. tm's own split (``sweep``) differs on purpose (docs/profiles.md says where and why).
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

from trainmeter_core.model import records
from trainmeter_core.model.profiles.kernels import (
    HTA_COMMUNICATION,
    HTA_COMPUTATION,
    HTA_MEMORY,
    HTA_TYPE_NAMES,
)
from trainmeter_core.model.profiles.sweep import in_start_order

# reimplemented from its documented behaviour so that tm's numbers can be checked against it.


@dataclass
class HtaResult:
    span: float
    idle: float
    compute: float
    non_compute: float
    by_type: dict[str, float]
    kernels: int


def hta_round(ts: float, end: float, float_timestamps: bool) -> tuple[float, float]:
    """HTA rounds a trace whose timestamps are not all whole µs: the start up and the end down (so an activity
    shorter than its rounding gets a negative length, which HTA keeps)."""
    if not float_timestamps:
        return ts, end
    return float(math.ceil(ts)), float(math.floor(end))


def hta_merge(starts: array, ends: array) -> array:
    """HTA's merge, as boundaries: sorted by start, an interval opens a new group when it starts after the largest
    end so far (touching intervals merge); a group spans its smallest start to its largest end (which may lie before
    its start: HTA keeps a negative length)."""
    out = array("d")
    reach = -math.inf
    cur_start = cur_end = None
    for start, end in in_start_order(starts, ends):
        if cur_start is None or start > reach:
            if cur_start is not None:
                out.append(cur_start)
                out.append(cur_end)
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
        if end > reach:
            reach = end
    if cur_start is not None:
        out.append(cur_start)
        out.append(cur_end)
    return out


def _length(groups: array) -> float:
    return sum(groups[i + 1] - groups[i] for i in range(0, len(groups), 2))


def hta_breakdown(per_kind: dict[int, tuple[array, array]]) -> HtaResult | None:
    """HTA's temporal and kernel-type breakdown of the kept GPU activities, given as ``(starts, ends)`` per HTA type
    and rounded as HTA rounds them; None when there is none. Each type is merged on its own, then all of them
    together (the same union as merging every activity at once)."""
    kernels = sum(len(starts) for starts, _ in per_kind.values())
    if not kernels:
        return None
    merged_kind = {kind: hta_merge(starts, ends) for kind, (starts, ends) in per_kind.items()}
    all_starts, all_ends = array("d"), array("d")
    for groups in merged_kind.values():
        all_starts.extend(groups[0::2])
        all_ends.extend(groups[1::2])
    merged = hta_merge(all_starts, all_ends)
    span = merged[-1] - merged[0]
    idle = span - _length(merged)
    compute = _length(merged_kind[HTA_COMPUTATION]) if HTA_COMPUTATION in merged_kind else 0.0
    non_compute = span - compute - idle
    # The type breakdown: each type's merged intervals add its bit while they run; the time is filed under the names
    # of the bits of the running sum, in HTA's order (computation, communication, memory).
    bits = {HTA_COMPUTATION: 1, HTA_COMMUNICATION: 2, HTA_MEMORY: 4}
    order = (HTA_COMPUTATION, HTA_COMMUNICATION, HTA_MEMORY)
    names = {
        running: " overlapping ".join(HTA_TYPE_NAMES[k] for k in order if running & bits[k])
        for running in range(8)
    }

    def boundaries(kind: int) -> Iterator[tuple[float, int]]:
        groups = merged_kind[kind]
        bit = bits[kind]
        for i in range(0, len(groups), 2):
            start, end = groups[i], groups[i + 1]
            if end < start:  # a negative group (see hta_merge): its end comes first in time
                yield end, -bit
                yield start, bit
            else:
                yield start, bit
                yield end, -bit

    by_type: dict[str, float] = {}
    running = 0
    prev = 0.0
    streams = [boundaries(kind) for kind in order if kind in merged_kind]
    for t, delta in heapq.merge(*streams, key=lambda ev: ev[0]):
        if running > 0:
            name = names.get(running) or " overlapping ".join(
                HTA_TYPE_NAMES[k] for k in order if running & bits[k]
            )
            if name and t > prev:
                by_type[name] = by_type.get(name, 0.0) + (t - prev)
        running += delta
        prev = t
    return HtaResult(
        span=span, idle=idle, compute=compute, non_compute=non_compute, by_type=by_type, kernels=kernels
    )


def hta_of(
    k_start: array,
    k_end: array,
    k_stream: array,
    k_corr: array,
    k_type: array,
    launch: array,
    step_mark_starts: list[float],
    step_names: int,
    floats: bool,
    unit_s: float,
) -> records.HtaBreakdown | None:
    """HTA's breakdown: only the GPU activities launched before the last ProfilerStep started (when the trace
        has two step names or more), rounded as HTA rounds them (``launch``: each activity's launch, unrounded; the
    arrays hold one entry per GPU activity, as the builder keeps them)."""
    ceil, floor = math.ceil, math.floor
    last_start = None
    if step_names >= 2:
        last_start = max(step_mark_starts)
        if floats:
            last_start = ceil(last_start)
    per_kind: dict[int, tuple[array, array]] = {}
    for start, end, stream, corr, kind, launched in zip(
        k_start, k_end, k_stream, k_corr, k_type, launch, strict=True
    ):
        if stream == -1:
            continue  # HTA counts only activities on a stream
        if floats:
            start, end = ceil(start), floor(end)
        if last_start is not None:
            if stream >= 0 and corr >= 0:
                if launched == math.inf or not (ceil(launched) if floats else launched) < last_start:
                    continue  # launched in the last step (or by nothing HTA kept)
            elif not start < last_start:
                continue
        bucket = per_kind.get(kind)
        if bucket is None:
            bucket = per_kind[kind] = (array("d"), array("d"))
        bucket[0].append(start)
        bucket[1].append(end)
    result: HtaResult | None = hta_breakdown(per_kind)
    if result is None:
        return None
    unit = unit_s
    span = result.span
    return records.HtaBreakdown(
        span_s=span * unit,
        idle_s=result.idle * unit,
        compute_s=result.compute * unit,
        non_compute_s=result.non_compute * unit,
        idle_pct=_pct(result.idle, span),
        compute_pct=_pct(result.compute, span),
        non_compute_pct=_pct(result.non_compute, span),
        kernel_type_s={name: t * unit for name, t in result.by_type.items()},
        kernels=result.kernels,
        last_step_dropped=last_start is not None,
    )


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 2) if whole > 0 else None
