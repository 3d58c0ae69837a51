"""A block of a rank that is not the step clock's (a job's ranks but one a node, a single node's ranks but rank 0),
its loss read at ``backward()``: taken from its columns, with a record built only for a metric the loop emitted and for
a step that is not a steady one of a known rank. The state ends exactly as the block's rows fed one by one leave it
(``tests/unit/test_engine_blocks.py``). Pure: no I/O, no clock.

What such a rank's rows do, and so all this does: its loss from backward() changes nothing (``Engine._on_metric`` keeps
the clock's rank's only); a data wait adds to its rank's wait since its last step (``time_split.take_phase``); a step
moves the rank's own counts and averages, its host's span of steps (``steps.take_step`` up to the clock's part) and
its series of step times (``Engine._on_step``); on a job every row counts towards its node's latest record and every
step is marked for the straggler (``nodes.arrive``), each time on the hub's clock as ``nodes.map_clock`` moves it.
"""

from __future__ import annotations

from collections.abc import Callable

from trainmeter_core.model import records
from trainmeter_core.model.engine import nodes
from trainmeter_core.model.engine.derived import Derived
from trainmeter_core.model.engine.state import EngineState
from trainmeter_core.model.formulas import EMA_ALPHA
from trainmeter_core.model.history import History

_INF = float("inf")
_DATA_WAIT = "data_wait"


def takes(state: EngineState, block: records.Block) -> bool:
    """Whether ``take`` is for this block: the clock's rank is known and is not the block's, its loss was read at
    backward(), and the run has started on the hub's clock (an attempt on another clock goes through ``feed``)."""
    clock = state.clock_rank
    return (
        clock is not None
        and (block.rank or 0) != clock
        and block.loss_origin == "backward"
        and not state.resume.t_offset
        and state.start_t is not None
    )


def take(
    state: EngineState,
    derived: Derived,
    history: History,
    keeps: bool,
    block: records.Block,
    series: str,
    on_step: Callable[[records.Step], object],
    on_metric: Callable[[records.Metric], object],
) -> None:
    """The block's rows into the state (``takes`` said yes, ``records.block.validate`` passed): ``series`` is the
    rank's series of step times, ``on_step`` and ``on_metric`` the engine's handlers for the rows built here."""
    node = state.nodes.get(block.host) if state.nodes else None
    offset = node.offset_s if node is not None else None
    last_t = node.last_t if node is not None else None
    job = bool(state.nodes)
    host = block.host
    rank_id = block.rank or 0
    rank = state.ranks.get(rank_id)
    resumed_t = state.resume.attempt_start_t
    letters: records.block.Letters | None = None
    order, loss, loss_t = block.order, block.loss, block.loss_t
    step_col, step_t, step_time_s = block.step, block.step_t, block.step_time_s
    phase, starts, ends = block.phase, block.phase_start_t, block.phase_end_t
    shift = block.wall - block.t  # a row's wall time: its own t (unmoved) on the wall clock
    seq = None if block.seq is None else block.seq - block.rows
    mark_step = nodes.mark_step
    alpha = EMA_ALPHA
    # The rank's step-time points, added to its series in one go (``History.add_points``) before any point of another
    # series (a metric row's), before a step taken by its handler, and at the end: each series' points and the order
    # the series first appear stay as the rows one by one leave them.
    x: tuple[float, float, float] | None = None
    x_step: list[float] = []
    x_tokens: list[float] = []
    x_flop: list[float] = []
    walls: list[float] = []
    values: list[float] = []

    # And its steady steps' marks for the straggler, put in before any row its handler takes (a rank's first step or
    # collectives row adds to the ranks a host counts) and at the end
    marked_steps: list[int] = []
    marked_t: list[float] = []

    def flush() -> None:
        if marked_steps:
            nodes.mark_steps(state, host, rank_id, marked_steps, marked_t)
            marked_steps.clear()
            marked_t.clear()
        if values:
            history.add_points(series, x_step, x_tokens, x_flop, walls, values)
            for column in (x_step, x_tokens, x_flop, walls, values):
                column.clear()

    s = p = m = 0
    for at, letter in enumerate(order):
        before = seq
        if letter == "s":
            has_loss = loss[s] is not None
            if seq is not None:
                seq += 2 if has_loss else 1
            if node is not None and has_loss:
                t = loss_t[s]
                if t and offset is not None:
                    t += offset
                if t and (last_t is None or t > last_t):
                    last_t = t
            t = raw_t = step_t[s]
            if t and offset is not None:
                t += offset
            if node is not None and t and (last_t is None or t > last_t):
                last_t = t
            interval = step_time_s[s]
            span = state.step_spans.get(host)
            if (
                rank is not None
                and interval is not None
                and rank.last_t is not None
                and (resumed_t is None or not rank.last_t < resumed_t)
                and span is not None
                and (span.gap_from is None or not t > span.last_t)
            ):
                # A steady step of a known rank: steps.take_step's part for a rank not the clock's, written out
                if seq is not None:
                    state.through_seq = seq
                step = step_col[s]
                if job:
                    marked_steps.append(step)
                    marked_t.append(t)
                rank.steps += 1
                rank.last_t = t
                rank.last_step = step
                waited = rank.data_wait_open_s
                if waited is not None:
                    previous = rank.data_wait_ema_s
                    rank.data_wait_ema_s = (
                        waited if previous is None else previous + alpha * (waited - previous)
                    )
                    rank.data_wait_open_s = 0.0
                if t > span.last_t:
                    span.last_t = t
                if 0.0 < interval < _INF:
                    previous = rank.step_time_ema_s
                    rank.step_time_ema_s = (
                        float(interval) if previous is None else previous + alpha * (interval - previous)
                    )
                    if keeps:
                        if x is None:
                            x = derived.x()  # the clock's counts: no row of another rank moves them
                        x_step.append(x[0])
                        x_tokens.append(x[1])
                        x_flop.append(x[2])
                        walls.append(raw_t + shift)
                        values.append(interval)
                s += 1
                continue
            # Any other step (the rank's first, its first of a resumed attempt, a span reopened) by its handler
            if letters is None:
                letters = records.block.Letters(block)
            row = letters.rows(at, s, p, m, before)[-1]  # its loss, when it has one, changes nothing
            s += 1
        elif letter == "p":
            if seq is not None:
                seq += 1
                state.through_seq = seq
            start, end = starts[p], ends[p]
            t = end  # a phase's time is its end
            if offset is not None:
                start, end = start + offset, end + offset
                if t:
                    t += offset
            if node is not None and t and (last_t is None or t > last_t):
                last_t = t
            if phase[p] == _DATA_WAIT and rank is not None:  # time_split._rank_data_wait
                waited = end - start
                if 0.0 <= waited < _INF:
                    rank.data_wait_open_s = (rank.data_wait_open_s or 0.0) + waited
            p += 1
            continue
        else:
            if letters is None:
                letters = records.block.Letters(block)
            (row,) = letters.rows(at, s, p, m, before)
            if seq is not None:
                seq += 1
            m += 1
        # A row built: moved onto the hub's clock in place (nodes.arrive_rows: built here, held by no one else)
        if offset is not None and row.t:
            row.t += offset
        if node is not None and row.t and (last_t is None or row.t > last_t):
            last_t = row.t
        if seq is not None:
            state.through_seq = seq
        flush()
        if letter == "s":
            if job:
                mark_step(state, host, rank_id, row.step, row.t)
            on_step(row)
        else:
            on_metric(row)
            x = None  # asked again at the next step
        rank = state.ranks.get(rank_id)  # a rank's first step (or its collectives' row) makes its state
    flush()
    if node is not None:
        node.last_t = last_t
