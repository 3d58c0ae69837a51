"""The records every trainmeter process exchanges: one msgspec Struct per kind, in one tagged union.

This module is the contract between processes and the only place a record kind is defined. It is pure: no I/O, no
clock. Every field of every kind is pinned here; a field that cannot be known is left out and named in ``absent``
with its reason, never filled with a zero.

Why one module of about 800 lines: the tagged union needs every kind at once, "each record kind is defined once, in
records.py" is how a reader finds any of them, and the codec at the bottom (wire, log line, batch) is the union's
own, built on its per-kind decoders; split by kind, a kind's definition would sit far from the union that makes it a
record.
"""

# No ``from __future__ import annotations`` here: the decoders built at import would then evaluate ~600 annotations
# from strings, which cost every tm process 3-8 ms at start (docs/architecture.md, "What a short command pays").
import math
from typing import Any, Literal

import msgspec

#: Version of the record schema; a reader keeps records of a newer version and counts what it does not know.
#: 2: a FLOP count ends in ``_flop`` and a rate in ``_flop_per_s`` (docs/bus.md has the table of renamed keys).
SCHEMA_VERSION = 2
#: What a record without ``v`` was written under: schema 1 left ``v`` out as its default. Writers stamp
#: ``SCHEMA_VERSION`` on every record they send (the producer and the hub), so every line says its schema.
UNSTAMPED_VERSION = 1
#: Version of the agent <-> launcher protocol, carried in ``hello``.
#: 2: the agent sends its records in windows (``model/window.py``), which the hub turns into records.
PROTOCOL_VERSION = 2

Provenance = Literal["declared", "emitted", "detected", "assumed"]
Severity = Literal["info", "warning", "critical"]


class Record(msgspec.Struct, tag_field="kind", kw_only=True, omit_defaults=True):
    """The header every record carries.

    ``seq`` is the hub's sequence number: absent on the wire from a producer (the hub sends it in its own frame) and
    present in the run log. ``t`` is monotonic seconds (CLOCK_MONOTONIC, shared by the processes of one host),
    ``wall`` is Unix time. ``dropped`` is the producer's cumulative count of records it had to drop when this one was
    sent, so the last record received from a producer is authoritative. ``absent`` maps a field name to the reason it
    is missing: the one form of "unknown" every kind uses.
    """

    v: int = UNSTAMPED_VERSION
    seq: int | None = None
    t: float = 0.0
    wall: float = 0.0
    source: str = ""
    host: str = ""
    pid: int = 0
    rank: int | None = None
    dropped: int = 0
    absent: dict[str, str] = {}


# --------------------------------------------------------------------------------------------------------------------
# Run lifetime


class PluginInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    group: str
    distribution: str | None = None
    version: str | None = None
    provides: list[str] = []
    error: str | None = None


class JobPlace(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Where a run sits in a job of several nodes (docs/multinode.md): the job's id, this node's rank among ``nnodes``,
    the job hub's address (node rank 0 hosts it) and how tm found all this out."""

    id: str  # the rendezvous id, Slurm's job id, or the job hub's address
    node_rank: int
    nnodes: int
    hub: str  # "HOST:PORT"
    found_by: str  # "torchrun flags", "environment", "slurm", "--job"


class RunStart(Record, tag="run.start", kw_only=True):
    """Written first by the launcher, once the hub is bound and the child started. ``job`` is set on every node of a
    job of several nodes; on the job hub's node (rank 0) the run holds the whole job."""

    run_id: str
    name: str
    run_dir: str
    command: list[str]  # secrets redacted
    cwd: str
    child_pid: int | None = None
    tm_version: str
    python: str
    platform: str
    env: dict[str, str] = {}  # the variables that shape a run (CUDA_VISIBLE_DEVICES, ...), secrets redacted
    agent: bool = True
    slurm: bool = False
    plugins: list[PluginInfo] = []
    job: JobPlace | None = None
    # 1 for a run's first start; a resumed run (``tm --resume``) counts its attempts on in the same log
    attempt: int = 1
    resume_reason: str | None = (
        None  # why this start continues the run: "--resume", or the checkpoint it matched
    )


class RunEnd(Record, tag="run.end", kw_only=True):
    """Written last by the launcher. ``status`` is tm's own exit status (the child's, or 128+N for signal N)."""

    status: int
    reason: Literal["exited", "signaled", "not_found", "not_executable", "launcher_error", "detached"]
    exit_code: int | None = None
    signal: int | None = None
    signal_name: str | None = None
    elapsed_s: float
    steps: int = 0


class Hello(Record, tag="hello", kw_only=True):
    """The agent's first word from a Python process of the run."""

    protocol: int  # required, so it is always on the wire (a default would be omitted)
    agent_version: str
    python: str
    executable: str
    argv: list[str]  # secrets redacted
    ppid: int
    role: Literal["trainer", "launcher", "worker", "other"] = "trainer"
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    node_rank: int | None = None
    trackers: list[str] = []  # tracker taps the agent may attach


class Bye(Record, tag="bye", kw_only=True):
    """A producer's last record: sent on close, after every other one, so its ``dropped`` is final."""

    sent: int
    reason: str = "exit"


# --------------------------------------------------------------------------------------------------------------------
# What the loop does


class Fact(Record, tag="fact", kw_only=True):
    """One input with its provenance: declared (flag or tm.toml) > emitted > detected > assumed."""

    name: str
    value: Any = None
    provenance: Provenance
    origin: str  # "--budget-tokens", "tm.toml:budget_tokens", "agent:model", "sampler:nvml", ...
    unit: str | None = None
    device: str | None = None  # for per-device facts: "<host>/gpu<index>" or "<host>/cpu"
    note: str | None = None
    warning: str | None = None


TokenSource = Literal["input_ids", "attention_mask", "declared", "emitted"]


class Step(Record, tag="step", kw_only=True):
    """One training iteration on one rank: the first optimizer step after a backward pass.

    Several optimizers stepping in one iteration count once; a step that GradScaler skipped still counts, marked
    ``skipped``. ``step_time_s`` is the time since this rank's previous step (absent for the first). Tokens are this
    rank's; ``tokens_global`` is tokens × the data-parallel degree.
    """

    step: int
    skipped: bool = False
    profiled: bool = False
    step_time_s: float | None = None
    micro_batches: int | None = None
    tokens: int | None = None
    tokens_source: TokenSource | None = None
    tokens_global: int | None = None
    dp: int | None = None
    optimizers: int | None = None  # optimizer.step calls seen in the previous iteration
    # The agent's own time in this iteration, where it timed itself: one iteration in 16 (steps 16, 32, ...)
    agent_us: float | None = None
    # On a process's first step only: the step its training resumed after, read from the optimizer's restored
    # state (its ``step``), so the steps of a resumed run go on where its checkpoint left them
    resumed_from: int | None = None


class Metric(Record, tag="metric", kw_only=True):
    """Numbers the loop reported, by ``emit()`` or a tracker tap, under the raw keys the loop used; or the loss the
    loop passed to ``backward()``, as ``train_loss`` with origin ``backward`` (it loses to any other origin)."""

    values: dict[str, float]
    step: int | None = None  # the loop's own step if it gave one, else the agent's iteration count
    origin: str = "emit"  # "emit", "wandb", "tensorboard", "tensorboardx", "mlflow", "backward", ...


PhaseName = Literal["startup", "compile", "data_wait", "checkpoint", "eval", "profiler"]


class Phase(Record, tag="phase", kw_only=True):
    """A span of time the loop spent outside plain compute, seen by a probe."""

    phase: PhaseName
    start_t: float
    end_t: float
    step: int | None = None
    probe: str = ""
    paths: list[str] = []  # checkpoint files written, so the disk holding them can be watched
    detail: str | None = None


class Notice(Record, tag="notice", kw_only=True):
    """A one-line message from a process of the run (an agent probe that went quiet, a diagnosis)."""

    level: Literal["info", "warning", "error"] = "warning"
    topic: str
    message: str


# --------------------------------------------------------------------------------------------------------------------
# The clock


class Tick(Record, tag="tick", kw_only=True):
    """The hub's once-a-second clock: the engine's and the alert rules' only notion of time passing."""

    n: int
    interval_s: float
    child_alive: bool = True


# --------------------------------------------------------------------------------------------------------------------
# The job: written by the job hub (node rank 0) alone, about the nodes that forward their records to it


class NodeEvent(Record, tag="node", kw_only=True):
    """The job hub's word about one node: it joined, fell silent (``lost``), came back, is behind or caught up, lost
    records it could not resend (``gap``), or ended. The header is the hub's (its host, its clock); the node is
    ``node_rank`` on ``node_host``. ``through`` is the node's forwarding sequence number up to which the hub holds
    every record; ``behind`` the records the node has sent its hub but not yet this one; ``lost`` the records that
    fell out of the node's bounded resend buffer before they got here (never resent, so counted). ``last_*`` describe
    the last record the hub received from the node, ``last_t`` mapped onto the hub's clock."""

    node_rank: int
    node_host: str
    event: Literal["joined", "lost", "resumed", "behind", "caught_up", "gap", "ended"]
    node_run: str | None = None  # the node's own run id (its local run directory's name)
    through: int | None = None
    behind: int | None = None
    lost: int | None = None
    last_kind: str | None = None
    last_t: float | None = None
    last_wall: float | None = None
    silent_s: float | None = None
    reason: str | None = None


class ClockMap(Record, tag="clock", kw_only=True):
    """How the job hub maps one node's monotonic clock onto its own: hub t = node t + ``offset_s``, good to within
    ``uncertainty_s``. The first estimate comes from the wall clocks when the node says hello (``basis`` "wall": as
    good as the clocks' synchronisation, so no bound); each later one from the round trip of a ping with the least
    delay (``basis`` "round_trip": the offset is known to ± half that round trip). ``wall_skew_s`` is how far the
    node's wall clock is from the hub's at the same instant, as the round trip sees it."""

    node_rank: int
    node_host: str
    offset_s: float
    basis: Literal["wall", "round_trip"]
    uncertainty_s: float | None = None
    rtt_s: float | None = None
    wall_skew_s: float | None = None
    samples: int = 0


# --------------------------------------------------------------------------------------------------------------------
# Samplers


class GpuProcess(msgspec.Struct, kw_only=True, omit_defaults=True):
    pid: int
    used_memory_b: int | None = None


class SampleGpu(Record, tag="sample.gpu", kw_only=True):
    """One GPU, once per sampling interval. Rates carry the window they cover; a missing field is in ``absent``."""

    index: int
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    fake: bool = False
    adapter: str = "server"
    spec_id: str | None = None
    mig_parent_uuid: str | None = None
    sm_count: int | None = None
    # NVML
    util_gpu: float | None = None  # 0..1, GPU-Util: share of time a kernel ran
    util_mem: float | None = None  # 0..1, memory-controller busy
    util_window_s: float | None = None
    mem_used_b: int | None = None
    mem_total_b: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None  # cumulative since driver load
    temp_c: float | None = None
    clock_sm_mhz: float | None = None
    clock_sm_max_mhz: float | None = None
    clock_mem_mhz: float | None = None
    clock_mem_max_mhz: float | None = None
    clock_event_reasons: int | None = None  # NVML bitmask
    throttle: list[str] = []  # decoded active reasons: "sw_power_cap", "hw_slowdown", "sw_thermal", ...
    pcie_tx_bps: float | None = None
    pcie_rx_bps: float | None = None
    nvlink_tx_bps: float | None = None
    nvlink_rx_bps: float | None = None
    ecc_corrected: int | None = None  # volatile counts
    ecc_uncorrected: int | None = None
    xid: list[int] = []  # Xid events seen since the previous sample
    processes: list[GpuProcess] = []
    # GPM (Hopper and newer), each a 0..1 rate over the window [gpm_window_start_t, t]
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None  # any tensor pipe
    tensor_hmma_active: float | None = None
    dram_active: float | None = None
    gpm_window_s: float | None = None
    gpm_window_start_t: float | None = None


class ProcessStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    pid: int
    name: str
    cpu_cores: float | None = None
    rss_b: int | None = None


class SampleHost(Record, tag="sample.host", kw_only=True):
    """The run's process tree: CPU cores busy, resident memory, how many processes."""

    root_pid: int
    procs: int
    cpu_cores: float | None = None  # cores busy over the window
    rss_b: int | None = None
    threads: int | None = None
    io_read_bps: float | None = None
    io_write_bps: float | None = None
    window_s: float | None = None
    top: list[ProcessStat] = []


class DiskStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    device: str
    read_bps: float | None = None
    write_bps: float | None = None
    busy: float | None = None  # 0..1


class NetStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    interface: str
    rx_bps: float | None = None
    tx_bps: float | None = None


class FsStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: Literal["run", "checkpoints", "shm", "other"]
    path: str
    mount: str | None = None
    total_b: int | None = None
    avail_b: int | None = None


class SampleNode(Record, tag="sample.node", kw_only=True):
    """The node: CPU split, load, memory, cgroup limits, disks, network, the filesystems that matter to the run."""

    cpu_count: int | None = None
    cpu_user: float | None = None  # fractions 0..1 of all CPUs over the window
    cpu_system: float | None = None
    cpu_iowait: float | None = None
    cpu_steal: float | None = None
    cpu_idle: float | None = None
    load1: float | None = None
    load5: float | None = None
    load15: float | None = None
    mem_total_b: int | None = None
    mem_available_b: int | None = None
    swap_total_b: int | None = None
    swap_used_b: int | None = None
    cgroup_cpu_quota_cores: float | None = None
    cgroup_mem_limit_b: int | None = None
    cgroup_mem_used_b: int | None = None
    disks: list[DiskStat] = []
    net: list[NetStat] = []
    filesystems: list[FsStat] = []
    window_s: float | None = None


# --------------------------------------------------------------------------------------------------------------------
# Derived


class ExplainInput(msgspec.Struct, kw_only=True, omit_defaults=True):
    value: Any = None
    unit: str | None = None
    source: str | None = None  # provenance or the record it came from


class Explain(msgspec.Struct, kw_only=True, omit_defaults=True):
    formula: str
    inputs: dict[str, ExplainInput] = {}
    note: str | None = None


class MetricValue(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One derived number. Absent: ``value`` is None and ``absent`` names the input that would enable it."""

    value: float | None = None
    low: float | None = None  # a range, where the number is one per convention
    high: float | None = None
    unit: str | None = None
    convention: str | None = None
    label: str | None = None  # "datasheet", "declared", "measured", "counters", "ema", "training window", ...
    window_start_t: float | None = None
    window_end_t: float | None = None
    absent: str | None = None


class SeriesPoint(msgspec.Struct, kw_only=True, omit_defaults=True):
    canonical: str
    raw_key: str
    value: float
    step: int | None = None
    t: float | None = None


class RankStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    rank: int
    host: str
    steps: int
    step_time_s: float | None = None
    device: str | None = None
    node: int | None = None  # the node rank of ``host`` in a job of several nodes


class NodeStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One node of a job as the job hub's engine sees it. ``state``: ``live`` (sending), ``behind`` (connected and
    catching up on records it kept while the link was down), ``lost`` (silent past the heartbeat timeout: dead or cut
    off, the job hub cannot tell which), ``ended`` (its run ended and it said so). ``lag_s`` is how long after the
    first node this node's ranks report a step, on the hub's clock (an EMA over the steps every node reported): the
    straggler is the node with the largest. ``gap_records`` fell out of the node's resend buffer and never came."""

    node_rank: int
    host: str
    state: Literal["live", "behind", "lost", "ended"]
    ranks: list[int] = []
    steps: int = 0  # step records of its ranks received
    step_time_s: float | None = None  # the median of its ranks' step-time EMAs
    lag_s: float | None = None
    last_t: float | None = None  # its last record, on the hub's clock
    last_kind: str | None = None  # the kind of its last record the job hub told of (when it was lost)
    silent_s: float | None = None  # since then, at this snapshot
    behind: int | None = None
    gaps: int = 0
    gap_records: int = 0
    clock_offset_s: float | None = None
    clock_uncertainty_s: float | None = None
    clock_basis: str | None = None
    node_run: str | None = None


# --------------------------------------------------------------------------------------------------------------------
# Imported profiles


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


class AttemptStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One start of a run (a resumed run has several), as the engine saw it in the log.

    ``gap_s`` is the time from the previous attempt's end (its last tick or step) to this one's start (down);
    ``resumed_from`` the step its training resumed after (None for the first attempt); ``superseded_steps`` how many
    steps of earlier attempts after that step were done again, and ``superseded_s`` the time they had taken.
    """

    attempt: int
    start_t: float
    start_wall: float
    # "running", "exited N", "killed by SIGTERM", "lost" (no run.end: tm stopped with it). Required: omit_defaults
    # compares a string default by identity, so an equal string made at run time would be written and the literal not
    end: str
    first_step: int | None = None
    last_step: int | None = None
    steps: int = 0
    last_t: float | None = None
    last_wall: float | None = None
    gap_s: float | None = None
    resumed_from: int | None = None
    superseded_steps: int = 0
    superseded_s: float = 0.0


class Snapshot(Record, tag="snapshot", kw_only=True):
    """The engine's state after a ``tick`` or ``run.end``: published on the bus, never written to the run log."""

    tick: int
    final: bool = False
    state: Literal["starting", "running", "finished", "lost"] = "running"
    elapsed_s: float | None = None
    steps: int = 0
    tokens: int | None = None
    metrics: dict[str, MetricValue] = {}
    explain: dict[str, Explain] = {}
    series: dict[str, SeriesPoint] = {}
    ranks: list[RankStat] = []
    phases_s: dict[str, float] = {}  # time split
    phases_seen: dict[
        str, int
    ] = {}  # phase records seen per phase (rank 0): which probes measured their part
    facts: dict[str, Fact] = {}
    warnings: list[str] = []
    through_seq: int | None = None  # the last hub sequence number this snapshot reflects
    profile: ProfileView | None = (
        None  # imported profiler results (tm import, or a run's own traces at its end)
    )
    job: JobPlace | None = (
        None  # the job this run holds, when it is the job hub's run of a job of several nodes
    )
    nodes: list[NodeStat] = []  # every node of the job, by node rank
    attempts: list[AttemptStat] = []  # every start of the run, oldest first


class HistoryDelta(Record, tag="history", kw_only=True):
    """The history points the engine added since its previous ``history`` record, published after each snapshot and
    never written (replay recomputes them). A replica that applied deltas 1 to ``n - 1`` of this ``incarnation`` and
    applies this one holds what the engine holds; a gap in ``n`` or another incarnation calls for a ``history.request``.
    A point is ``[series index, step, tokens, flop, wall, value]``; an axis the engine did not know is NaN (``null`` in
    JSON)."""

    incarnation: str  # one engine process's life: a restarted engine starts a new one and counts ``n`` from 1
    n: int
    through_seq: int | None = None  # the last hub sequence number the history reflects
    series: list[str] = []  # the names the points refer to, by index
    points: list[tuple[int, float, float, float, float, float]] = []


class HistoryRequest(Record, tag="history.request", kw_only=True):
    """A dashboard asks the engine for its whole history: when it starts, and after a gap or a new incarnation."""

    reason: str = ""


class HistorySync(Record, tag="history.sync", kw_only=True):
    """The engine's answer to a ``history.request``: its checkpoint (``checkpoint``, a file in the run directory, which
    the engine alone writes) now holds its whole history up to delta ``n`` of ``incarnation``, and the last snapshot
    it published. The file may already be newer when it is read: it says itself which delta it reflects."""

    incarnation: str
    n: int
    checkpoint: str
    through_seq: int | None = None


class Alert(Record, tag="alert", kw_only=True):
    """A rule fired or cleared. ``numbers`` are what tripped it."""

    rule: str
    state: Literal["fired", "cleared"]
    severity: Severity = "warning"
    message: str
    numbers: dict[str, float] = {}
    subject: str | None = None  # a GPU uuid, a rank, a path
    episode: int = 1
    since_t: float | None = None


# --------------------------------------------------------------------------------------------------------------------
# tm itself


class Component(Record, tag="component", kw_only=True):
    """Supervision of tm's own component processes."""

    name: str
    event: Literal["started", "crashed", "restarted", "stopped", "gave_up", "error"]
    process: str  # the placement: "components" or the component's own process name
    child_pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    restarts: int = 0
    backoff_s: float | None = None
    error: str | None = None


class BusStats(Record, tag="bus.stats", kw_only=True):
    """The hub's counters, cumulative since the start of the run."""

    received: int
    published: int
    malformed: int
    unknown: int
    dropped: dict[str, int] = {}  # per producer "source@host:pid", as last reported by that producer
    dropped_total: int = 0
    flushed_seq: int | None = None
    log_bytes: int = 0
    log_segments: int = 0
    log_queue_dropped: int = 0  # records the recorder could not take (its queue was full)
    log_reserve_active: bool = (
        False  # below the free-space reserve: only run.*, step, fact, alert are written
    )
    log_reserve_skipped: int = 0
    final: bool = False


AnyRecord = (
    RunStart
    | RunEnd
    | Hello
    | Bye
    | Fact
    | Step
    | Metric
    | Phase
    | Notice
    | Tick
    | NodeEvent
    | ClockMap
    | SampleGpu
    | SampleHost
    | SampleNode
    | Snapshot
    | HistoryDelta
    | HistoryRequest
    | HistorySync
    | Alert
    | Component
    | BusStats
    | ProfileImport
)

#: Kinds the hub publishes but never writes: the engine's snapshots and history deltas, which replay recomputes, and the
#: dashboard's requests for a whole history with their answers. They pass even after ``run.end`` (the final snapshot and
#: its last history come after it), and a reader handing over from the log to the bus never takes one for the first
#: record it received live (they are not in the log to hand over from).
DERIVED_KINDS = frozenset({"snapshot", "history", "history.request", "history.sync"})

#: kind -> Struct class
KINDS: dict[str, type[Record]] = {cls.__struct_config__.tag: cls for cls in AnyRecord.__args__}  # type: ignore[attr-defined]
#: kind -> the field names a record of that kind may carry (the tag included)
FIELDS: dict[str, frozenset[str]] = {k: frozenset(c.__struct_fields__) | {"kind"} for k, c in KINDS.items()}

#: Kinds whose dict-of-float fields may hold NaN or infinity, which JSON cannot carry as numbers.
_NONFINITE_FIELDS: dict[str, tuple[str, ...]] = {"metric": ("values",), "alert": ("numbers",)}
_NONFINITE_TEXT = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
#: Kinds with fields typed ``Any`` (Fact.value, ExplainInput.value): they may hold map keys JSON cannot carry.
_ANY_VALUED_KINDS = frozenset({"fact", "snapshot"})


class Unknown(msgspec.Struct, kw_only=True):
    """A record of a kind this version does not know (from a newer writer): kept verbatim, counted, never fatal."""

    kind: str
    data: dict[str, Any]
    seq: int | None = None


class MalformedRecord(ValueError):
    """Bytes that are not a record: counted and dropped by whoever reads them."""


# --------------------------------------------------------------------------------------------------------------------
# Codecs


def _reject_ext(code: int, data: memoryview) -> Any:
    # No record carries a MessagePack extension, and the JSON log could not hold one.
    raise ValueError(f"MessagePack extension type {code}")


_msgpack_encoder = msgspec.msgpack.Encoder()
_msgpack_any = msgspec.msgpack.Decoder(ext_hook=_reject_ext)
_json_encoder = msgspec.json.Encoder()
_json_any = msgspec.json.Decoder()
_json_typed = msgspec.json.Decoder(AnyRecord)
_typed_msgpack = {kind: msgspec.msgpack.Decoder(cls) for kind, cls in KINDS.items()}


def encode(record: Record) -> bytes:
    """The wire form: MessagePack of one record."""
    return _msgpack_encoder.encode(record)


def encode_many(records: list[Record]) -> bytes:
    """A batch on the wire: a MessagePack array of records (the hub splits it without re-encoding)."""
    return _msgpack_encoder.encode(records)


def topic(kind: str) -> bytes:
    return kind.encode("ascii")


class Checked(msgspec.Struct):
    """What ``check`` learned of one payload: the raw mapping, its kind, whether the kind or a field is unknown."""

    kind: str
    data: dict[str, Any]
    unknown: bool


def check(payload: bytes) -> Checked:
    """Validate one wire payload, keeping fields and kinds this version does not know.

    Raises MalformedRecord for bytes that are not a mapping with a string ``kind``, or that break the schema of a known
    kind. An unknown kind, or a known kind carrying extra fields, is valid and flagged ``unknown``.
    """
    try:
        data = _msgpack_any.decode(payload)
    # ValueError: msgspec raises it for some truncated inputs (and _reject_ext); RecursionError: absurd nesting
    except (msgspec.DecodeError, ValueError, RecursionError) as exc:
        raise MalformedRecord(f"not MessagePack: {exc}") from None
    if not isinstance(data, dict):
        raise MalformedRecord(f"not a mapping but {type(data).__name__}")
    kind = data.get("kind")
    if not isinstance(kind, str):
        raise MalformedRecord("no string 'kind'")
    decoder = _typed_msgpack.get(kind)
    if decoder is None:
        _require_loggable(kind, data)
        return Checked(kind, data, True)
    try:
        decoder.decode(payload)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
        raise MalformedRecord(f"{kind}: {exc}") from None
    unknown = not FIELDS[kind].issuperset(data)
    if unknown or kind in _ANY_VALUED_KINDS:
        _require_loggable(kind, data)
    return Checked(kind, data, unknown)


_msgpack_any_list = msgspec.msgpack.Decoder(list, ext_hook=_reject_ext)
_typed_union_list = msgspec.msgpack.Decoder(list[AnyRecord], ext_hook=_reject_ext)  # type: ignore[valid-type]


def check_batch(payload: bytes) -> list[Checked] | None:
    """``check`` of every record of a producer's batch (a MessagePack array of records), in two decodes of the whole
    array instead of two per record; None when any record is not a valid record of a known kind, for the caller to check
    them one by one (so that the bad one is counted alone and the others pass)."""
    try:
        items = _msgpack_any_list.decode(payload)
        # The schema of each record's kind, found by its tag: what check's typed decode of each does.
        _typed_union_list.decode(payload)
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError, RecursionError):
        return None
    checked = []
    for data in items:
        if not isinstance(data, dict):
            return None
        kind = data.get("kind")
        if kind not in FIELDS:
            return None  # not the tag the typed decode checked (msgspec refuses a second, other "kind" today)
        unknown = not FIELDS[kind].issuperset(data)
        if unknown or kind in _ANY_VALUED_KINDS:
            try:
                _require_loggable(kind, data)
            except MalformedRecord:
                return None
        checked.append(Checked(kind, data, unknown))
    return checked


def _require_loggable(kind: str, data: dict[str, Any]) -> None:
    # What the schema leaves untyped (unknown kinds and fields, Any) may hold map keys the JSON log cannot: such a
    # record would stop the recorder, so it is malformed here. Typed fields cannot, so the hot path skips this.
    try:
        _json_encoder.encode(data)
    except (TypeError, ValueError, RecursionError, msgspec.EncodeError) as exc:
        raise MalformedRecord(f"{kind}: not loggable: {exc}") from None


def decode(payload: bytes) -> Record | Unknown:
    """Decode one wire payload into its Struct, or Unknown for a kind this version does not know."""
    checked = check(payload)
    if checked.kind not in KINDS:
        return Unknown(kind=checked.kind, data=checked.data)
    return _typed_msgpack[checked.kind].decode(payload)


_typed_union_msgpack = msgspec.msgpack.Decoder(AnyRecord, ext_hook=_reject_ext)  # type: ignore[valid-type]


def decode_published(payload: bytes) -> Record | Unknown:
    """``decode`` for what the hub published, which it checked as it took it in: one typed decode of the union by the
    ``kind`` tag; what that refuses (a kind this version does not know, a malformed record) takes ``decode``."""
    try:
        return _typed_union_msgpack.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError):
        return decode(payload)


def split_batch(payload: bytes) -> list[msgspec.Raw]:
    """The raw bytes of each record in a batch, without decoding them."""
    try:
        items = msgspec.msgpack.decode(payload, type=list[msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        raise MalformedRecord(f"batch: {exc}") from None
    return items


def to_log_line(data: dict[str, Any]) -> bytes:
    """One JSON line of the run log from a checked mapping (which keeps unknown fields verbatim)."""
    fields = _NONFINITE_FIELDS.get(data.get("kind", ""))
    if fields:
        for field in fields:
            values = data.get(field)
            if isinstance(values, dict):
                for key, value in values.items():
                    if isinstance(value, float) and not math.isfinite(value):
                        values[key] = (
                            "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
                        )
    return _json_encoder.encode(data) + b"\n"


def from_log_line(line: bytes | str) -> Record | Unknown:
    """Decode one line of the run log. Raises MalformedRecord for anything that is not a valid record."""
    # Fast path: a typed decode of the union. Anything it refuses (an unknown kind, a non-finite float written as
    # text, or a line that is really malformed) takes the careful path below, which decides.
    try:
        return _json_typed.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, ValueError, RecursionError):
        pass
    try:
        data = _json_any.decode(line)
    except (msgspec.DecodeError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedRecord(f"not JSON: {exc}") from None
    return from_mapping(data)


def from_mapping(data: Any) -> Record | Unknown:
    """A record from a plain mapping (a decoded JSON line), restoring non-finite floats."""
    if not isinstance(data, dict):
        raise MalformedRecord(f"not a mapping but {type(data).__name__}")
    kind = data.get("kind")
    if not isinstance(kind, str):
        raise MalformedRecord("no string 'kind'")
    cls = KINDS.get(kind)
    if cls is None:
        seq = data.get("seq")
        return Unknown(kind=kind, data=data, seq=seq if isinstance(seq, int) else None)
    for field in _NONFINITE_FIELDS.get(kind, ()):
        values = data.get(field)
        if isinstance(values, dict):
            for key, value in values.items():
                if isinstance(value, str) and value in _NONFINITE_TEXT:
                    values[key] = _NONFINITE_TEXT[value]
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as exc:
        raise MalformedRecord(f"{kind}: {exc}") from None


def to_builtins(record: Record | Unknown) -> dict[str, Any]:
    """A record as plain Python data (for JSON output by tools); keeps the kind."""
    if isinstance(record, Unknown):
        return dict(record.data)
    return msgspec.to_builtins(record)


def kind_of(record: Record | Unknown) -> str:
    """The kind of a record (the tag), for Structs and Unknown alike."""
    if isinstance(record, Unknown):
        return record.kind
    return record.__struct_config__.tag


def producer_key(source: str, host: str, pid: int) -> str:
    """How bus.stats names a producer."""
    return f"{source}@{host}:{pid}"
