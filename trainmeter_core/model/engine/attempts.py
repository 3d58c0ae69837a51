"""A resumed run in the engine: each ``run.start`` after the first opens an attempt of the same run, on one timeline;
the gap between attempts is downtime, and the steps an attempt does again are superseded. Pure: no I/O, no clock."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from trainmeter_core.model import records
from trainmeter_core.model.engine import badput
from trainmeter_core.model.engine.state import AttemptState, EngineState, RankState, Resume
from trainmeter_core.model.engine.training_window import StepSpan

if TYPE_CHECKING:
    from trainmeter_core.model.engine.builder import SnapshotBuilder

# The gap between attempts is counted as downtime, the time from the last step before it to the first step after it
# as restarting, and the steps an attempt does again (it resumed from a checkpoint older than the last step the run had
# reached) are superseded: taken out of the steps, tokens and FLOPs the run reached, and their time counted as lost.
# Step numbers are the training's own (the agent reads the restored optimizer's step, or the loop says it with
# ``emit(step=...)``); they are never renumbered here.

#: Rank 0's latest steps kept as marks a resume can rewind to exactly (a checkpoint the agent did not see). The
#: engine appends one at each step (in steps.py, its hottest path) and drops the oldest RECENT_MARKS at a time.
RECENT_MARKS = 256
MARKS_KEPT_MAX = 2 * RECENT_MARKS
#: Checkpoints (rank 0's checkpoint phases) kept as marks: a resume nearly always goes back to one of these.
CHECKPOINT_MARKS = 64
#: Two attempts on one host whose monotonic clocks agree with their wall clocks within this share one clock.
SAME_CLOCK_S = 5.0

Mark = tuple[int, float, int, int, int, float, float, float]


def start(state: EngineState, record: records.RunStart) -> None:
    """A ``run.start``: the run's first attempt, or the next one, joined to the timeline of those before it."""
    resume = state.resume
    if not state.attempts:
        state.attempts.append(
            AttemptState(attempt=1, host=record.host, start_t=record.t, start_wall=record.wall)
        )
        return
    previous = state.attempts[-1]
    if previous.end == "running":
        previous.end = "lost"  # no run.end: tm stopped with the training (SIGKILL, a node that died)
    last_t, last_wall = ended(state, previous)
    previous.last_t, previous.last_wall = last_t, last_wall
    previous.last_step = state.last_step if previous.first_step is not None else None
    previous.split_end = badput.split_of(state, last_t, final=True)
    _close_attempt(state, previous, last_t)
    gap_s = max(0.0, record.wall - last_wall)
    # One clock when the host is the same and its monotonic time moved as the wall clock did; else (another node, a
    # reboot) this attempt's times are moved so that it starts gap_s after the attempt before ended.
    shifted = record.t + resume.t_offset
    moved = shifted - last_t
    if not (record.host == previous.host and moved >= 0 and abs(moved - gap_s) <= SAME_CLOCK_S):
        resume.t_offset = last_t + gap_s - record.t
    start_t = record.t + resume.t_offset
    resume.attempt_start_t = start_t
    resume.down_s += gap_s
    # The phases after the latest step are no part of a stretch between steps.
    resume.stepping_phase_s -= resume.phase_after_step_s
    resume.stepping_wait_s -= resume.wait_after_step_s
    resume.phase_after_step_s = resume.wait_after_step_s = 0.0
    for span in state.step_spans.values():
        if span.gap_from is None:
            span.gap_from = span.last_t  # the host's window pauses until its first step of the new attempt
    state.recent_intervals_s = []
    state.recent_rates = []
    state.attempt_stepped = False
    state.finished = False
    state.exit_code = state.exit_signal = None
    state.exit_signal_name = None
    state.attempts.append(
        AttemptState(
            attempt=len(state.attempts) + 1,
            host=record.host,
            start_t=start_t,
            start_wall=record.wall,
            gap_s=gap_s,
        )
    )


def _close_attempt(state: EngineState, attempt: AttemptState, last_t: float) -> None:
    """The attempt's end into the badput buckets: from its last step to its end (less the phases there) is time after
    the last step, or a hang's when one was open; an attempt that never stepped was starting up all its life."""
    resume = state.resume
    if attempt.first_step is None or state.last_step_t is None:
        resume.startup_s += max(0.0, last_t - attempt.start_t)
        return
    after_s = max(0.0, last_t - state.last_step_t - resume.phase_after_step_s)
    if resume.hang_from_t is not None:
        resume.hang_s += after_s
        resume.hang_from_t = None
    else:
        resume.after_step_s += after_s


def ended(state: EngineState, attempt: AttemptState) -> tuple[float, float]:
    """Where the current attempt ended (or stands): its latest tick or rank 0's latest step, whichever came later (t
    and wall). While tm lives the hub ticks every second, so an attempt lost with tm ended within a second of it."""
    t, wall = attempt.start_t, attempt.start_wall
    for other_t, other_wall in ((state.now_t, state.now_wall), (state.last_step_t, state.last_step_wall)):
        if other_t is not None and other_wall and other_t >= t:
            t, wall = other_t, max(wall, other_wall)
    return t, wall


def shifted(record: records.Record, offset: float) -> records.Record:
    """``record`` with every monotonic time moved by ``offset`` (a copy: the caller's record is left alone)."""
    changes: dict[str, float] = {"t": record.t + offset}
    if isinstance(record, records.Phase):
        changes["start_t"] = record.start_t + offset
        changes["end_t"] = record.end_t + offset
    elif isinstance(record, records.SampleGpu) and record.gpm_window_start_t is not None:
        changes["gpm_window_start_t"] = record.gpm_window_start_t + offset
    return msgspec.structs.replace(record, **changes)


def first_step(state: EngineState, record: records.Step) -> None:
    """Rank 0's first step of an attempt: close the join before it, and take back the steps it does again."""
    attempt = state.attempts[-1] if state.attempts else None
    if attempt is None:
        return
    attempt.first_step, attempt.first_step_t = record.step, record.t
    resume = state.resume
    resume.startup_s += max(0.0, record.t - attempt.start_t)
    if state.last_step_t is None or len(state.attempts) < 2:
        return
    resume.join_s += record.t - state.last_step_t
    resumed_after = record.step - 1
    attempt.resumed_from = resumed_after
    attempt.resumed_from_source = (
        "the restored optimizer's step" if record.resumed_from is not None else "the step numbers"
    )
    last = state.last_step
    if last is not None and resumed_after < last:
        _supersede(state, attempt, resumed_after)


def _supersede(state: EngineState, attempt: AttemptState, after: int) -> None:
    """Steps after ``after`` were done before and are done again: rewind to the mark of step ``after``."""
    resume = state.resume
    mark, exact = _mark_for(resume, after)
    if mark is None:
        return
    _, _, steps, tokens, with_tokens, stepping_s, phase_s, wait_s = mark
    lost_phase_s = resume.stepping_phase_s - phase_s
    # The stretch's compute is lost; its data wait, checkpoints, evals and hangs stay under their own names.
    lost_s = max(0.0, (resume.stepping_s - stepping_s) - lost_phase_s)
    lost_steps = state.steps - steps
    resume.superseded_s += lost_s
    resume.superseded_steps += lost_steps
    resume.superseded_tokens += max(0, state.tokens_seen - tokens)
    attempt.superseded_steps += lost_steps
    attempt.superseded_s += lost_s
    if not exact:
        attempt.superseded_note = (
            f"no mark of step {after} is kept (tm keeps the latest {RECENT_MARKS} steps and {CHECKPOINT_MARKS} "
            f"checkpoints): counted from step {mark[0]}, so at least this much"
        )
    clock = state.ranks.get(state.clock_rank or 0)
    if clock is not None:
        clock.steps = max(0, clock.steps - lost_steps)  # the clock's rank counts what the run counts
    state.steps = steps
    state.tokens_seen = tokens
    state.steps_with_tokens = with_tokens
    resume.stepping_s, resume.stepping_phase_s, resume.stepping_wait_s = stepping_s, phase_s, wait_s
    cut = mark[0]
    resume.marks = [m for m in resume.marks if m[0] <= cut]
    resume.checkpoint_marks = [m for m in resume.checkpoint_marks if m[0] <= cut]


def rank_resumed(rank: RankState, step: int) -> None:
    """Another rank than the clock's takes its first step of a resumed attempt, ``step``: the steps it took after
    ``step − 1`` in the attempts before are done again, so they leave its count (each step counts once, as in the
    run's ``steps``). Its steps are counted by their numbers, which a rank takes one by one."""
    last = rank.last_step
    if last is not None and step - 1 < last:
        rank.steps = max(0, rank.steps - (last - (step - 1)))


def _mark_for(resume: Resume, after: int) -> tuple[Mark | None, bool]:
    """The mark of step ``after`` (a checkpoint's first, it is taken once the checkpoint is written), exact; else the
    oldest kept mark past it (a lower bound of what was lost), or step 0 before any step."""
    for marks in (resume.checkpoint_marks, resume.marks):
        for mark in reversed(marks):
            if mark[0] == after:
                return mark, True
    if after <= 0:
        return (0, 0.0, 0, 0, 0, 0.0, 0.0, 0.0), True
    later = [m for m in (*resume.checkpoint_marks, *resume.marks) if m[0] > after]
    if not later:
        return None, False
    return min(later, key=lambda m: (m[0], m[5])), False


def phase(state: EngineState, record: records.Phase, after_last_s: float) -> None:
    """Rank 0's phase: its part inside the current attempt's stretch, and a checkpoint's mark."""
    resume = state.resume
    attempt = state.attempts[-1] if state.attempts else None
    first_t = attempt.first_step_t if attempt is not None else state.first_step_t
    if first_t is None or record.end_t <= first_t:
        return
    inside_s = record.end_t - max(record.start_t, first_t)
    after_s = min(inside_s, after_last_s)
    resume.stepping_phase_s += inside_s
    resume.phase_after_step_s += after_s
    if record.phase == "data_wait":
        resume.stepping_wait_s += inside_s
        resume.wait_after_step_s += after_s
    if record.phase == "checkpoint" and record.step is not None:
        _checkpoint_mark(resume, record)


def _checkpoint_mark(resume: Resume, record: records.Phase) -> None:
    """The mark of a checkpoint: its step's mark moved on to the end of the save, so the save itself is no part of
    what a later resume from it redoes. A phase reaches the hub in the agent's next batch, often after a step or two
    more: its step's mark (kept among the recent ones) says where the run stood when it was written."""
    step_mark = next((m for m in reversed(resume.marks) if m[0] == record.step), None)
    if step_mark is None or record.end_t < step_mark[1]:
        return
    step, t, steps, tokens, with_tokens, stepping_s, phase_s, wait_s = step_mark
    marks = resume.checkpoint_marks
    marks.append(
        (
            step,
            record.end_t,
            steps,
            tokens,
            with_tokens,
            stepping_s + (record.end_t - t),
            phase_s + (record.end_t - max(record.start_t, t)),
            wait_s,
        )
    )
    if len(marks) > CHECKPOINT_MARKS:
        del marks[0]


def end(state: EngineState, record: records.RunEnd) -> None:
    """``run.end``: how the current attempt ended."""
    if not state.attempts:
        return
    attempt = state.attempts[-1]
    if record.signal is not None:
        attempt.end = f"killed by {record.signal_name or f'signal {record.signal}'}"
    elif record.exit_code is not None:
        attempt.end = f"exited {record.exit_code}"
    else:
        attempt.end = record.reason.replace("_", " ")
    attempt.last_t, attempt.last_wall = record.t, record.wall


def awaiting_step(state: EngineState) -> bool:
    """A resumed attempt that has not stepped yet (restarting: loading its checkpoint, compiling)."""
    attempts = state.attempts
    return len(attempts) > 1 and attempts[-1].first_step is None


def previous_reading(state: EngineState, t: float | None) -> float | None:
    """``t`` of a previous reading, or None when it was taken before the current attempt started."""
    start_t = state.resume.attempt_start_t
    if t is None or start_t is None or t >= start_t:
        return t
    return None


def reopen_span(span: StepSpan, t: float) -> None:
    """A host's first step in a new attempt: its window goes on from here, the join left out."""
    if span.gap_from is not None:
        if t > span.gap_from:
            span.gaps.append((span.gap_from, t))
        span.gap_from = None


# ----------------------------------------------------------------------------------------------------------------------
# What a snapshot shows of them


def stats(state: EngineState) -> list[records.AttemptStat]:
    """Every attempt, for the snapshot (only a resumed run lists them)."""
    if len(state.attempts) < 2:
        return []
    out = []
    known = state.now_t is not None and state.start_t is not None
    shares = badput.per_attempt(state, state.now_t, state.finished) if known else []  # type: ignore[arg-type]
    for index, attempt in enumerate(state.attempts):
        current = index == len(state.attempts) - 1
        last_step = state.last_step if current and attempt.first_step is not None else attempt.last_step
        following = state.attempts[index + 1] if not current else None
        steps = _attempt_steps(attempt, last_step)
        out.append(
            records.AttemptStat(
                attempt=attempt.attempt,
                start_t=attempt.start_t,
                start_wall=attempt.start_wall,
                end=attempt.end,
                first_step=attempt.first_step,
                last_step=last_step,
                steps=steps,
                last_t=ended(state, attempt)[0] if current else attempt.last_t,
                last_wall=ended(state, attempt)[1] if current else attempt.last_wall,
                gap_s=attempt.gap_s,
                resumed_from=attempt.resumed_from,
                superseded_steps=following.superseded_steps if following is not None else 0,
                superseded_s=following.superseded_s if following is not None else 0.0,
                phases_s=shares[index] if shares else {},
            )
        )
    return out


def _attempt_steps(attempt: AttemptState, last_step: int | None) -> int:
    """The steps an attempt took, by its step numbers (first to last, both included)."""
    if attempt.first_step is None or last_step is None:
        return 0
    return max(0, last_step - attempt.first_step + 1)


def put_metrics(snap: SnapshotBuilder) -> None:
    """A resumed run's own numbers: which attempt, since when, and the steps done again (absent for one attempt)."""
    state = snap.state
    if len(state.attempts) < 2:
        return
    attempt = state.attempts[-1]
    resume = state.resume
    snap.put(
        "attempt",
        "the run's run.start records so far",
        value=float(attempt.attempt),
        label=attempt.end,
        inputs={"gap_s": records.ExplainInput(value=attempt.gap_s, unit="s", source="wall clock")},
    )
    now = state.now_t
    formula = "now − the t of the current attempt's run.start"
    if now is None or now < attempt.start_t:
        snap.put("since_attempt_start_s", formula, absent="no tick of this attempt yet", unit="s")
    else:
        snap.put("since_attempt_start_s", formula, value=now - attempt.start_t, unit="s")
    notes = [a.superseded_note for a in state.attempts if a.superseded_note]
    snap.put(
        "superseded_steps",
        "steps done again after resuming from a checkpoint older than the last step",
        value=float(resume.superseded_steps),
        note="; ".join(notes) if notes else None,
        inputs={
            "superseded_s": records.ExplainInput(value=resume.superseded_s, unit="s"),
            "superseded_tokens": records.ExplainInput(value=resume.superseded_tokens, unit="tokens"),
        },
    )


def warnings(state: EngineState) -> list[str]:
    """A resumed attempt whose steps started again at 1 with no step from a checkpoint: said, not guessed."""
    out = []
    for attempt in state.attempts[1:]:
        if attempt.first_step == 1 and attempt.resumed_from_source == "the step numbers":
            out.append(
                f"attempt {attempt.attempt} started again at step 1, so every earlier step counts as superseded: "
                "if it loaded a checkpoint, its optimizer keeps no step in its state (plain SGD does not) for tm to "
                "read; a loop that declares its steps with emit(step=...) numbers them itself"
            )
    return out
