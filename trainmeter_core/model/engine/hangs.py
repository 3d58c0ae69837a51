"""The hangs bucket of the time split: a stall of rank 0's steps that the ``hung`` alert fired on, from the step it
stalled after to the next step, less the phases inside it. ``take_alert`` is the bucket's one source: another
detection (a collective's wait) replaces it and nothing else. Pure: no I/O, no clock."""

from __future__ import annotations

from trainmeter_core.model import records
from trainmeter_core.model.engine.state import EngineState

#: The alert rule whose episodes are hangs (model/alerts/training.py).
HUNG_RULE = "hung"


def take_alert(state: EngineState, record: records.Alert) -> None:
    """A ``hung`` alert that fired opens a hang at rank 0's latest step, the one the run stalled after. One that
    reaches the engine after the run stepped again (its ``steps`` number is behind) opens none: that stall is over."""
    resume = state.resume
    if record.rule != HUNG_RULE or record.state != "fired" or resume.hang_from_t is not None:
        return
    if state.last_step_t is None or not state.attempt_stepped:
        return
    steps = record.numbers.get("steps")
    if steps is not None and steps != float(state.steps):
        return
    resume.hang_from_t = state.last_step_t


def close(state: EngineState, t: float) -> None:
    """Rank 0's next step, at ``t``, closes the open hang: the stall less the phases since the step before (theirs)
    is the hang's. It joins the phases of the stretch, so compute and a later resume's redone work leave it out."""
    resume = state.resume
    start_t = resume.hang_from_t
    resume.hang_from_t = None
    if start_t is None:
        return
    held_s = max(0.0, (t - start_t) - resume.phase_after_step_s)
    resume.hang_s += held_s
    resume.stepping_phase_s += held_s


def open_s(state: EngineState, now_t: float) -> float:
    """The open hang so far: from the step it stalled after to now, less the phases since (0 with none open)."""
    resume = state.resume
    if resume.hang_from_t is None:
        return 0.0
    return max(0.0, (now_t - resume.hang_from_t) - resume.phase_after_step_s)
