"""PyTorch profiler (Kineto) Chrome-trace events into a ``ProfileBuilder``: which event is GPU work, which is a CUDA
runtime call, which is a profiler step, and how the trace's clock maps to wall time.

Pure: no I/O, no clock. The file is read elsewhere (``trainmeter_core.importers``), in batches of typed events; this
module never holds more than one batch. The event fields it reads are the ones the Chrome trace format and Kineto
document: ``ph``, ``cat``, ``name``, ``pid``, ``tid``, ``ts`` and ``dur`` (µs), ``args.correlation``,
``args.stream``, ``args.device``, ``args.flops``, ``args.bytes``; and at the top ``baseTimeNanoseconds``,
``distributedInfo`` and ``deviceProperties``.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import msgspec

from trainmeter_core.model.profiles.builder import ProfileBuilder, profiler_step_number

#: Event categories that are GPU work (a kernel, a copy, a fill); ``cuda_sync`` events are waits, not work.
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
#: Calls of the CPU into CUDA, during which the GPU may wait for its next launch.
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
#: A timestamp above this many µs is a Unix time (after September 2001): a trace without a base writes those.
UNIX_US = 1e15
NO_BASE = (
    "the trace records no wall-clock base (no baseTimeNanoseconds, and its timestamps are not Unix times), "
    "so its windows cannot be put on the run's clock"
)


class EventArgs(msgspec.Struct):
    correlation: int | None = None
    stream: int | str | None = None
    device: int | None = None
    flops: int | float | None = None
    bytes: int | float | None = None


class Event(msgspec.Struct):
    """One trace event, with only the fields tm reads (the decoder skips the rest without building them)."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    args: EventArgs | None = None


class KinetoTrace:
    """Takes a trace's events batch by batch and its top-level keys, then answers its records."""

    def __init__(self) -> None:
        self.builder = ProfileBuilder(time_unit_s=1e-6)
        self.meta: dict[str, Any] = {}
        self.events = 0
        self.wrong = 0  # events whose fields had types tm cannot use
        self._pids: Counter[int] = Counter()
        self._devices: Counter[int] = Counter()
        self._floats = False
        self._first_ts = math.inf

    def take(self, key: str, value: Any) -> None:
        """A top-level key other than the events (small values only: the reader refuses huge ones)."""
        self.meta[key] = value

    def feed(self, events: list[Event]) -> None:
        builder = self.builder
        add_kernel = builder.add_kernel
        add_runtime = builder.add_runtime
        self.events += len(events)
        floats = self._floats
        first = self._first_ts
        for event in events:
            ts = event.ts
            if ts is None:
                floats = True  # a missing timestamp makes HTA's time column a float one
                continue
            if ts.__class__ is float:
                floats = True
            if event.ph != "X":
                continue
            cat = event.cat
            if (
                cat == "cpu_op"
            ):  # the most common kind: only its FLOPs (and a step of an older PyTorch) matter
                args = event.args
                if args is not None and args.flops is not None and event.dur is not None:
                    builder.add_flop(ts, args.flops)
                if "ProfilerStep" not in event.name:
                    continue
            dur = event.dur
            if dur is None or not (-math.inf < ts < math.inf) or not 0 <= dur < math.inf:
                self.wrong += dur is not None
                continue
            if ts < first:
                first = ts
            args = event.args
            if cat in RUNTIME_CATEGORIES:
                add_runtime(ts, ts + dur, args.correlation if args is not None else None)
                pid = event.pid
                if pid.__class__ is int:
                    self._pids[pid] += 1
            elif cat in GPU_CATEGORIES:
                stream = device = correlation = moved = None
                if args is not None:
                    stream = args.stream
                    if stream is not None and stream.__class__ is not int:
                        stream = _stream(stream)
                    device = args.device
                    correlation = args.correlation
                    if cat != "kernel":
                        moved = args.bytes
                if device is not None:
                    self._devices[device] += 1
                add_kernel(
                    ts,
                    ts + dur,
                    event.name,
                    category=cat,
                    stream=stream,
                    correlation=correlation,
                    moved_b=moved,
                )
            elif cat == "Trace" or cat == "gpu_user_annotation":
                continue
            else:
                name = event.name
                if "ProfilerStep" in name:
                    builder.add_step_mark(name, ts)
                    number = profiler_step_number(name)
                    if number is not None:
                        builder.add_step(number, ts, ts + dur)
                    pid = event.pid
                    if pid.__class__ is int:
                        self._pids[pid] += 1
                if args is not None and cat != "cpu_op":
                    if args.flops is not None:
                        builder.add_flop(ts, args.flops)
                    if args.correlation is not None:
                        add_runtime(ts, ts + dur, args.correlation, launch=False)
        self._floats = floats
        self._first_ts = first

    # -- what the trace says about itself --------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The traced process: the pid most of its CUDA runtime calls and profiler steps ran in."""
        return self._pids.most_common(1)[0][0] if self._pids else None

    @property
    def device_index(self) -> int | None:
        return self._devices.most_common(1)[0][0] if self._devices else None

    @property
    def device_name(self) -> str | None:
        index = self.device_index
        props = self.meta.get("deviceProperties")
        if index is None or not isinstance(props, list):
            return None
        for entry in props:
            if isinstance(entry, dict) and entry.get("id") == index and isinstance(entry.get("name"), str):
                return entry["name"]
        return None

    @property
    def rank(self) -> int | None:
        info = self.meta.get("distributedInfo")
        rank = info.get("rank") if isinstance(info, dict) else None
        return rank if type(rank) is int and rank >= 0 else None

    @property
    def world_size(self) -> int | None:
        info = self.meta.get("distributedInfo")
        size = info.get("world_size") if isinstance(info, dict) else None
        return size if type(size) is int and size > 0 else None

    def wall_offset(self) -> tuple[float | None, str | None]:
        """(seconds to add to a timestamp × 1e-6 to get Unix time, or None; why there is none)."""
        base = self.meta.get("baseTimeNanoseconds")
        if type(base) is int and 0 < base < 2**63:
            return base / 1e9, None
        if self._first_ts != math.inf and self._first_ts > UNIX_US:
            return 0.0, None
        return None, NO_BASE

    def finish(self) -> ProfileBuilder:
        self.builder.float_timestamps = self._floats
        return self.builder


def _stream(value: int | str | None) -> int | None:
    """A stream as HTA reads it: a whole number, else -1 (no stream)."""
    if value is None:
        return None
    if type(value) is int:
        return value
    try:
        return int(value)
    except ValueError:
        return -1
