"""Time on a GPU timeline, by sweeping interval boundaries in time order: tm's split of each window.

Pure: no I/O, no clock. Times are in the trace's own unit (µs for Kineto, ns for Nsight Systems); the caller scales.
Each lane is the union of its intervals as boundaries: lanes 0-4 are tm's kernel classes (``kernels.GEMM`` ...
``MEMORY``), lane 5 is the CPU being inside the CUDA runtime (it never makes the GPU busy; it tells launch waits from
other idle time). Memory is eight bytes per boundary, whatever the trace's size.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from heapq import heapify, heappop, heapreplace

from trainmeter_core.model.profiles.kernels import (
    CLASS_NAMES,
    COMMUNICATION,
    COMPUTE_CLASSES,
    MEMORY,
    SPLIT_NAMES,
)

RUNTIME_LANE = 5
_IDLE = len(CLASS_NAMES)
_COMPUTE_BITS = sum(1 << c for c in COMPUTE_CLASSES)
_COMM_BIT = 1 << COMMUNICATION
_MEMORY_BIT = 1 << MEMORY
_KERNEL_BITS = (1 << len(CLASS_NAMES)) - 1
_RUNTIME_BIT = 1 << RUNTIME_LANE


@dataclass
class WindowTotals:
    """One window's time, in the trace's unit: per class (union), the exclusive split (adds up to the window), busy,
    the overlaps of communication and of memory with compute, and idle time while the CPU was in the CUDA runtime."""

    class_t: list[float] = field(default_factory=lambda: [0.0] * len(CLASS_NAMES))
    split_t: list[float] = field(default_factory=lambda: [0.0] * len(SPLIT_NAMES))
    busy_t: float = 0.0
    comm_compute_t: float = 0.0
    memory_compute_t: float = 0.0
    launch_wait_t: float = 0.0


def _masks() -> list[tuple[int, tuple[int, ...], bool, bool]]:
    """For each set of lanes running at once: the split part that takes the time, the classes running, and whether
    communication or memory overlaps compute."""
    table = []
    for mask in range(1 << (RUNTIME_LANE + 1)):
        kernels = mask & _KERNEL_BITS
        running = tuple(c for c in range(len(CLASS_NAMES)) if kernels >> c & 1)
        part = running[0] if running else _IDLE
        table.append(
            (
                part,
                running,
                bool(kernels & _COMM_BIT and kernels & _COMPUTE_BITS),
                bool(kernels & _MEMORY_BIT and kernels & _COMPUTE_BITS),
            )
        )
    return table


_MASKS = _masks()


def in_start_order(starts: array, ends: array) -> Iterator[tuple[float, float]]:
    """The intervals ``(starts[i], ends[i])`` by start (stable). A profiler writes most of them in order already,
    which costs nothing; otherwise one list of indices is sorted, never a list of tuples."""
    n = len(starts)
    if all(starts[i] <= starts[i + 1] for i in range(n - 1)):
        return zip(starts, ends, strict=True)
    order = sorted(range(n), key=starts.__getitem__)
    return ((starts[i], ends[i]) for i in order)


def union_boundaries(starts: array, ends: array) -> array:
    """The union of the intervals ``(starts[i], ends[i])`` as its boundaries in time order: ``[start1, end1,
    start2, end2, ...]`` (touching intervals merge). Eight bytes per boundary, so a long trace's timeline stays
    small."""
    out = array("d")
    cur_start = cur_end = None
    for start, end in in_start_order(starts, ends):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                out.append(cur_start)
                out.append(cur_end)
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    if cur_end is not None:
        out.append(cur_start)
        out.append(cur_end)
    return out


def sweep_windows(lanes: Sequence[array], bounds: Sequence[float]) -> list[WindowTotals]:
    """The totals of each window ``[bounds[i], bounds[i+1]]`` (windows tile the time from ``bounds[0]`` to the last
    bound), given each lane's union as boundaries (``union_boundaries``): a lane runs between its start and end
    boundaries. Time outside the bounds is not counted."""
    windows = [WindowTotals() for _ in range(max(0, len(bounds) - 1))]
    if not windows:
        return windows
    heap = [(arr[0], lane, 0) for lane, arr in enumerate(lanes) if len(arr)]
    heapify(heap)
    mask = 0
    first, last = bounds[0], bounds[-1]
    w = 0
    w_end = bounds[1]
    totals = windows[0]
    table = _MASKS
    prev = first
    while heap:
        t, lane, i = heap[0]
        if t > prev:
            if t > first and prev < last:
                start = prev if prev > first else first
                stop = t if t < last else last
                if stop <= w_end:
                    # the common case: the stretch lies in the current window
                    d = stop - start
                    part, running, comm_compute, memory_compute = table[mask]
                    totals.split_t[part] += d
                    if running:
                        totals.busy_t += d
                        class_t = totals.class_t
                        for c in running:
                            class_t[c] += d
                        if comm_compute:
                            totals.comm_compute_t += d
                        if memory_compute:
                            totals.memory_compute_t += d
                    elif mask & _RUNTIME_BIT:
                        totals.launch_wait_t += d
                else:
                    w = _add(windows, bounds, w, start, stop, mask)
                    totals = windows[w]
                    w_end = bounds[w + 1]
            prev = t
        mask ^= 1 << lane  # boundaries alternate: a start turns the lane on, its end off
        i += 1
        arr = lanes[lane]
        if i < len(arr):
            heapreplace(heap, (arr[i], lane, i))
        else:
            heappop(heap)
    if prev < last:
        _add(windows, bounds, w, max(prev, first), last, mask)
    return windows


def _add(
    windows: list[WindowTotals], bounds: Sequence[float], w: int, start: float, end: float, mask: int
) -> int:
    """Add ``[start, end)`` with the lanes of ``mask`` running, split over the windows it crosses; returns the window
    ``end`` falls in (the sweep only moves forward)."""
    part, running, comm_compute, memory_compute = _MASKS[mask]
    n = len(windows)
    while start < end:
        while w < n - 1 and start >= bounds[w + 1]:
            w += 1
        stop = min(end, bounds[w + 1]) if w < n - 1 else end
        d = stop - start
        if d > 0:
            totals = windows[w]
            totals.split_t[part] += d
            if running:
                totals.busy_t += d
                for c in running:
                    totals.class_t[c] += d
                if comm_compute:
                    totals.comm_compute_t += d
                if memory_compute:
                    totals.memory_compute_t += d
            elif mask & _RUNTIME_BIT:
                totals.launch_wait_t += d
        if stop <= start:
            break
        start = stop
    return w
