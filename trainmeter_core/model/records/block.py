"""The ``block``: many of one training process's ``step``, ``metric`` and ``phase`` records in one record, as columns
of numbers. The agent fills the columns as its loop runs and sends one block per flush; the hub numbers a block as the
records it stands for (its ``seq`` is the last of them, ``rows`` says how many), the run log holds it as one line, and
whoever reads ``step``, ``metric`` or ``phase`` records gets them from ``expand``, exactly as if the agent had sent
each. Pure: no I/O, no clock.

The columns, one entry per row of their kind; ``order`` says how the rows interleave, one letter per row in the order
they happened: ``s`` a step (preceded, when its ``loss`` entry is not None, by the ``train_loss`` metric the loop
passed to ``backward()``, which is then one more record), ``p`` a phase, ``m`` a metric. What every row of a kind
shares (the tokens' source, the data-parallel degree, the loss's origin) is said once for the block; a block holds
only steps that share it (the agent starts another block where it changes). So is a token count's absence: a loop
whose model sees no integer ids (a vision model, a regression) has steps without tokens, and their block says why
once (``tokens_absent``) with no ``tokens`` column, where each step record sent alone says it in its ``absent``.

Each row's ``t`` is its own time; its ``wall`` is that time carried onto the wall clock by the block's own ``t`` and
``wall`` (the two clocks read together when the block left), as a record built by the agent would have had it.
"""

# Annotations are evaluated at import, as header.py says why.
import math
from typing import Any

import msgspec

from trainmeter_core.model.records.codec import MalformedRecord
from trainmeter_core.model.records.header import Record
from trainmeter_core.model.records.loop import Metric, Phase, PhaseName, Step, TokenSource

#: The kinds a block's rows may be: who asks for any of them reads blocks too.
ROW_KINDS = frozenset({"step", "metric", "phase"})
#: The letters of ``order``.
STEP, PHASE, METRIC = "s", "p", "m"
#: A metric's default origin, the very object: msgspec leaves a field out of what it writes when it holds its default
#: by identity, so a row whose origin equals it takes it, and is written as the record sent alone was (no "origin").
_DEFAULT_ORIGIN = Metric(values={}).origin
#: A record with some fields replaced: each row is a copy of its kind's prototype (``expand``). Every mutable field is
#: replaced, so that no two rows share one.
_copy = msgspec.structs.replace


class Block(Record, tag="block", kw_only=True):
    """Steps, losses, phases and metrics of one producer, as columns (the module's docstring says how they read).

    ``rows`` is the number of records the block stands for; they are numbered ``seq - rows + 1`` to ``seq``.
    """

    rows: int
    order: str
    # Steps: one entry per "s", all steady (neither skipped nor profiled, not the first of a process)
    step: list[int] = []
    step_t: list[float] = []
    step_time_s: list[float] = []
    optimizers: list[int] = []
    agent_us: list[float | None] = []
    micro_batches: list[int] = []
    tokens: list[int] = []  # empty where tokens_absent says why no step of the block has a count
    tokens_source: TokenSource | None = None
    tokens_absent: str | None = None
    dp: int | None = None
    # The loss read at backward() for each step (None: none was read there), its time, and its origin
    loss: list[float | None] = []
    loss_t: list[float | None] = []
    loss_origin: str = "backward"
    # Phases: one entry per "p"
    phase: list[PhaseName] = []
    phase_start_t: list[float] = []
    phase_end_t: list[float] = []
    phase_step: list[int | None] = []
    phase_probe: list[str] = []
    # Metrics: one entry per "m"
    metric_t: list[float] = []
    metric_values: list[dict[str, float]] = []
    metric_step: list[int | None] = []
    metric_origin: list[str] = []


def _finite(value: object) -> bool:
    return type(value) is float and math.isfinite(value) or type(value) is int


def validate(block: Block) -> None:
    """Whether the columns agree with ``order`` and ``rows`` and every time is a finite number; raises MalformedRecord,
    with one line saying what is wrong, for a block no reader could expand."""
    order = block.order
    steps, phases, metrics = order.count(STEP), order.count(PHASE), order.count(METRIC)
    if steps + phases + metrics != len(order):
        raise MalformedRecord(f"block: order holds letters other than {STEP!r}, {PHASE!r}, {METRIC!r}")
    counted = block.tokens_absent is None  # else its steps have no tokens column
    # Every column's length at once, each read by its attribute (a hub checks every block: looked up by name, the
    # eighteen cost a 10-step block 1 µs more); which one disagrees is found the slow way below
    if (
        len(block.step) == len(block.step_t) == len(block.step_time_s) == len(block.optimizers)
        == len(block.agent_us) == len(block.micro_batches) == len(block.loss) == len(block.loss_t) == steps
        and (not counted or len(block.tokens) == steps)
        and len(block.phase) == len(block.phase_start_t) == len(block.phase_end_t) == len(block.phase_step)
        == len(block.phase_probe) == phases
        and len(block.metric_t) == len(block.metric_values) == len(block.metric_step) == len(block.metric_origin)
        == metrics
    ):  # fmt: skip
        _check_shared(block, steps, counted)
        return
    columns = (
        (
            steps,
            (
                "step",
                "step_t",
                "step_time_s",
                "optimizers",
                "agent_us",
                "micro_batches",
                "tokens",
                "loss",
                "loss_t",
            ),
        ),
        (phases, ("phase", "phase_start_t", "phase_end_t", "phase_step", "phase_probe")),
        (metrics, ("metric_t", "metric_values", "metric_step", "metric_origin")),
    )
    for count, names in columns:
        for name in names:
            length = len(getattr(block, name))
            if length != count and (counted or name != "tokens"):
                raise MalformedRecord(f"block: {name} has {length} entries for {count} rows")
    _check_shared(block, steps, counted)


def _check_shared(block: Block, steps: int, counted: bool) -> None:
    """``validate``'s checks after the columns' lengths: what the block says once for its steps, its rows' count, and
    every time a finite number."""
    if steps and block.dp is None:
        raise MalformedRecord("block: steps without dp")
    if counted:
        if steps and block.tokens_source is None:
            raise MalformedRecord("block: steps without tokens_source, and no tokens_absent to say why")
    elif block.tokens or block.tokens_source is not None or not block.tokens_absent:
        raise MalformedRecord("block: tokens_absent needs a reason, no tokens and no tokens_source")
    loss, loss_t = block.loss, block.loss_t
    losses = len(loss) - loss.count(None)
    if block.rows != len(block.order) + losses:
        raise MalformedRecord(f"block: rows says {block.rows}, its columns hold {len(block.order) + losses}")
    if not _finite(block.t) or not _finite(block.wall):
        raise MalformedRecord("block: its own t or wall is not a finite number")
    for name in ("step_t", "step_time_s", "phase_start_t", "phase_end_t", "metric_t"):
        column = getattr(block, name)
        # A sum is NaN or infinite when one of its terms is (a finite sum that overflows is looked at term by term).
        if column and not math.isfinite(sum(column)) and not all(math.isfinite(x) for x in column):
            raise MalformedRecord(f"block: {name} holds a time that is not a finite number")
    if losses == len(loss) and None not in loss_t:
        # Every step has its loss and its time (a steady loop's blocks): their times looked at as the columns' above.
        if loss_t and not math.isfinite(sum(loss_t)) and not all(math.isfinite(at) for at in loss_t):
            raise MalformedRecord("block: a loss without its finite time, or a time without its loss")
        return
    for value, at in zip(loss, loss_t, strict=True):
        if (value is None) != (at is None) or (at is not None and not math.isfinite(at)):
            raise MalformedRecord("block: a loss without its finite time, or a time without its loss")


def counts(block: Block) -> dict[str, int]:
    """The records of each kind a block that ``validate`` passed stands for (a hub's per-kind counts), from its letters
    and ``rows`` alone: every row that is no letter is the loss metric read before a step."""
    order = block.order
    steps, phases = order.count(STEP), order.count(PHASE)
    return {"step": steps, "phase": phases, "metric": block.rows - steps - phases}


def expand(block: Block, kinds: frozenset[str] | set[str] | None = None, after_seq: int = 0) -> list[Record]:
    """The records the block stands for, in order, each with its own ``seq`` (when the block has one), times and the
    block's header; only those of ``kinds`` when given, and only those numbered after ``after_seq``.

    The block is taken as ``validate`` passed it (a hub checked it before numbering it): a column shorter than its
    rows raises IndexError here. Each row is a copy of one record of its kind that holds the block's header (and what
    every step of it shares), with its own fields replaced: a quarter of what building each with its header costs."""
    seq = None if block.seq is None else block.seq - block.rows
    return _build(block, _prototypes(block), 0, len(block.order), 0, 0, 0, seq, kinds, after_seq)


class Letters:
    """A block's records built a letter at a time, for a reader that takes most of its rows from the columns and needs
    records for a few (the engine: a metric the loop emitted between steps): ``rows(at, ...)`` is what ``expand``
    gives for letter ``at``, and the block's other rows are never built. The block is taken as ``validate`` passed
    it."""

    __slots__ = ("block", "_prototypes")

    def __init__(self, block: Block) -> None:
        self.block = block
        self._prototypes = _prototypes(block)

    def rows(self, at: int, s: int, p: int, m: int, seq: int | None) -> list[Record]:
        """The records of letter ``at`` (a step's loss and the step, a phase, or a metric), whose entries in the
        columns are the ``s``-th step's, the ``p``-th phase's and the ``m``-th metric's; numbered from ``seq + 1``
        (``seq`` None: the block has no sequence number)."""
        return _build(self.block, self._prototypes, at, at + 1, s, p, m, seq, None, 0)


def _prototypes(block: Block) -> tuple:
    """What every row of a kind shares: a step, a metric and a phase that hold the block's header (and what its steps
    share), the loss's origin, the shift from a row's ``t`` to its wall time, why its steps have no tokens (or None)
    and its dp."""
    header: dict[str, Any] = {"v": block.v, "source": block.source, "host": block.host, "pid": block.pid}
    if block.rank is not None:
        header["rank"] = block.rank
    if block.dropped:
        header["dropped"] = block.dropped
    loss_origin = _DEFAULT_ORIGIN if block.loss_origin == _DEFAULT_ORIGIN else block.loss_origin
    return (
        Step(step=0, tokens_source=block.tokens_source, dp=block.dp, **header),
        Metric(values={}, **header),
        Phase(phase="startup", start_t=0.0, end_t=0.0, **header),
        loss_origin,
        block.wall - block.t,  # a row's wall time: its t on the wall clock
        block.tokens_absent,  # the reason each step's record gives in its absent, or None: each has its count
        block.dp,
    )


def _build(
    block: Block,
    prototypes: tuple,
    start: int,
    stop: int,
    s: int,
    p: int,
    m: int,
    seq: int | None,
    kinds: frozenset[str] | set[str] | None,
    after_seq: int,
) -> list[Record]:
    """The records of letters ``start`` to ``stop`` (the first of them the ``s``-th step, ``p``-th phase and ``m``-th
    metric of the columns), numbered from ``seq + 1``; only those of ``kinds`` and numbered after ``after_seq``."""
    want_step = kinds is None or "step" in kinds
    want_phase = kinds is None or "phase" in kinds
    want_metric = kinds is None or "metric" in kinds
    step_proto, metric_proto, phase_proto, loss_origin, shift, no_tokens, dp = prototypes
    out: list[Record] = []
    append = out.append
    for letter in block.order[start:stop]:
        if letter == STEP:
            loss = block.loss[s]
            if loss is not None:
                if seq is not None:
                    seq += 1
                if want_metric and (seq is None or seq > after_seq):
                    loss_t = block.loss_t[s]
                    append(
                        _copy(
                            metric_proto,
                            values={"train_loss": loss},
                            step=block.step[s],
                            origin=loss_origin,
                            t=loss_t,
                            wall=loss_t + shift,
                            seq=seq,
                            absent={},
                        )
                    )
            if seq is not None:
                seq += 1
            if want_step and (seq is None or seq > after_seq):
                t = block.step_t[s]
                if no_tokens is None:
                    tokens = block.tokens[s]
                    tokens_global, absent = tokens * dp, {}
                else:
                    tokens = tokens_global = None
                    absent = {"tokens": no_tokens}
                append(
                    _copy(
                        step_proto,
                        step=block.step[s],
                        step_time_s=block.step_time_s[s],
                        optimizers=block.optimizers[s],
                        agent_us=block.agent_us[s],
                        micro_batches=block.micro_batches[s],
                        tokens=tokens,
                        tokens_global=tokens_global,
                        t=t,
                        wall=t + shift,
                        seq=seq,
                        absent=absent,
                    )
                )
            s += 1
        elif letter == PHASE:
            if seq is not None:
                seq += 1
            if want_phase and (seq is None or seq > after_seq):
                end_t = block.phase_end_t[p]
                append(
                    _copy(
                        phase_proto,
                        phase=block.phase[p],
                        start_t=block.phase_start_t[p],
                        end_t=end_t,
                        step=block.phase_step[p],
                        probe=block.phase_probe[p],
                        t=end_t,
                        wall=end_t + shift,
                        seq=seq,
                        absent={},
                        paths=[],
                    )
                )
            p += 1
        else:
            if seq is not None:
                seq += 1
            if want_metric and (seq is None or seq > after_seq):
                t = block.metric_t[m]
                origin = block.metric_origin[m]
                append(
                    _copy(
                        metric_proto,
                        values=block.metric_values[m],
                        step=block.metric_step[m],
                        origin=_DEFAULT_ORIGIN if origin == _DEFAULT_ORIGIN else origin,
                        t=t,
                        wall=t + shift,
                        seq=seq,
                        absent={},
                    )
                )
            m += 1
    return out
