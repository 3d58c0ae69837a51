"""A block's steady rows into the engine's state in one pass: the step clock's steps with the loss read at
``backward()`` before each, its data waits and the collective probe's rows after each step (a data-parallel loop's),
without building a record for any of them. The state ends exactly as the row path leaves it (``take_step``,
``take_phase`` and ``Engine._on_metric`` fed each row in order: the same operations on the same floats in the same
order, bytes equal; ``tests/unit/test_engine_block_take.py`` holds it to that over runs of every shape it takes).
Pure: no I/O, no clock.

It takes a run of letters only when the state is the steady one these rows meet in a running loop: a run on the hub's
clock (no job, no other attempt's clock), past the step clock's first step of its attempt, the block's rank being rank
0 and the clock, no hang open, the loss's series neither emitted nor tapped by the loop. The engine feeds every other
row, and every row of another state, by its handler (``eligible``, ``steady`` and ``fast_stop`` say which)."""

from __future__ import annotations

import math

from trainmeter_core.model import records
from trainmeter_core.model.catalog import canonical
from trainmeter_core.model.engine import block_columns
from trainmeter_core.model.engine.attempts import MARKS_KEPT_MAX, RECENT_MARKS
from trainmeter_core.model.engine.collectives import ORIGIN as _COLLECTIVES
from trainmeter_core.model.engine.collectives import take_rank_values
from trainmeter_core.model.engine.derived import MAX_TOKENS_PER_STEP, Derived
from trainmeter_core.model.engine.state import STEP_WINDOW, EngineState, PendingPoint
from trainmeter_core.model.formulas import EMA_ALPHA
from trainmeter_core.model.history import History

_INF = math.inf
_NAN = math.nan
_LOSS, _BACKWARD, _DATA_WAIT = block_columns.LOSS, block_columns.BACKWARD, block_columns.DATA_WAIT
_RANK_0_STEP_TIME = block_columns.RANK_0_STEP_TIME
#: The loss's key names its own series whatever else the loop reports (``Engine._on_metric`` looks it up each time).
_LOSS_IS_ITS_SERIES = canonical(_LOSS, False) == canonical(_LOSS, True) == _LOSS


def eligible(state: EngineState, block: records.Block) -> bool:
    """Whether ``take_run`` may ever take this block's rows: rank 0's, on the hub's clock, its loss read at backward()
    into a series the loop neither emits nor taps (what a block's own rows cannot undo)."""
    if state.nodes or state.resume.t_offset or (block.rank or 0) != 0:
        return False
    if block.loss_origin != _BACKWARD or not _LOSS_IS_ITS_SERIES:
        return False
    return _LOSS not in state.emit_series and _LOSS not in state.tapped_series


def steady(state: EngineState, derived: Derived, block: records.Block) -> bool:
    """Whether the state is one ``take_run`` takes the block's next steps and data waits in: ``eligible`` said yes, and
    since then the run has stepped on rank 0 as its clock in this attempt, no hang is open, and no loss but the loop's
    from backward() is held (the module's docstring)."""
    if state.clock_rank != 0 or not state.attempt_stepped or state.first_step_t is None:
        return False
    if state.resume.hang_from_t is not None or state.start_t is None or 0 not in state.ranks:
        return False
    if _LOSS in state.emit_series or _LOSS in state.tapped_series:
        return False  # a metric row of this block made it the loop's own
    span = state.step_spans.get(block.host)
    if span is None or span.gap_from is not None:
        return False
    pending = state.pending_backward
    if pending and (len(pending) > 1 or _LOSS not in pending):
        return False
    if derived.facts_version != state.facts.version:
        derived.refresh()
    return True


def fast_stop(block: records.Block, start: int, p: int, m: int) -> tuple[int, int, int]:
    """Where the run of letters ``take_run`` takes, from letter ``start`` (its phases from ``p``, its metrics from
    ``m``), ends: the first metric other than the collective probe's or phase other than a data wait, or the end;
    returns (that letter's index, the phases before it, the metrics before it)."""
    order = block.order
    phases, origins = block.phase, block.metric_origin
    end = len(order)
    if phases.count(_DATA_WAIT) == len(phases) and (
        not origins or all(origin.startswith(_COLLECTIVES) for origin in origins)
    ):
        # A steady loop's block: every phase is a data wait, every metric (if any) the collective probe's
        return end, len(phases), len(origins)
    at = start
    while at < end:
        letter = order[at]
        if letter == "p":
            if phases[p] != _DATA_WAIT:
                break
            p += 1
        elif letter == "m":
            if not origins[m].startswith(_COLLECTIVES):
                break
            m += 1
        at += 1
    return at, p, m


def take_run(
    state: EngineState,
    derived: Derived,
    history: History,
    keeps: bool,
    block: records.Block,
    start: int,
    stop: int,
    s: int,
    p: int,
    m: int,
) -> None:
    """Letters ``start`` to ``stop`` of the block (steps, their losses, data waits and the collective probe's rows
    alone; its steps from column index ``s``, its phases from ``p``, its metrics from ``m``) into the state, as their
    rows fed one by one would leave it.

    ``steady`` said yes for this state and block. Every value the rows change is held in a local while they run and
    stored once at the end (a store into a msgspec Struct costs 40 ns, and the row path makes about forty a step). A
    list whose tail alone is kept (the recent intervals and rates, the resume marks) is cut once at the end, to the
    tail its cuts one by one would have left.

    A steady loop's run (data waits and steps in turn, each step with its loss and perhaps the collective probe's
    row, every value an ordinary one) is taken column by column instead (``block_columns.take_alternating``), to the same state."""
    if block_columns.take_alternating(state, derived, history, keeps, block, start, stop, s, p, m):
        return
    steps_col, step_t_col, step_time_col, tokens_col = (
        block.step,
        block.step_t,
        block.step_time_s,
        block.tokens,
    )
    loss_col, loss_t_col = block.loss, block.loss_t
    metric_origin_col, metric_values_col, metric_step_col = (
        block.metric_origin,
        block.metric_values,
        block.metric_step,
    )
    phase_start_col, phase_end_col = block.phase_start_t, block.phase_end_t
    dp = block.dp
    counted = block.tokens_absent is None  # else no step here has a token count (and the column is empty)
    shift = block.wall - block.t  # a row's wall: its t on the wall clock (records.block.expand)
    alpha = EMA_ALPHA
    inf = _INF
    most_tokens = MAX_TOKENS_PER_STEP

    rank = state.ranks[0]
    resume = state.resume
    span = state.step_spans[block.host]
    attempt = state.attempts[-1] if state.attempts else None
    first_t: float = state.first_step_t  # type: ignore[assignment]  # steady() said it is not None
    # take_phase's and attempts.phase's "the attempt's first step" (the run's where no attempt was opened): not None,
    # as the attempt stepped
    attempt_first_t: float = attempt.first_step_t if attempt is not None else first_t  # type: ignore[assignment]

    # The facts' values for this block (facts come in records of their own, never inside a block)
    declared = derived.declared_tokens_per_step
    other_tokens = derived.other_tokens_per_step
    x_flop = derived.x_flop_per_token

    # The rank's values
    rank_steps, rank_last_t = rank.steps, rank.last_t  # and its last step: the run's (below), as both are set
    wait_open, wait_ema, step_ema = rank.data_wait_open_s, rank.data_wait_ema_s, rank.step_time_ema_s
    span_last_t = span.last_t
    # The step clock's
    steps, last_step = state.steps, state.last_step
    window_tokens, window_no_tokens = state.window_tokens, state.window_steps_without_tokens
    tokens_ema, interval_ema = state.tokens_ema, state.interval_ema_s
    last_step_t: float = state.last_step_t  # type: ignore[assignment]  # the run stepped
    tokens_seen, with_tokens = state.tokens_seen, state.steps_with_tokens
    last_tokens, last_source, mismatch = (
        state.last_tokens_per_step,
        state.last_tokens_source,
        state.tokens_mismatch,
    )
    recent, rates = state.recent_intervals_s, state.recent_rates
    marks = resume.marks
    stepping_s, stepping_phase_s, stepping_wait_s = (
        resume.stepping_s,
        resume.stepping_phase_s,
        resume.stepping_wait_s,
    )
    phase_after_step_s, wait_after_step_s = resume.phase_after_step_s, resume.wait_after_step_s
    # The data waits' entries of the state's maps (None: no entry), and whether the map of phases after the last step
    # holds another phase's (a step empties it: ``cleared``)
    waits = 0
    wait_s = state.phase_s.get(_DATA_WAIT)
    after_last = state.phase_after_last_s
    after_wait = after_last.get(_DATA_WAIT)
    after_others = len(after_last) > (after_wait is not None)
    cleared = False
    # The loss: its tick's inputs, and the one held until its iteration is over (the state's own PendingPoint, or the
    # parts of one of these rows, built at the end)
    loss_seen, loss_nonfinite = state.loss_seen, state.loss_nonfinite
    tick_nonfinite_step = state.loss_tick_nonfinite_step
    tick_max = (
        state.loss_tick_max if state.loss_tick_max is not None else -inf
    )  # -inf: none yet (never a finite's)
    series_point: records.SeriesPoint | None = None  # the latest committed, when it was the state's held one
    committed = False  # whether one of these rows' losses was committed after it (its parts: c_*)
    c_value = c_step = c_t = None
    held = state.pending_backward.get(_LOSS)
    holding = held is not None
    h_tokens_seen = h_with_tokens = 0
    if held is not None:
        h_value, h_step, h_t, h_wall = held.point.value, held.point.step, held.point.t, held.wall
        h_x_step, h_x_tokens, h_x_flop = held.x_step, held.x_tokens, held.x_flop
    else:
        h_value = h_t = h_wall = h_x_step = h_x_tokens = h_x_flop = 0.0
        h_step = None
    # The history's points of these rows, by series and axis, added in one go at the end (History.add_points): the
    # loss's and rank 0's step time's, the series that got its first point first (its place in the history's map)
    loss_x, loss_tokens, loss_flop, loss_wall, loss_value = [], [], [], [], []  # type: ignore[var-annotated]
    step_x, step_tokens, step_flop, step_wall, step_value = [], [], [], [], []  # type: ignore[var-annotated]
    loss_first: bool | None = None
    stepped = False

    for letter in block.order[start:stop]:
        if letter == "m":
            # The collective probe's row of a step (Engine._on_metric): its figures into the rank's own state, whose
            # fields of the collectives this pass holds none of; a group's row (origin "collectives:<group>") stays
            # in the log alone
            if metric_origin_col[m] == _COLLECTIVES:
                take_rank_values(rank, metric_values_col[m], metric_step_col[m])
            m += 1
            continue
        if letter == "p":
            start_t, end_t = phase_start_col[p], phase_end_col[p]
            p += 1
            # take_phase: the rank's own data wait (_rank_data_wait), then the step clock's time split
            waited = end_t - start_t
            if 0.0 <= waited < inf:
                wait_open = (wait_open or 0.0) + waited
            waits += 1
            if not -inf < start_t <= end_t < inf:
                continue
            if start_t < end_t and start_t < attempt_first_t:
                resume.before_step_phase_s += min(end_t, attempt_first_t) - start_t
            if start_t < end_t and start_t < first_t:
                held_s = state.startup_phase_s
                held_s[_DATA_WAIT] = held_s.get(_DATA_WAIT, 0.0) + (min(end_t, first_t) - start_t)
            if end_t <= first_t:
                continue
            begin = first_t if first_t > start_t else start_t  # max(start_t, first_t), as max picks
            wait_s = (0.0 if wait_s is None else wait_s) + (end_t - begin)
            after = 0.0
            if end_t > last_step_t:
                after = end_t - (last_step_t if last_step_t > begin else begin)
                after_wait = (0.0 if after_wait is None else after_wait) + after
            # attempts.phase
            if end_t <= attempt_first_t:
                continue
            inside_s = end_t - (attempt_first_t if attempt_first_t > start_t else start_t)
            after_s = after if after < inside_s else inside_s  # min(inside_s, after), as min picks
            stepping_phase_s += inside_s
            phase_after_step_s += after_s
            stepping_wait_s += inside_s
            wait_after_step_s += after_s
            continue

        step = steps_col[s]
        loss = loss_col[s]
        if holding and (loss is not None or (h_step is not None and h_step < step)):
            # The held loss is over, and stands (Engine._commit_held and _on_loss): a loss read at backward() came
            # (Engine._on_metric), or this step is later than the held loss's (Engine._on_step)
            loss_seen = True
            if -inf < h_value < inf:
                if h_value > tick_max:
                    tick_max = h_value
            else:
                loss_nonfinite += 1
                if tick_nonfinite_step is None:
                    x_step = h_x_step if keeps or held is not None else float(h_step)  # type: ignore[arg-type]
                    tick_nonfinite_step = h_step if x_step != x_step else int(x_step)
            if held is not None:
                series_point, committed, held = held.point, False, None
            else:
                committed, c_value, c_step, c_t = True, h_value, h_step, h_t
            if keeps:
                loss_x.append(h_x_step)
                loss_tokens.append(h_x_tokens)
                loss_flop.append(h_x_flop)
                loss_wall.append(h_wall)
                loss_value.append(h_value)
                if loss_first is None:
                    loss_first = True
            holding = False
        if loss is not None:
            # This step's loss is held until its iteration is over (Engine._on_metric)
            holding = True
            h_value, h_step = loss, step
            h_t = loss_t_col[s]
            h_wall = h_t + shift
            h_tokens_seen, h_with_tokens = tokens_seen, with_tokens
            if keeps:
                h_x_step = float(step)
                if with_tokens:
                    h_x_tokens, h_x_flop = float(tokens_seen), tokens_seen * x_flop
                else:
                    h_x_tokens = h_x_flop = _NAN
            else:
                h_x_step = _NAN  # float(step), computed where it is read (the end, a non-finite loss)
        # take_step, for the step clock's rank past its attempt's first step, of a steady (not profiled) step
        t = step_t_col[s]
        interval = step_time_col[s]
        tokens = tokens_col[s] * dp if counted else None  # step_tokens: the block's tokens_global
        s += 1
        rank_steps += 1
        if wait_open is not None:
            wait_ema = wait_open if wait_ema is None else wait_ema + alpha * (wait_open - wait_ema)
            wait_open = 0.0
        if t > span_last_t:
            span_last_t = t
        if not 0.0 < interval < inf:
            interval = None
        else:
            step_ema = float(interval) if step_ema is None else step_ema + alpha * (interval - step_ema)
        if declared is not None:
            if tokens is not None and not 0 <= tokens < most_tokens:
                tokens = None
            mismatch = tokens if tokens is not None and tokens != declared else None
            tokens, last_tokens, last_source = declared, declared, "declared --tokens-per-step"
        elif tokens is not None and 0 <= tokens < most_tokens:
            last_tokens, last_source = tokens, "tokens_global"
        elif other_tokens is not None:
            tokens, last_tokens, last_source = other_tokens, other_tokens, "tokens_per_step fact"
        else:
            tokens = None
        steps += 1
        if tokens is None:
            window_no_tokens += 1
            if interval is not None:
                recent.append(interval)
            tokens_seen_now = tokens_seen
        else:
            window_tokens += tokens
            if interval is not None:
                tokens_ema = (
                    float(tokens) if tokens_ema is None else tokens_ema + alpha * (tokens - tokens_ema)
                )
                interval_ema = (
                    float(interval)
                    if interval_ema is None
                    else interval_ema + alpha * (interval - interval_ema)
                )
                recent.append(interval)
                rates.append(tokens / interval)
            tokens_seen_now = tokens_seen = tokens_seen + tokens
            with_tokens += 1
        stepping_s = stepping_s + (t - last_step_t)
        last_step_t = t
        if phase_after_step_s:
            phase_after_step_s = wait_after_step_s = 0.0
        marks.append(
            (step, t, steps, tokens_seen_now, with_tokens, stepping_s, stepping_phase_s, stepping_wait_s)
        )
        if after_others or after_wait is not None:
            after_others, after_wait, cleared = False, None, True
        if keeps and interval is not None:
            step_x.append(float(step))
            if with_tokens:
                step_tokens.append(float(tokens_seen))
                step_flop.append(tokens_seen * x_flop)
            else:
                step_tokens.append(_NAN)
                step_flop.append(_NAN)
            step_wall.append(t + shift)
            step_value.append(interval)
            if loss_first is None:
                loss_first = False
        rank_last_t, last_step = t, step
        stepped = True

    if loss_first is not None:
        loss_points = (_LOSS, loss_x, loss_tokens, loss_flop, loss_wall, loss_value)
        step_points = (_RANK_0_STEP_TIME, step_x, step_tokens, step_flop, step_wall, step_value)
        for points in (loss_points, step_points) if loss_first else (step_points, loss_points):
            history.add_points(*points)
    # Every value into the state, once (a field whose value did not change is not stored: see steps.step_tokens)
    if stepped:
        rank.steps, rank.last_t, rank.last_step = rank_steps, rank_last_t, last_step
        rank.step_time_ema_s = step_ema
        span.last_t = span_last_t
        state.steps, state.last_step = steps, last_step
        state.window_tokens, state.window_steps_without_tokens = window_tokens, window_no_tokens
        state.tokens_ema, state.interval_ema_s = tokens_ema, interval_ema
        state.last_step_t, state.last_step_wall = last_step_t, last_step_t + shift  # its wall, as a row's
        state.tokens_seen, state.steps_with_tokens = tokens_seen, with_tokens
        if state.dp_assumed:
            state.dp_assumed = False
        if state.tokens_mismatch != mismatch:
            state.tokens_mismatch = mismatch
        if state.last_tokens_per_step != last_tokens:
            state.last_tokens_per_step = last_tokens
        if state.last_tokens_source != last_source:
            state.last_tokens_source = last_source
        resume.stepping_s = stepping_s
        # The lists cut to the tails their cuts one by one leave: the latest STEP_WINDOW, and of the marks the
        # latest RECENT_MARKS plus those since the last time they reached MARKS_KEPT_MAX
        if len(recent) > STEP_WINDOW:
            del recent[:-STEP_WINDOW]
        if len(rates) > STEP_WINDOW:
            del rates[:-STEP_WINDOW]
        if len(marks) >= MARKS_KEPT_MAX:
            kept = RECENT_MARKS + (len(marks) - MARKS_KEPT_MAX) % RECENT_MARKS
            del marks[:-kept]
    rank.data_wait_open_s, rank.data_wait_ema_s = wait_open, wait_ema
    resume.stepping_phase_s, resume.stepping_wait_s = stepping_phase_s, stepping_wait_s
    resume.phase_after_step_s, resume.wait_after_step_s = phase_after_step_s, wait_after_step_s
    if waits:
        phases_seen = state.phases_seen
        phases_seen[_DATA_WAIT] = phases_seen.get(_DATA_WAIT, 0) + waits
        if wait_s is not None:
            state.phase_s[_DATA_WAIT] = wait_s
    if cleared:
        state.phase_after_last_s = {} if after_wait is None else {_DATA_WAIT: after_wait}
    elif after_wait is not None:
        after_last[_DATA_WAIT] = after_wait
    state.loss_seen, state.loss_nonfinite = loss_seen, loss_nonfinite
    state.loss_tick_nonfinite_step = tick_nonfinite_step
    state.loss_tick_max = tick_max if tick_max != -inf else None
    if committed:
        state.series[_LOSS] = records.SeriesPoint(
            canonical=_LOSS, raw_key=_LOSS, value=c_value, step=c_step, t=c_t, origin=_BACKWARD
        )
    elif series_point is not None:
        state.series[_LOSS] = series_point
    pending = state.pending_backward
    if not holding:
        pending.pop(_LOSS, None)
    elif held is None:
        # One of these rows' losses is held: the x values it arrived at (Engine._on_metric)
        if h_with_tokens:
            x_tokens, x_flop_at = float(h_tokens_seen), h_tokens_seen * x_flop
        else:
            x_tokens = x_flop_at = _NAN
        pending.pop(
            _LOSS, None
        )  # the state's held one was committed: the new one goes in after it, as a row's
        pending[_LOSS] = PendingPoint(
            point=records.SeriesPoint(
                canonical=_LOSS, raw_key=_LOSS, value=h_value, step=h_step, t=h_t, origin=_BACKWARD
            ),
            x_step=float(h_step),  # type: ignore[arg-type]  # a loss of these rows has its step
            x_tokens=x_tokens,
            x_flop=x_flop_at,
            wall=h_wall,
        )
