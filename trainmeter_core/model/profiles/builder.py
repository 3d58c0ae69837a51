"""From the activities of one profiled process to ``profile.import`` records: one per profiled step and one for the
whole trace, with tm's split of each window, the top kernels, the FLOPs, launch waits and HTA's breakdown.

Pure: no I/O, no clock. Every importer feeds the same builder (the Kineto reader in tm, the Nsight Systems plugin
through ``trainmeter_core.api``), so the classes, windows and rules are the same whatever profiler wrote the file.
Memory stays bounded by what a trace holds that matters: a few numbers per GPU activity and CUDA runtime call, one
entry per distinct kernel name (at most ``MAX_KERNEL_NAMES``; the rest are counted together).
"""

from __future__ import annotations

import math
import re
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable

from trainmeter_core.model import records
from trainmeter_core.model.profiles.hta import hta_of
from trainmeter_core.model.profiles.kernels import (
    CLASS_NAMES,
    COMMUNICATION,
    COMPUTE_CLASSES,
    MEMORY,
    SPLIT_NAMES,
    classify,
    hta_type,
)
from trainmeter_core.model.profiles.sweep import WindowTotals, sweep_windows, union_boundaries

#: Distinct kernel names kept for the top kernels; past this, names are counted under ``OTHER_KERNELS``.
MAX_KERNEL_NAMES = 20_000
OTHER_KERNELS = "(other kernels: too many distinct names)"
TOP_KERNELS = 10
#: A window whose GPU waited this share of it while the CPU was in the CUDA runtime is called launch-bound.
LAUNCH_BOUND_SHARE = 0.1
NO_GPU = "no GPU activity in the trace (a CPU run, or the profiler did not trace CUDA)"
NO_FLOP = "no op in the trace carries FLOPs: profile with with_flops=True"
_PROFILER_STEP = re.compile(r"ProfilerStep\s*#\s*(\d+)")


def profiler_step_number(name: str) -> int | None:
    """N of a ``ProfilerStep#N`` annotation, or None for any other name."""
    match = _PROFILER_STEP.match(name)
    return int(match.group(1)) if match else None


class ProfileBuilder:
    """Collects one profiled process's activities, then answers its ``profile.import`` records.

    Times are in the trace's own unit (``time_unit_s`` seconds each: 1e-6 for Kineto's µs, 1e-9 for nanoseconds).
    ``float_timestamps`` says whether the file wrote fractional timestamps (HTA then rounds them; see ``hta_round``).
    """

    def __init__(self, time_unit_s: float = 1e-6, float_timestamps: bool = False) -> None:
        self.unit_s = time_unit_s
        self.float_timestamps = float_timestamps
        # GPU activities, one entry each
        self._k_start = array("d")
        self._k_end = array("d")
        self._k_class = array("b")
        self._k_hta = array("b")
        self._k_stream = array("q")
        self._k_corr = array("q")
        # CUDA runtime calls on the CPU (and anything else on the CPU carrying a correlation id)
        self._r_start = array("d")
        self._r_end = array("d")
        self._r_corr = array("q")
        self._runtime_lane = array(
            "b"
        )  # 1: the CPU is inside the runtime (a launch wait), 0: only a correlation
        # the profiler's steps and HTA's view of them
        self._steps: dict[int, tuple[float, float]] = {}
        self._step_marks: list[tuple[str, float]] = []  # every CPU event whose name holds "ProfilerStep"
        self._flop_ts = array("d")
        self._flop = array("d")
        self._flop_sorted: list[float] = []
        self._flop_sums: list[float] | None = None  # prefix sums over the ops sorted by start, built once
        self._names: dict[str, list] = {}  # name -> [count, total, class, moved bytes or None]
        self._first_t = math.inf
        self._last_t = -math.inf
        self.skipped = (
            0  # activities that could not be used (an end before the start, a time that is not finite)
        )

    # -- feeding -------------------------------------------------------------------------------------------------------

    def add_kernel(
        self,
        start: float,
        end: float,
        name: str,
        *,
        category: str = "",
        stream: int | None = None,
        correlation: int | None = None,
        moved_b: float | None = None,
        kind: int | None = None,
    ) -> None:
        """One GPU activity (a kernel, a memcpy, a memset) on ``stream``, launched by the runtime call of
        ``correlation``. ``kind`` overrides the class the name gives (an Nsight Systems memcpy table, say)."""
        if not (-math.inf < start <= end < math.inf):
            self.skipped += 1
            return
        entry = self._names.get(name)
        if entry is None:
            cls = classify(name, category) if kind is None else kind
            if len(self._names) < MAX_KERNEL_NAMES:
                entry = self._names[name] = [0, 0.0, cls, None, hta_type(name)]
            else:
                entry = self._names.get(OTHER_KERNELS)
                if entry is None:
                    entry = self._names[OTHER_KERNELS] = [0, 0.0, -1, None, -1]
        else:
            cls = entry[2] if kind is None else kind
        if entry[2] == -1:  # counted with the other names: its own class and type still place its time
            cls = classify(name, category) if kind is None else kind
            entry_hta = hta_type(name)
        else:
            entry_hta = entry[4]
        entry[0] += 1
        entry[1] += end - start
        if moved_b is not None and 0 <= moved_b < math.inf:
            entry[3] = (entry[3] or 0.0) + moved_b
        self._k_start.append(start)
        self._k_end.append(end)
        self._k_class.append(cls)
        self._k_hta.append(entry_hta)
        self._k_stream.append(stream if stream is not None and -(2**62) < stream < 2**62 else -1)
        self._k_corr.append(correlation if correlation is not None and 0 <= correlation < 2**62 else -1)
        self._seen(start, end)

    def add_runtime(
        self, start: float, end: float, correlation: int | None = None, launch: bool = True
    ) -> None:
        """A call of the CPU into the CUDA runtime or driver (``launch``: the GPU may be waiting on it), or any other
        CPU event that carries the correlation id of the GPU work it launched (``launch=False``)."""
        if not (-math.inf < start <= end < math.inf):
            self.skipped += 1
            return
        self._r_start.append(start)
        self._r_end.append(end)
        self._r_corr.append(correlation if correlation is not None and 0 <= correlation < 2**62 else -1)
        self._runtime_lane.append(1 if launch else 0)
        self._seen(start, end)

    def add_step(self, number: int, start: float, end: float) -> None:
        """The profiler's step ``number`` (``ProfilerStep#N``) on the CPU, from ``start`` to ``end``."""
        if not (-math.inf < start <= end < math.inf) or not 0 <= number < 2**62:
            self.skipped += 1
            return
        self._steps[number] = (start, end)
        self._seen(start, end)

    def add_step_mark(self, name: str, start: float) -> None:
        """A CPU event whose name holds "ProfilerStep": HTA drops the GPU work launched after the last one starts."""
        if -math.inf < start < math.inf:
            self._step_marks.append((name, start))

    def add_flop(self, ts: float, flop: float) -> None:
        """FLOPs an op on the CPU counted (``with_flops=True``), at its start ``ts``."""
        if -math.inf < ts < math.inf and 0 <= flop < math.inf:
            self._flop_ts.append(ts)
            self._flop.append(flop)
            self._flop_sums = None

    def add_time(self, t: float) -> None:
        """Any other timestamp the trace holds, so the trace's span covers it."""
        if -math.inf < t < math.inf:
            self._seen(t, t)

    def _seen(self, start: float, end: float) -> None:
        if start < self._first_t:
            self._first_t = start
        if end > self._last_t:
            self._last_t = end

    # -- answers ---------------------------------------------------------------------------------------------------

    @property
    def kernels(self) -> int:
        return len(self._k_start)

    @property
    def empty(self) -> bool:
        return self._first_t == math.inf

    def steps(self) -> list[int]:
        return sorted(self._steps)

    def records(
        self,
        *,
        importer: str,
        file: str,
        profiler: str,
        trace_id: str,
        wall_offset_s: float | None,
        wall_absent: str | None = None,
        rank: int | None = None,
        host: str = "",
        pid: int | None = None,
        device: str | None = None,
        world_size: int | None = None,
        notes: Iterable[str] = (),
        flop_absent: str = NO_FLOP,
    ) -> list[records.ProfileImport]:
        """The step records (in the profiler's step order) and then the trace record.

        ``flop_absent``: why there are no FLOPs when no op carries a count (the default asks for ``with_flops``).

        ``wall_offset_s``: wall time = trace time × unit + offset, or None when the trace has no wall-clock base
        (then ``wall_absent`` says why, and no window can be put on the run's clock).
        """
        unit = self.unit_s
        launch = self._launch_times()
        step_numbers = self.steps()
        spans = [self._steps[n] for n in step_numbers]
        bounds = self._bounds(spans, launch)
        lanes = self._lanes() if self.kernels else []
        windows = sweep_windows(lanes, bounds) if bounds and lanes else []
        header = {"importer": importer, "file": file, "profiler": profiler, "trace_id": trace_id}
        ids = {"rank": rank, "host": host, "traced_pid": pid or None, "source": f"import:{importer}"}
        has_gpu = self.kernels > 0

        def wall(t: float) -> float | None:
            return None if wall_offset_s is None else t * unit + wall_offset_s

        out: list[records.ProfileImport] = []
        for i, number in enumerate(step_numbers):
            cpu_start, cpu_end = spans[i]
            start, end = bounds[i], bounds[i + 1]
            record = records.ProfileImport(
                **header,
                **ids,
                scope="step",
                profiler_step=number,
                device=device,
                window_s=(end - start) * unit,
                window_start_wall=wall(start),
                window_end_wall=wall(end),
                step_start_wall=wall(cpu_start),
                step_end_wall=wall(cpu_end),
            )
            flop = self._flop_in(cpu_start, cpu_end)
            self._fill(record, windows[i] if has_gpu else None, flop, wall_absent, flop_absent)
            out.append(record)
        # The trace: the steps' windows together, or (no step annotated) the span of its GPU activity.
        if bounds:
            start, end = bounds[0], bounds[-1]
            total = _sum(windows)
            flop = self._flop_in(spans[0][0], spans[-1][1])
        else:
            if has_gpu:
                start, end = min(self._k_start), max(self._k_end)
                total = sweep_windows(lanes, [start, end])[0]
            else:
                start, end = self._first_t, self._last_t
                total = None
            flop = self._flop_in(-math.inf, math.inf)
        if self.empty:
            start = end = 0.0
        record = records.ProfileImport(
            **header,
            **ids,
            scope="trace",
            device=device,
            window_s=(end - start) * unit,
            window_start_wall=wall(start),
            window_end_wall=wall(end),
            profiler_steps=step_numbers,
            world_size=world_size,
            notes=list(notes),
        )
        self._fill(record, total if has_gpu else None, flop, wall_absent, flop_absent)
        record.top_kernels = self._top_kernels()
        hta = hta_of(
            self._k_start,
            self._k_end,
            self._k_stream,
            self._k_corr,
            self._k_hta,
            launch,
            [start for _, start in self._step_marks],
            len({name for name, _ in self._step_marks}),
            self.float_timestamps,
            self.unit_s,
        )
        if hta is not None:
            record.hta = hta
        elif has_gpu:
            record.absent = {**record.absent, "hta": "no GPU activity with a stream: nothing for HTA's rules"}
        out.append(record)
        return out

    # -- the pieces ------------------------------------------------------------------------------------------------

    def _launch_times(self) -> array:
        """For each GPU activity, the start of the earliest CPU event with its correlation id (inf when none).

        Correlation ids count up within a process, so a table indexed by id is small; a trace whose ids are spread
        too thin for that (a hand-made one) takes a dictionary instead."""
        inf = math.inf
        launch = array("d", [inf]) * self.kernels
        corrs = [c for c in self._r_corr if c >= 0]
        if not self.kernels or not corrs:
            return launch
        low, high = min(corrs), max(corrs)
        del corrs
        span = high - low + 1
        if span <= 4 * (len(self._r_corr) + self.kernels) + 1_000_000:
            first = array("d", [inf]) * span
            for t, c in zip(self._r_start, self._r_corr, strict=True):
                if c >= 0 and t < first[c - low]:
                    first[c - low] = t
            for i, c in enumerate(self._k_corr):
                if low <= c <= high:
                    launch[i] = first[c - low]
            return launch
        by_corr: dict[int, float] = {}
        for t, c in zip(self._r_start, self._r_corr, strict=True):
            if c >= 0 and t < by_corr.get(c, inf):
                by_corr[c] = t
        for i, c in enumerate(self._k_corr):
            if c >= 0:
                launch[i] = by_corr.get(c, inf)
        return launch

    def _bounds(self, spans: list[tuple[float, float]], launch: array) -> list[float]:
        """The windows of the steps, as bounds: a step's window ends when both the CPU left the step and the GPU
        finished the work launched in it, and starts where the previous one ended (the first at its CPU start), so
        the windows tile the profiled time and add up to it."""
        if not spans:
            return []
        ends = [span[1] for span in spans]
        starts = [span[0] for span in spans]
        if self.kernels:
            # GPU work belongs to the step whose CPU span its launch fell in.
            order = sorted(range(len(spans)), key=starts.__getitem__)
            sorted_starts = [starts[i] for i in order]
            k_end = self._k_end
            for i, t in enumerate(launch):
                if t == math.inf:
                    continue
                at = bisect_right(sorted_starts, t) - 1
                if at < 0:
                    continue
                step = order[at]
                if t < spans[step][1] and k_end[i] > ends[step]:
                    ends[step] = k_end[i]
        bounds = [spans[0][0]]
        for end in ends:
            bounds.append(max(end, bounds[-1]))
        return bounds

    def _lanes(self) -> list[array]:
        """Each class's union, then the CUDA runtime calls' union, as boundaries (one class at a time in memory)."""
        lanes = []
        for c in range(len(CLASS_NAMES)):
            starts, ends = array("d"), array("d")
            for s, e, k in zip(self._k_start, self._k_end, self._k_class, strict=True):
                if k == c:
                    starts.append(s)
                    ends.append(e)
            lanes.append(union_boundaries(starts, ends))
        starts, ends = array("d"), array("d")
        for s, e, k in zip(self._r_start, self._r_end, self._runtime_lane, strict=True):
            if k:
                starts.append(s)
                ends.append(e)
        lanes.append(union_boundaries(starts, ends))
        return lanes

    def _flop_in(self, start: float, end: float) -> float | None:
        """FLOPs of the ops that started in ``[start, end)``, or None when no op carries a count."""
        if not self._flop:
            return None
        if self._flop_sums is None:
            pairs = sorted(zip(self._flop_ts, self._flop, strict=True))
            self._flop_sorted = [t for t, _ in pairs]
            sums = [0.0]
            for _, f in pairs:
                sums.append(sums[-1] + f)
            self._flop_sums = sums
        lo = bisect_left(self._flop_sorted, start)
        hi = bisect_left(self._flop_sorted, end)
        return self._flop_sums[hi] - self._flop_sums[lo]

    def _fill(
        self,
        record: records.ProfileImport,
        totals: WindowTotals | None,
        flop: float | None,
        wall_absent: str | None,
        flop_absent: str = NO_FLOP,
    ) -> None:
        unit = self.unit_s
        absent: dict[str, str] = {}
        if totals is None:
            for key in ("busy_s", "split_s", "kernel_s", "overlap_s", "launch_wait_s"):
                absent[key] = NO_GPU
        else:
            record.busy_s = totals.busy_t * unit
            record.split_s = {name: totals.split_t[i] * unit for i, name in enumerate(SPLIT_NAMES)}
            record.kernel_s = {name: totals.class_t[i] * unit for i, name in enumerate(CLASS_NAMES)}
            record.overlap_s = {
                "communication_compute": totals.comm_compute_t * unit,
                "memory_compute": totals.memory_compute_t * unit,
            }
            record.launch_wait_s = totals.launch_wait_t * unit
            window = record.window_s or 0.0
            if window > 0 and totals.launch_wait_t * unit >= LAUNCH_BOUND_SHARE * window:
                idle = totals.split_t[len(CLASS_NAMES)] * unit
                record.hints = [
                    f"launch-bound: the GPU waited {_ms(totals.launch_wait_t * unit)} of {_ms(window)} "
                    f"({totals.launch_wait_t * unit / window:.0%}) while the CPU was in the CUDA runtime "
                    f"({_ms(idle)} idle in all); fewer, larger kernels (CUDA graphs, torch.compile) would help"
                ]
        if flop is None:
            absent["flop"] = flop_absent
        else:
            record.flop = flop
        if wall_absent is not None:
            for key in ("window_start_wall", "window_end_wall"):
                absent[key] = wall_absent
            if record.scope == "step":
                absent["step"] = wall_absent
        record.absent = absent

    def _top_kernels(self) -> list[records.KernelStat]:
        unit = self.unit_s
        ranked = sorted(self._names.items(), key=lambda item: -item[1][1])[:TOP_KERNELS]
        return [
            records.KernelStat(
                name=name,
                category=CLASS_NAMES[cls] if cls >= 0 else "mixed",
                count=count,
                total_s=total * unit,
                moved_b=moved,
            )
            for name, (count, total, cls, moved, _) in ranked
        ]


def _sum(windows: list[WindowTotals]) -> WindowTotals:
    total = WindowTotals()
    for w in windows:
        for i, v in enumerate(w.class_t):
            total.class_t[i] += v
        for i, v in enumerate(w.split_t):
            total.split_t[i] += v
        total.busy_t += w.busy_t
        total.comm_compute_t += w.comm_compute_t
        total.memory_compute_t += w.memory_compute_t
        total.launch_wait_t += w.launch_wait_t
    return total


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


__all__ = [
    "COMMUNICATION",
    "COMPUTE_CLASSES",
    "MEMORY",
    "NO_FLOP",
    "NO_GPU",
    "ProfileBuilder",
    "profiler_step_number",
]
