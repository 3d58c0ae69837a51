"""What the engine and the alert rules derive from the other records: ``snapshot`` with its parts, the history
deltas with a dashboard's request for a whole history and its answer, and ``alert``. Each kind is defined here once;
the package's face puts it in the union. Pure: no I/O, no clock.
"""

# Annotations are evaluated at import, as header.py says why.
from typing import Any, Literal

import msgspec

from trainmeter_core.model.records.header import Record
from trainmeter_core.model.records.lifetime import JobPlace
from trainmeter_core.model.records.loop import Fact
from trainmeter_core.model.records.profiles import ProfileView

Severity = Literal["info", "warning", "critical"]


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
    """The latest value of a series the loop reports. ``origin`` is the ``origin`` of the ``metric`` record it came
    from (``emit``, ``backward``, a tracker tap's name such as ``wandb``); None only in an engine checkpoint written
    before points carried it."""

    canonical: str
    raw_key: str
    value: float
    step: int | None = None
    t: float | None = None
    origin: str | None = None


class RankStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One rank in a snapshot. ``steps`` counts the steps it kept: those a resumed attempt did again count once, as in
    the snapshot's ``steps``."""

    rank: int
    host: str
    steps: int
    step_time_s: float | None = None
    device: str | None = None
    node: int | None = None  # the node rank of ``host`` in a job of several nodes
    # Per step, EMAs (docs/metrics.md, "Communication and the straggler"): its exposed wait in collectives (the
    # collective probe's), its data wait (its data_wait phases), its compute (step − both); None where unknown.
    collective_wait_s: float | None = None
    data_wait_s: float | None = None
    compute_s: float | None = None
    collective_steps: int = 0  # its steps that reported a collective wait


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


class AttemptStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One start of a run (a resumed run has several), as the engine saw it in the log.

    ``gap_s`` is the time from the previous attempt's end (its last tick or step) to this one's start (down);
    ``resumed_from`` the step its training resumed after (None for the first attempt); ``superseded_steps`` how many
    steps of earlier attempts after that step were done again, and ``superseded_s`` the time they had taken;
    ``phases_s`` its share of the run's time split (compute and the badput buckets).
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
    phases_s: dict[str, float] = {}  # this attempt's share of the time split (the gap before it is its down)


class Snapshot(Record, tag="snapshot", kw_only=True):
    """The engine's state after a ``tick`` or ``run.end``: published on the bus, never written to the run log."""

    tick: int
    final: bool = False
    # A factory, not a plain default: omit_defaults leaves a plain default out of the JSON, and a live snapshot (its
    # state the default) would then reach /api/snapshot and `tm view --json` with no state. msgspec compares only
    # plain defaults (and empty collections) with the value, so a factory's string is always written.
    state: Literal["starting", "running", "finished", "lost"] = msgspec.field(
        default_factory=lambda: "running"
    )
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
    The engine sends a series' points as one run, ``[series index, steps, tokens, flops, walls, values]``: columns of
    one length, in the order it added them, the runs in the order their series first gained a point. A point of
    ``points`` is ``[series index, step, tokens, flop, wall, value]``, as an engine before the runs sent every point; a
    replica applies ``points`` first, then ``runs``. An axis the engine did not know is NaN (``null`` in JSON).
    ``complete`` is false while the engine keeps no journal of its points (nobody has asked for its history since it
    started): such a delta only numbers the tick, and a replica must ask for the whole history."""

    incarnation: str  # one engine process's life: a restarted engine starts a new one and counts ``n`` from 1
    n: int
    complete: bool = True  # false: not every point added since the previous delta is in it
    through_seq: int | None = None  # the last hub sequence number the history reflects
    series: list[str] = []  # the names the points refer to, by index
    points: list[tuple[int, float, float, float, float, float]] = []
    runs: list[tuple[int, list[float], list[float], list[float], list[float], list[float]]] = []


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
    attachments: dict[
        str, str
    ] = {}  # texts kept with a fired alert: a hang's stacks of every rank, by "rank K stacks"


#: Kinds the hub publishes but never writes: the engine's snapshots and history deltas, which replay recomputes, and the
#: dashboard's requests for a whole history with their answers. They pass even after ``run.end`` (the final snapshot and
#: its last history come after it), and a reader handing over from the log to the bus never takes one for the first
#: record it received live (they are not in the log to hand over from).
DERIVED_KINDS = frozenset({"snapshot", "history", "history.request", "history.sync"})
