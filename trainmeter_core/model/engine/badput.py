"""Where the allocated time went, from the engine's state: productive step time and the badput buckets (start-up,
compile, data wait, checkpoints saved and loaded, eval, profiled steps, hangs, steps done again, the run down, after
the last step, other), over a run and all its attempts, and each attempt's share. Pure: no I/O, no clock."""

from __future__ import annotations

from trainmeter_core.model import formulas
from trainmeter_core.model.engine import hangs
from trainmeter_core.model.engine.state import EngineState


def split_of(state: EngineState, now_t: float, final: bool) -> dict[str, float]:
    """The run's time split at ``now_t``: compute and every bucket of ``formulas.BADPUT_BUCKETS``, adding up to
    ``now_t`` − the run's start. While the run lives, the step in progress is compute (an open hang's time aside);
    at the end, the time after the last step is its own bucket (or the open hang's)."""
    assert state.start_t is not None
    resume = state.resume
    attempt = state.attempts[-1] if state.attempts else None
    if attempt is None:  # a log with no run.start: one attempt, from the first record
        first_t = state.first_step_t if state.first_step_t is not None else now_t
        startup_s = first_t - state.start_t
    else:
        startup_s = resume.startup_s + (now_t - attempt.start_t if attempt.first_step is None else 0.0)
    startup_s -= resume.before_step_phase_s
    compute_s = resume.stepping_s - resume.stepping_phase_s
    hang_s, after_s = resume.hang_s, resume.after_step_s
    if state.attempt_stepped and state.last_step_t is not None and now_t >= state.last_step_t:
        since_s = now_t - state.last_step_t
        open_hang_s = hangs.open_s(state, now_t)
        if final:
            compute_s += (
                resume.phase_after_step_s
            )  # the phases after the last step are the tail's, not a stretch's
            if resume.hang_from_t is not None:
                hang_s += open_hang_s
            else:
                after_s += max(0.0, since_s - resume.phase_after_step_s)
        else:
            compute_s += since_s - open_hang_s  # the step in progress
            hang_s += open_hang_s
    phase_s = {
        name: state.startup_phase_s.get(name, 0.0) + state.phase_s.get(name, 0.0)
        for name in formulas.PHASE_BUCKETS
    }
    return formulas.time_split(
        elapsed_s=now_t - state.start_t,
        compute_s=compute_s,
        startup_s=startup_s,
        after_last_step_s=after_s,
        phase_s=phase_s,
        hang_s=hang_s,
        superseded_s=resume.superseded_s,
        down_s=resume.down_s,
    )


def per_attempt(state: EngineState, now_t: float, final: bool) -> list[dict[str, float]]:
    """Each attempt's share of the split (the gap before it is its ``down``): the run's split at its end less the
    split at the end of the one before. Steps an attempt did that the next one did again are its ``superseded``,
    moved out of its compute (the run's split takes them out when the next attempt steps)."""
    ends = [a.split_end for a in state.attempts[:-1]] + [split_of(state, now_t, final)]
    shares: list[dict[str, float]] = []
    before: dict[str, float] = {}
    for end in ends:
        shares.append({name: seconds - before.get(name, 0.0) for name, seconds in end.items()})
        before = end
    for index, attempt in enumerate(state.attempts[1:], start=1):
        lost_s = attempt.superseded_s
        if lost_s:
            shares[index - 1]["compute"] -= lost_s
            shares[index - 1]["superseded"] += lost_s
            shares[index]["compute"] += lost_s
            shares[index]["superseded"] -= lost_s
    return shares
