"""The records every trainmeter process exchanges: one msgspec Struct per kind, in one tagged union.

This module is the contract between processes and the only place a record kind is defined. It is pure: no I/O, no
clock. Every field of every kind is pinned here; a field that cannot be known is left out and named in ``absent``
with its reason, never filled with a zero.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import msgspec

#: Version of the record schema; a reader keeps records of a newer version and counts what it does not know.
SCHEMA_VERSION = 1
#: Version of the agent <-> launcher protocol, carried in ``hello``.
PROTOCOL_VERSION = 1

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

    v: int = SCHEMA_VERSION
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


class RunStart(Record, tag="run.start", kw_only=True):
    """Written first by the launcher, once the hub is bound and the child started."""

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
    agent_us: float | None = None  # the agent's own time spent in this iteration


class Metric(Record, tag="metric", kw_only=True):
    """Numbers the loop reported, by ``emit()`` or a tracker tap, under the raw keys the loop used."""

    values: dict[str, float]
    step: int | None = None  # the loop's own step if it gave one, else the agent's iteration count
    origin: str = "emit"  # "emit", "wandb", "tensorboard", "tensorboardx", "mlflow", ...


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
    facts: dict[str, Fact] = {}
    warnings: list[str] = []
    through_seq: int | None = None  # the last hub sequence number this snapshot reflects


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


class KernelStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    category: str
    count: int
    total_s: float
    flops: float | None = None
    bytes: float | None = None


class ProfileImport(Record, tag="profile.import", kw_only=True):
    """A profiler result read into the run: a dated window, labelled with the profiler that made it."""

    importer: str
    file: str
    profiler: str
    window_start_wall: float | None = None
    window_end_wall: float | None = None
    device: str | None = None
    split_s: dict[str, float] = {}  # gemm, attention, other_compute, nccl_exposed, memcpy, idle
    top_kernels: list[KernelStat] = []


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
    | SampleGpu
    | SampleHost
    | SampleNode
    | Snapshot
    | Alert
    | Component
    | BusStats
    | ProfileImport
)

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
