"""Where the run's time went: startup and compile, data wait, checkpoints, eval, profiler, compute; and goodput. Pure:
the phases into the engine's state (``take_phase``), and the split as a metric family."""

from __future__ import annotations

import math

from trainmeter_core.model import formulas, records
from trainmeter_core.model.engine import attempts, nodes
from trainmeter_core.model.engine.builder import EI, NO_STEP, SnapshotBuilder
from trainmeter_core.model.engine.state import EngineState

# The phases during which a loop is not training on purpose (the hung-run rule waits them out).
_PAUSE_PHASES = ("eval", "checkpoint")


def take_phase(state: EngineState, record: records.Phase) -> None:
    """A phase of rank 0 into the state: its time before the first step (startup), within the window, after the last
    step, and the pause it makes (eval, checkpoint) for the hung-run rule. A data wait of any rank also goes into that
    rank's own data wait per step (the straggler's cause reads it)."""
    if record.phase == "data_wait":
        _rank_data_wait(state, record)
    if not nodes.is_clock(state, record.rank or 0):
        return  # every rank waits alike; rank 0's phases (the step clock's rank's) split the step clock's time
    name = record.phase
    state.phases_seen[name] = state.phases_seen.get(name, 0) + 1
    if not -math.inf < record.start_t <= record.end_t < math.inf:
        return  # a span that ends before it starts (or is not finite) holds no time
    if name in _PAUSE_PHASES and (state.pause_end_t is None or record.end_t >= state.pause_end_t):
        state.pause_phase, state.pause_end_t = name, record.end_t
    first = state.first_step_t
    before_end = record.end_t if first is None else min(record.end_t, first)
    if record.start_t < before_end:
        # Before the first step everything is startup and compile; what a phase says of it names that time.
        held = state.startup_phase_s
        held[name] = held.get(name, 0.0) + (before_end - record.start_t)
    if first is None or record.end_t <= first:
        return
    start = max(record.start_t, first)
    state.phase_s[name] = state.phase_s.get(name, 0.0) + (record.end_t - start)
    last = state.last_step_t
    after = 0.0
    if last is not None and record.end_t > last:
        after = record.end_t - max(start, last)
        state.phase_after_last_s[name] = state.phase_after_last_s.get(name, 0.0) + after
    attempts.phase(state, record, after)


def _rank_data_wait(state: EngineState, record: records.Phase) -> None:
    """A data_wait phase into its rank's wait since the rank's previous step (``take_step`` folds it into the EMA)."""
    rank = state.ranks.get(record.rank or 0)
    if rank is None:
        return  # before the rank's first step: that step has no interval, so no share of one to wait for
    waited = record.end_t - record.start_t
    if not 0.0 <= waited < math.inf:
        return  # a span that ends before it starts (or is not finite) holds no time
    rank.data_wait_open_s = (rank.data_wait_open_s or 0.0) + waited


def time_split(snap: SnapshotBuilder) -> dict[str, float]:
    state = snap.state
    if state.start_t is None or state.now_t is None:
        snap.put("goodput", "(compute + data wait after the first step) / elapsed", absent=NO_STEP)
        return {}
    split = formulas.time_split(
        start_t=state.start_t,
        now_t=state.now_t,
        first_step_t=state.first_step_t,
        last_step_t=state.last_step_t,
        phase_s=state.phase_s,
        phase_after_last_s=state.phase_after_last_s,
        final=snap.final,
    )
    _between_attempts(snap, split)
    snap.elapsed_s = state.now_t - state.start_t
    # The agent says per probe "attached" or "not attached: <why>" (probe.<part> facts). A part with no phase
    # and no attached probe may be hiding inside compute, and the explain says so.
    unattached: list[str] = []
    for part in ("compile", "data_wait", "checkpoint", "eval"):
        status = state.facts.value(f"probe.{part}")
        if part in state.phases_seen or status == "attached":
            continue
        why = status.removeprefix("not attached: ") if isinstance(status, str) else "no probe reported"
        unattached.append(f"{part} ({why})")
    note = None
    if unattached:
        note = "stays in compute, its probe never attached: " + "; ".join(unattached)
    if not snap.lean:
        snap.explain["time_split"] = records.Explain(
            formula="elapsed = startup_compile + data_wait + checkpoint + eval + profiler + compute (+ after_last_step)",
            inputs={name: EI(value=value, unit="s") for name, value in split.items()},
            note=note,
        )
    formula = "(compute + data wait after the first step) / elapsed"
    if "down" in split:
        formula += (
            ", the time between and before a resumed run's attempts and its steps done again not counted"
        )
    if state.first_step_t is None or snap.elapsed_s <= 0:
        snap.put("goodput", formula, absent=NO_STEP)
    else:
        inputs = {
            "compute_s": EI(value=split["compute"], unit="s"),
            "data_wait_s": EI(value=split["data_wait"], unit="s"),
            "elapsed_s": EI(value=snap.elapsed_s, unit="s"),
        }
        lost_note = lost_time(state.startup_phase_s, split, snap.elapsed_s, inputs)
        snap.put(
            "goodput",
            formula,
            value=formulas.goodput(split["compute"], split["data_wait"], snap.elapsed_s),
            note="; ".join(n for n in (lost_note, note) if n),
            inputs=inputs,
        )
    return split


def _between_attempts(snap: SnapshotBuilder, split: dict[str, float]) -> None:
    """A resumed run's parts (down, restart, superseded) taken out of compute, so the parts still add up to elapsed.

    At the end of a run whose last attempt never stepped, the time after the run's last step stays there, less the
    downtime it holds."""
    state = snap.state
    assert state.now_t is not None
    parts = attempts.time_parts(state, state.now_t, snap.final)
    if not parts or state.first_step_t is None:
        return
    open_down_s = state.resume.open_down_s if attempts.awaiting_step(state) else 0.0
    if snap.final and open_down_s:
        split["after_last_step"] = split.get("after_last_step", 0.0) - open_down_s
        split["compute"] -= parts["down"] - open_down_s + parts["restart"] + parts["superseded"]
    else:
        split["compute"] -= parts["down"] + parts["restart"] + parts["superseded"]
    split.update(parts)


# The parts of the time split that goodput does not count, in the words a person reads them, largest first.
_LOST_PARTS = (
    ("startup_compile", "start-up and compile before the first step"),
    ("down", "down between attempts"),
    ("restart", "restarting from a checkpoint"),
    ("superseded", "steps done again after resuming"),
    ("checkpoint", "checkpoints"),
    ("eval", "eval"),
    ("profiler", "profiled steps"),
    ("after_last_step", "after the last step"),
)


def lost_time(
    startup_phase_s: dict[str, float],
    split: dict[str, float],
    elapsed_s: float,
    inputs: dict[str, records.ExplainInput],
) -> str | None:
    """What the time goodput does not count was spent on, as a note; each part also goes into ``inputs``."""
    parts = []
    lost = 0.0
    for part, words in _LOST_PARTS:
        seconds = split.get(part, 0.0)
        if seconds <= 0:
            continue
        lost += seconds
        inputs[f"{part}_s"] = EI(value=seconds, unit="s")
        if part == "startup_compile" and startup_phase_s.get("compile"):
            # The compile phases the agent saw before the first step are part of start-up: say how much.
            compile_s = min(startup_phase_s["compile"], seconds)
            inputs["compile_before_first_step_s"] = EI(value=compile_s, unit="s", source="compile phases")
            words = f"start-up and compile before the first step ({compile_s:.1f} s of it compiling)"
        parts.append((seconds, f"{words} {seconds:.1f} s"))
    if not parts:
        return None
    inputs["lost_s"] = EI(value=lost, unit="s", source="elapsed − compute − data wait")
    named = ", ".join(text for _, text in sorted(parts, key=lambda p: -p[0]))
    waited = split.get("data_wait", 0.0)
    # Data wait inside the window counts as training time (SPEC's goodput); say so where there was any.
    tail = f" (the data wait, {waited:.1f} s, counts as training time)" if waited > 0 else ""
    return f"lost {lost:.1f} s of {elapsed_s:.1f} s: {named}{tail}"
