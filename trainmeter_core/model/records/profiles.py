"""Imported profiler results: ``profile.import`` (a dated window of a trace, labelled with the profiler that made it)
with its parts, and the view of them a snapshot shows. Each kind is defined here once; the package's face puts it in
the union. Pure: no I/O, no clock.
"""

# Annotations are evaluated at import, as header.py says why.
from typing import Literal

import msgspec

from trainmeter_core.model.records.header import Record


class KernelStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One kernel name of a profiled trace: its class (docs/profiles.md), how often it ran and for how long in all."""

    name: str
    category: (
        str  # gemm, attention, other_compute, communication, memory (or "mixed" for names counted together)
    )
    count: int
    total_s: float
    flop: float | None = None
    moved_b: float | None = None  # bytes a memcpy or memset moved, where the profiler says


class HtaBreakdown(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A trace's GPU time under HTA 0.5.0's rules (docs/profiles.md): only the work launched before the last
    profiler step started (when the trace has two or more), timestamps rounded as HTA rounds them, percentages of the
    span from the first to the last kept activity, kernel types by name with the time where types overlap."""

    span_s: float
    idle_s: float
    compute_s: float
    non_compute_s: float
    idle_pct: float | None = None
    compute_pct: float | None = None
    non_compute_pct: float | None = None
    kernel_type_s: dict[str, float] = {}  # "COMPUTATION", "COMPUTATION overlapping COMMUNICATION", ...
    kernels: int = 0
    last_step_dropped: bool = False


class ProfileImport(Record, tag="profile.import", kw_only=True):
    """A profiler result read into the run: a dated window, labelled with the profiler that made it.

    One record per profiled step (``scope`` "step") and one for the whole trace (``scope`` "trace") of each profiled
    process; ``rank``, ``host`` and ``pid`` of the header are the traced process's. ``split_s`` is the window's
    exclusive split (gemm, attention, other_compute, communication, memory, idle: it adds up to ``window_s``);
    ``kernel_s`` the time each class ran (classes overlap); ``overlap_s`` the time communication and memory ran
    alongside compute. ``step`` is the run's step the profiled step maps to (by wall time), absent with the reason
    when it cannot be aligned. Every classification rule is in docs/profiles.md.
    """

    importer: str
    file: str
    profiler: str
    scope: Literal["trace", "step"] = "trace"
    trace_id: str = ""  # the same for every record of one trace, and for the same file imported again
    window_start_wall: float | None = None
    window_end_wall: float | None = None
    window_s: float | None = None
    device: str | None = None
    profiler_step: int | None = None  # N of ProfilerStep#N: the profiler's own count
    step_start_wall: float | None = None  # the profiler's step on the CPU
    step_end_wall: float | None = None
    step: int | None = None  # the run's step
    profiler_steps: list[int] = []  # on the trace record: the profiler's steps it holds
    steps: list[int] = []  # ... and the run's steps they map to
    busy_s: float | None = None
    split_s: dict[str, float] = {}
    kernel_s: dict[str, float] = {}
    overlap_s: dict[str, float] = {}
    launch_wait_s: float | None = None  # GPU idle while the CPU was inside the CUDA runtime
    flop: float | None = None  # FLOPs of the ops that carry a count (with_flops=True) in the window
    hints: list[str] = []
    hta: HtaBreakdown | None = None
    top_kernels: list[KernelStat] = []
    world_size: int | None = None
    traced_pid: int | None = None  # the profiled process (the header's pid is the importer's)
    notes: list[str] = []


class ProfileAchieved(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One rank's FLOP/s in its profiled window (FLOPs of the ops that count them / the window) and that as a share
    of its device's dense peak: the profiled window's MFU, next to the run's."""

    rank: int | None = None
    host: str = ""
    flop_per_s: float | None = None
    peak_flop_per_s: float | None = None
    mfu: float | None = None
    absent: dict[str, str] = {}


class ProfileView(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The imported profiles a snapshot shows: each rank's latest trace and its steps, what each achieved, and the
    spread between ranks (for each part of the split, the largest share of a window minus the smallest)."""

    traces: list[ProfileImport] = []
    steps: list[ProfileImport] = []
    achieved: list[ProfileAchieved] = []
    spread: dict[str, float] = {}
    straggler: str | None = None
    imported: int = 0  # traces the engine holds, every rank and import together
