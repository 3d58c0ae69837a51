"""The ``step`` records into the engine's state: each rank's step time and its host's training window, and on rank 0
(the step clock's rank; on another node of a job, its own first rank) the step clock (steps, tokens, the training
window's sums, the alert inputs' latest steps, the marks a resume reads). Pure: no I/O, no clock. The engine's
hottest path: every EMA and window is inlined here, not called."""

from __future__ import annotations

import math

from trainmeter_core.model import formulas, records
from trainmeter_core.model.engine import attempts, hangs
from trainmeter_core.model.engine.derived import MAX_TOKENS_PER_STEP, Derived
from trainmeter_core.model.engine.state import STEP_WINDOW, EngineState, RankState
from trainmeter_core.model.engine.training_window import StepSpan

_ALPHA = formulas.EMA_ALPHA
_INF = math.inf
_MARKS_KEPT_MAX, _RECENT_MARKS = attempts.MARKS_KEPT_MAX, attempts.RECENT_MARKS


def take_step(state: EngineState, record: records.Step, derived: Derived) -> float | None:
    """One step of any rank into the state; returns its interval for the history, None where it measures nothing.

    One function, the rank-0 clock a block of it: a call of its own would cost every step 0.06 µs (3%)."""
    rank_id = record.rank or 0
    rank = state.ranks.get(rank_id)
    if rank is None:
        rank = state.ranks[rank_id] = RankState(host=record.host)
    clock = state.clock_rank
    if clock is None:
        # A node of a job without rank 0: its first rank heard from keeps the clock (nodes.is_clock).
        clock = state.clock_rank = rank_id
    t = record.t
    last_t = rank.last_t
    resumed_t = state.resume.attempt_start_t
    if resumed_t is not None and last_t is not None and last_t < resumed_t and rank_id != clock:
        # Its first step of a resumed attempt: the steps it does again leave its count (the clock's: first_step).
        attempts.rank_resumed(rank, record.step)
    interval = record.step_time_s
    if interval is None and last_t is not None:
        previous_t = attempts.previous_reading(state, last_t)  # never across a resume's gap
        interval = t - previous_t if previous_t is not None else None
    rank.steps += 1
    rank.last_t = t
    rank.last_step = record.step
    waited = rank.data_wait_open_s
    if waited is not None:
        # Its data wait of this step (0 where none came since its previous step), once its first data_wait phase came.
        previous = rank.data_wait_ema_s
        rank.data_wait_ema_s = waited if previous is None else previous + _ALPHA * (waited - previous)
        rank.data_wait_open_s = 0.0
    # The host's training window (training_window.extend_span, inlined)
    span = state.step_spans.get(record.host)
    if span is None:
        state.step_spans[record.host] = StepSpan(first_t=t, last_t=t)
    elif t > span.last_t:
        if span.gap_from is not None:
            attempts.reopen_span(span, t)
        span.last_t = t
    if interval is not None and not 0.0 < interval < _INF:
        interval = None  # a clock that went backwards (or NaN, or infinite) measures nothing
    if interval is not None and not record.profiled:
        # formulas.ema, inlined (as every EMA and window below)
        previous = rank.step_time_ema_s
        rank.step_time_ema_s = (
            float(interval) if previous is None else previous + _ALPHA * (interval - previous)
        )
    if rank_id != clock:
        return interval
    # Rank 0 (or a node's first rank) is the step clock: steps, tokens and the training window are counted on it alone.
    if derived.facts_version != state.facts.version:
        derived.refresh()
    tokens = step_tokens(state, record, derived)
    profiled = record.profiled
    first = state.first_step_t is None
    first_of_attempt = not state.attempt_stepped
    if first_of_attempt:
        state.attempt_stepped = True
        attempts.first_step(state, record)  # closes a resume's join, takes back the steps done again
    previous_step_t = state.last_step_t
    steps = state.steps = state.steps + 1
    state.last_step = record.step
    if first:
        state.first_step_t = t
    elif first_of_attempt:
        pass  # a resumed attempt's first step: its work lies in the join, which the window leaves out
    elif profiled:
        state.profiled_steps += 1
        state.profiled_s += interval if interval is not None else 0.0
    elif tokens is None:
        state.window_steps_without_tokens += 1
    else:
        state.window_tokens += tokens
        if interval is not None:
            previous = state.tokens_ema
            state.tokens_ema = float(tokens) if previous is None else previous + _ALPHA * (tokens - previous)
            previous = state.interval_ema_s
            state.interval_ema_s = (
                float(interval) if previous is None else previous + _ALPHA * (interval - previous)
            )
    if not first and not profiled and interval is not None:
        recent = state.recent_intervals_s
        recent.append(interval)
        if len(recent) > STEP_WINDOW:
            del recent[0]
        if tokens is not None:
            recent = state.recent_rates
            recent.append(tokens / interval)
            if len(recent) > STEP_WINDOW:
                del recent[0]
    state.last_step_t = t
    state.last_step_wall = record.wall
    if tokens is not None:
        tokens_seen = state.tokens_seen = state.tokens_seen + tokens
        with_tokens = state.steps_with_tokens = state.steps_with_tokens + 1
    else:
        tokens_seen, with_tokens = state.tokens_seen, state.steps_with_tokens
    # The mark a resume can rewind to (attempts.py reads them; appended here, inlined)
    resume = state.resume
    if resume.hang_from_t is not None:
        hangs.close(state, t)  # the step after a stall the hung alert fired on
    if first_of_attempt:
        stepping_s = resume.stepping_s
    else:
        stepping_s = resume.stepping_s = resume.stepping_s + (t - previous_step_t)  # type: ignore[operator]
    if resume.phase_after_step_s:
        resume.phase_after_step_s = resume.wait_after_step_s = 0.0
    marks = resume.marks
    marks.append((record.step, t, steps, tokens_seen, with_tokens,
                  stepping_s, resume.stepping_phase_s, resume.stepping_wait_s))  # fmt: skip
    if len(marks) >= _MARKS_KEPT_MAX:
        del marks[:_RECENT_MARKS]  # in one go, now and then: the latest RECENT_MARKS stay
    if state.phase_after_last_s:
        state.phase_after_last_s = {}
    return interval


def step_tokens(state: EngineState, record: records.Step, derived: Derived) -> int | None:
    """Tokens in this step across all ranks, or None: a declared count (``--tokens-per-step``) beats a detected one
    (a disagreement is kept for a warning), and a detected one beats a ``tokens_per_step`` fact that was not declared.

    The state's fields are stored only when their value changes, which is seldom: a store into a msgspec Struct goes
    the interpreter's generic way (40 ns, against 9 ns into a plain slot), and this runs at every step."""
    declared = derived.declared_tokens_per_step
    detected = record.tokens_global
    source = "tokens_global"
    dp_assumed = False
    if detected is None and record.tokens is not None:
        dp = derived.dp if derived.dp is not None else record.dp
        dp_assumed = dp is None
        detected = record.tokens * (dp if dp is not None else 1)
        source = "tokens × dp" if dp is not None else "tokens × dp (dp assumed 1)"
    if detected is not None and not 0 <= detected < MAX_TOKENS_PER_STEP:
        detected = None  # a negative or absurd count is no count
    if declared is not None:
        mismatch = detected if detected is not None and detected != declared else None
        if state.tokens_mismatch != mismatch:
            state.tokens_mismatch = mismatch
        detected, source = declared, "declared --tokens-per-step"
        dp_assumed = False
    elif detected is None and derived.other_tokens_per_step is not None:
        detected, source = derived.other_tokens_per_step, "tokens_per_step fact"
    if state.dp_assumed is not dp_assumed:
        state.dp_assumed = dp_assumed
    if detected is not None:
        if state.last_tokens_per_step != detected:
            state.last_tokens_per_step = detected
        if state.last_tokens_source != source:
            state.last_tokens_source = source
    return detected
