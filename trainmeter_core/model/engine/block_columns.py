"""A steady loop's run of letters taken column by column: its data waits and steps alternate (``pspsps...``, with
the collective probe's row after each step in a data-parallel loop), every step has its loss read at ``backward()``,
and every value is an ordinary one (the conditions ``take_alternating`` checks). Most of a block's rows are such a run, and here each quantity the rows add to is worked out over its column
by the interpreter's own builtins (``map``, ``itertools.accumulate``, ``functools.reduce``, ``max``) and the four
moving averages by a loop of one line each, where ``block_take.take_run`` goes letter by letter through some sixty
lines a step. Pure: no I/O, no clock.

The state ends exactly as ``take_run`` (and so the rows fed one by one) leaves it: the same operations on the same
floats in the same order (``reduce`` and ``accumulate`` with ``operator.add`` add left to right, as a loop does; never
``sum``, which compensates from Python 3.12 on), and only the tails the state keeps of its lists are built (the marks
a resume reads, the recent intervals and rates). ``tests/unit/test_engine_block_columns.py`` holds it to that.
"""

from __future__ import annotations

import math
from functools import reduce
from itertools import accumulate, repeat
from operator import add, ge, gt, le, mul, sub, truediv

from trainmeter_core.model import records
from trainmeter_core.model.engine.attempts import MARKS_KEPT_MAX, RECENT_MARKS
from trainmeter_core.model.engine.collectives import ORIGIN as _COLLECTIVES
from trainmeter_core.model.engine.collectives import take_rank_values
from trainmeter_core.model.engine.derived import MAX_TOKENS_PER_STEP, Derived
from trainmeter_core.model.engine.state import STEP_WINDOW, EngineState, PendingPoint
from trainmeter_core.model.formulas import EMA_ALPHA
from trainmeter_core.model.history import History

_NAN = math.nan
#: The names a steady block's rows go under (``block_take`` reads them from here): the key the agent's loss from
#: backward() carries, its origin, the data wait's phase, and the series of rank 0's step time.
LOSS = "train_loss"
BACKWARD = "backward"
DATA_WAIT = "data_wait"
RANK_0_STEP_TIME = "tm:rank:0:step_time_s"
_isfinite = math.isfinite
#: The fewest steps a run taken here has. Below about 20 the letter-by-letter pass is cheaper: the columns' set-up
#: (a dozen lists, the history's two series) costs about 30 µs a run, against 1.5 to 2 µs a step saved (measured with
#: the engine's history kept, a learning rate emitted every 10, 20 and 40 steps cutting the runs).
MIN_STEPS = 24


def _ema(average: float | None, values, alpha: float) -> float | None:
    """The moving average after each of ``values`` in turn, as ``take_step`` moves it (the first value starts it)."""
    for value in values:
        average = float(value) if average is None else average + alpha * (value - average)
    return average


def take_alternating(
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
) -> bool:
    """Letters ``start`` to ``stop`` of the block (its steps from column index ``s``, its phases from ``p``, its
    metrics from ``m``) into the state, as ``block_take.take_run`` takes them, when they are a run this module takes
    (its docstring); False, with nothing changed, when they are not. ``block_take.steady`` said yes for this state
    and block, and the run holds no letter but a step, a data wait and the collective probe's rows
    (``block_take.fast_stop``), which go into the rank's collective fields (none of which the steps touch) as
    ``take_run`` takes them.

    What it takes: at least ``MIN_STEPS`` steps, data waits and steps in turn; every step's loss read at backward() and finite,
    and any loss held from before it too; every step's time finite and its interval a positive number; every step
    counting its tokens the same way (a declared count, the block's own counts all in range, the facts' count, or
    none); every data wait inside the attempt (after its first step), starting at or after the step before it and
    ending after it, and not before it started."""
    order = block.order
    n = order.count("s", start, stop)
    if n < MIN_STEPS:
        return False
    letters = order[start:stop]
    n_metrics = letters.count("m")  # the collective probe's rows (a data-parallel loop's), between the others
    if n_metrics:
        letters = letters.replace("m", "")
    if "ss" in letters or "pp" in letters:
        return False
    leads = letters[0] == "p"  # a data wait before the run's first step
    trails = letters[-1] == "p"  # and one after its last
    n_waits = n - 1 + leads + trails
    steps_col = block.step[s : s + n]
    t_col = block.step_t[s : s + n]
    intervals = block.step_time_s[s : s + n]
    losses = block.loss[s : s + n]
    loss_ts = block.loss_t[s : s + n]
    starts = block.phase_start_t[p : p + n_waits]
    ends = block.phase_end_t[p : p + n_waits]
    # Every loss finite (a sum is finite where each term is; one that overflows only sends the run back); every
    # time is (records.block.validate, which the engine's _on_block asks before any run of a block is taken)
    if None in losses or not _isfinite(sum(losses)) or not min(intervals) > 0.0:
        return False
    first_t = state.first_step_t
    attempt = state.attempts[-1] if state.attempts else None
    attempt_first_t = attempt.first_step_t if attempt is not None else first_t
    if first_t is None or attempt_first_t is None or not min(starts) > max(first_t, attempt_first_t):
        return False  # a wait from before the attempt's first step goes its own ways (take_phase)
    if not all(map(le, starts, ends)):
        return False
    last_step_t0: float = state.last_step_t  # type: ignore[assignment]  # the run stepped (steady)
    all_t = [last_step_t0, *t_col]  # each step's time after the time of the step before it
    before = all_t[0 if leads else 1 :][:n_waits]  # the last step's time when each wait ended
    if not all(map(ge, starts, before)) or not all(map(gt, ends, before)):
        return False
    resume = state.resume
    # Each wait's length: its time inside the attempt, and after the last step (its end less the later of its start
    # and that step's time: its start)
    waited = list(map(sub, ends, starts))
    afters = waited
    held = state.pending_backward.get(LOSS)
    if held is not None and not _isfinite(held.point.value):
        return False
    # The tokens each step counts, one way for all of them
    dp = block.dp
    counted = block.tokens_absent is None
    declared = derived.declared_tokens_per_step
    other = derived.other_tokens_per_step
    mismatch = state.tokens_mismatch
    tokens: list | None
    if declared is not None:
        tokens = [declared] * n
        last_tokens, last_source = declared, "declared --tokens-per-step"
        own = block.tokens[s + n - 1] * dp if counted else None  # only the last step's disagreement stays
        if own is not None and not 0 <= own < MAX_TOKENS_PER_STEP:
            own = None
        mismatch = own if own is not None and own != declared else None
    elif counted:
        tokens = list(map(mul, block.tokens[s : s + n], repeat(dp, n)))
        if not (min(tokens) >= 0 and max(tokens) < MAX_TOKENS_PER_STEP):
            return False
        last_tokens, last_source = tokens[-1], "tokens_global"
    elif other is not None:
        tokens = [other] * n
        last_tokens, last_source = other, "tokens_per_step fact"
    else:
        tokens = None
        last_tokens, last_source = state.last_tokens_per_step, state.last_tokens_source

    # -- everything checked: from here on the run is taken, and nothing returns early --------------------------------
    alpha = EMA_ALPHA
    shift = block.wall - block.t
    x_flop = derived.x_flop_per_token
    rank = state.ranks[0]
    if n_metrics:
        origins, values = block.metric_origin[m : m + n_metrics], block.metric_values[m : m + n_metrics]
        metric_steps = block.metric_step[m : m + n_metrics]
        for origin, figures, metric_step in zip(origins, values, metric_steps, strict=True):
            if origin == _COLLECTIVES:  # a group's own row ("collectives:<group>") stays in the log alone
                take_rank_values(rank, figures, metric_step)
    span = state.step_spans[block.host]
    steps0 = state.steps
    tokens_seen0, with0 = state.tokens_seen, state.steps_with_tokens
    # The data wait each step closes: the run's first takes what the rank held open (and its wait before it)
    wait_open = rank.data_wait_open_s
    if leads:
        wait_open = (wait_open or 0.0) + waited[0]
    closes = waited[1:] if leads else waited
    closed = closes[: n - 1] if wait_open is None else [wait_open, *closes[: n - 1]]
    rank.data_wait_ema_s = _ema(rank.data_wait_ema_s, closed, alpha)
    rank.data_wait_open_s = waited[-1] if trails else 0.0  # 0.0 + a wait is the wait (none is negative)
    step_ema = rank.step_time_ema_s
    # The same average of the same intervals where the step clock's started with the rank's (a loop that counted its
    # tokens from its first step): worked out once
    same_intervals = tokens is not None and state.interval_ema_s == step_ema
    rank.step_time_ema_s = step_ema = _ema(step_ema, intervals, alpha)
    rank.steps += n
    rank.last_t, rank.last_step = t_col[-1], steps_col[-1]
    if span.last_t < (latest := max(t_col)):
        span.last_t = latest
    # The step clock's counts and sums, each step's in a prefix (the marks, the history's x values)
    stepping = list(accumulate(map(sub, t_col, all_t), add, initial=resume.stepping_s))
    phase_sums = list(accumulate(waited, add, initial=resume.stepping_phase_s))
    wait_sums = list(accumulate(waited, add, initial=resume.stepping_wait_s))
    recent, rates = state.recent_intervals_s, state.recent_rates
    recent.extend(intervals[-STEP_WINDOW:])
    if tokens is None:
        state.window_steps_without_tokens += n
        seen = with_seen = None  # every step's: the counts before the run
    else:
        state.window_tokens = reduce(add, tokens, state.window_tokens)
        tokens_ema = state.tokens_ema
        if tokens_ema is None or tokens_ema != tokens[0] or tokens.count(tokens[0]) != n:
            state.tokens_ema = _ema(tokens_ema, tokens, alpha)
        # else each step's move is alpha times zero: the average stays as it is, bits and all
        state.interval_ema_s = step_ema if same_intervals else _ema(state.interval_ema_s, intervals, alpha)
        rates.extend(map(truediv, tokens[-STEP_WINDOW:], intervals[-STEP_WINDOW:]))
        # The tokens seen: seen[j] before step j, seen[j + 1] after it
        seen = list(accumulate(tokens, add, initial=tokens_seen0))
        with_seen = range(with0, with0 + n + 1)
        state.tokens_seen, state.steps_with_tokens = seen[-1], with0 + n
    del recent[:-STEP_WINDOW]
    del rates[:-STEP_WINDOW]
    # The marks a resume reads: only those the cut below keeps are built
    marks = resume.marks
    total = len(marks) + n
    kept = RECENT_MARKS + (total - MARKS_KEPT_MAX) % RECENT_MARKS if total >= MARKS_KEPT_MAX else total
    first = max(0, n - kept)
    marks.extend(
        zip(
            steps_col[first:],
            t_col[first:],
            range(steps0 + first + 1, steps0 + n + 1),
            seen[first + 1 :] if seen is not None else repeat(tokens_seen0, n - first),
            with_seen[first + 1 :] if with_seen is not None else repeat(with0, n - first),
            stepping[first + 1 :],
            phase_sums[first + leads : n + leads],
            wait_sums[first + leads : n + leads],
            strict=True,
        )
    )
    if total >= MARKS_KEPT_MAX:
        del marks[:-kept]
    state.steps, state.last_step = steps0 + n, steps_col[-1]
    state.last_step_t = t_col[-1]
    state.last_step_wall = t_col[-1] + shift
    if state.dp_assumed:
        state.dp_assumed = False
    if state.tokens_mismatch != mismatch:
        state.tokens_mismatch = mismatch
    if state.last_tokens_per_step != last_tokens:
        state.last_tokens_per_step = last_tokens
    if state.last_tokens_source != last_source:
        state.last_tokens_source = last_source
    resume.stepping_s = stepping[-1]
    resume.stepping_phase_s, resume.stepping_wait_s = phase_sums[-1], wait_sums[-1]
    # The time after the last step (attempts.phase): a step empties both sums where the phases' is not zero; once one
    # has, each step after it finds zero plus its wait's time after the step before, and leaves both at 0.0
    phase_after, wait_after = resume.phase_after_step_s, resume.wait_after_step_s
    for j in range(n):
        if j or leads:
            after = afters[j - 1 + leads]  # of the wait before step j
            phase_after, wait_after = phase_after + after, wait_after + after
        if phase_after:
            phase_after = wait_after = 0.0
            break
    if trails:
        phase_after, wait_after = phase_after + afters[-1], wait_after + afters[-1]
    resume.phase_after_step_s, resume.wait_after_step_s = phase_after, wait_after
    # The data waits' own counts and sums; the map of phases after the last step: emptied by the steps, then the wait
    # after the last one (each wait ended after the step before it)
    phases_seen = state.phases_seen
    phases_seen[DATA_WAIT] = phases_seen.get(DATA_WAIT, 0) + n_waits
    wait_s = state.phase_s.get(DATA_WAIT)
    state.phase_s[DATA_WAIT] = reduce(add, waited, 0.0 if wait_s is None else wait_s)
    state.phase_after_last_s = {DATA_WAIT: 0.0 + afters[-1]} if trails else {}

    # The losses: the one held from before, then each step's but the last, are committed in turn; the last is held
    commits = losses[:-1] if held is None else [held.point.value, *losses[:-1]]
    state.loss_seen = True
    tick_max = state.loss_tick_max
    state.loss_tick_max = max(commits) if tick_max is None else max(tick_max, *commits)
    state.series[LOSS] = records.SeriesPoint(
        canonical=LOSS, raw_key=LOSS, value=losses[-2], step=steps_col[-2], t=loss_ts[-2], origin=BACKWARD
    )
    pending = state.pending_backward
    pending.pop(LOSS, None)
    last = n - 1
    had_tokens = with_seen[last] if with_seen is not None else with0
    seen_before = seen[last] if seen is not None else tokens_seen0
    pending[LOSS] = PendingPoint(
        point=records.SeriesPoint(
            canonical=LOSS,
            raw_key=LOSS,
            value=losses[-1],
            step=steps_col[-1],
            t=loss_ts[-1],
            origin=BACKWARD,
        ),
        x_step=float(steps_col[-1]),
        x_tokens=float(seen_before) if had_tokens else _NAN,
        x_flop=seen_before * x_flop if had_tokens else _NAN,
        wall=loss_ts[-1] + shift,
    )
    if keeps:
        _points(
            history,
            held,
            steps_col,
            t_col,
            intervals,
            losses,
            loss_ts,
            seen,
            with0,
            tokens_seen0,
            x_flop,
            shift,
        )
    return True


def _points(
    history, held, steps_col, t_col, intervals, losses, loss_ts, seen, with0, seen0, x_flop, shift
) -> None:
    """The run's points into the history, each series' in one go: each committed loss at the x values its step had
    reached before its tokens, and each step's time at those after them; the series of the run's first point first
    (the held loss, committed at the first step, before that step's own point)."""
    n = len(steps_col)
    x_step = list(map(float, steps_col))
    if seen is None:
        x_tokens = [float(seen0) if with0 else _NAN] * (n + 1)
        x_flop_at = [seen0 * x_flop if with0 else _NAN] * (n + 1)
    else:
        x_tokens = list(map(float, seen))
        x_flop_at = list(map(mul, seen, repeat(x_flop)))
        if not with0:  # no step had counted tokens before the run's first
            x_tokens[0] = x_flop_at[0] = _NAN
    loss_x, loss_tokens, loss_flop = x_step[:-1], x_tokens[: n - 1], x_flop_at[: n - 1]
    loss_wall = list(map(add, loss_ts[:-1], repeat(shift)))
    loss_value = losses[:-1]
    if held is not None:
        loss_x.insert(0, held.x_step)
        loss_tokens.insert(0, held.x_tokens)
        loss_flop.insert(0, held.x_flop)
        loss_wall.insert(0, held.wall)
        loss_value = [held.point.value, *loss_value]
    step_points = (
        RANK_0_STEP_TIME,
        x_step,
        x_tokens[1:],
        x_flop_at[1:],
        list(map(add, t_col, repeat(shift))),
        list(intervals),
    )
    loss_points = (LOSS, loss_x, loss_tokens, loss_flop, loss_wall, list(loss_value))
    for points in (loss_points, step_points) if held is not None else (step_points, loss_points):
        history.add_points(*points)
