"""Where the run's time went: productive step time and the badput buckets (badput.py), and goodput. Pure: the phases
into the engine's state (``take_phase``), and the split as a metric family."""

from __future__ import annotations

import math

from trainmeter_core.model import formulas, records
from trainmeter_core.model.engine import attempts, badput, nodes
from trainmeter_core.model.engine.builder import EI, NO_STEP, SnapshotBuilder
from trainmeter_core.model.engine.state import EngineState

# The phases during which a loop is not training on purpose (the hung-run rule waits them out).
_PAUSE_PHASES = ("eval", "checkpoint")


def take_phase(state: EngineState, record: records.Phase) -> None:
    """A phase of rank 0 into the state: its time before the current attempt's first step (out of start-up), before
    the run's first step and after it by name (its bucket), after the last step, and the pause it makes (eval,
    checkpoint) for the hung-run rule. A data wait of any rank also goes into that
    rank's own data wait per step (the straggler's cause reads it)."""
    if record.phase == "data_wait":
        _rank_data_wait(state, record)
    if not nodes.is_clock(state, record.rank or 0):
        return  # every rank waits alike; rank 0's phases (the step clock's rank's) split the step clock's time
    name = record.phase
    state.phases_seen[name] = state.phases_seen.get(name, 0) + 1
    if not -math.inf < record.start_t <= record.end_t < math.inf:
        return  # a span that ends before it starts (or is not finite) holds no time
    attempt = state.attempts[-1] if state.attempts else None
    attempt_first_t = attempt.first_step_t if attempt is not None else state.first_step_t
    before_attempt_t = record.end_t if attempt_first_t is None else min(record.end_t, attempt_first_t)
    if record.start_t < before_attempt_t:
        # Before the attempt's first step: no part of its start-up, which is the rest of that time
        state.resume.before_step_phase_s += before_attempt_t - record.start_t
    if name in _PAUSE_PHASES and (state.pause_end_t is None or record.end_t >= state.pause_end_t):
        state.pause_phase, state.pause_end_t = name, record.end_t
    first = state.first_step_t
    before_end = record.end_t if first is None else min(record.end_t, first)
    if record.start_t < before_end:
        # The phases before the run's first step, by name: each its own bucket there too (badput.py sums both).
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
    """The time split as ``snapshot.phases_s`` and goodput as a metric: productive step time over the allocated time."""
    state = snap.state
    formula = "productive step time (the steps kept) / elapsed"
    if state.start_t is None or state.now_t is None:
        snap.put("goodput", formula, absent=NO_STEP)
        return {}
    split = badput.split_of(state, state.now_t, snap.final)
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
            formula="elapsed = compute + " + " + ".join(formulas.BADPUT_BUCKETS),
            inputs={name: EI(value=value, unit="s") for name, value in split.items()},
            note=note,
        )
    if state.first_step_t is None or snap.elapsed_s <= 0:
        snap.put("goodput", formula, absent=NO_STEP)
    else:
        inputs = {
            "compute_s": EI(value=split["compute"], unit="s"),
            "elapsed_s": EI(value=snap.elapsed_s, unit="s"),
        }
        lost_note = lost_time(split, snap.elapsed_s, inputs)
        snap.put(
            "goodput",
            formula,
            value=formulas.goodput(split["compute"], snap.elapsed_s),
            note="; ".join(n for n in (lost_note, note) if n),
            inputs=inputs,
        )
    return split


# The badput buckets in the words a person reads them (goodput's note lists them largest first).
BUCKET_WORDS = {
    "startup": "start-up and imports",
    "compile": "compiling",
    "data_wait": "data wait",
    "checkpoint": "checkpoints saved",
    "checkpoint_load": "checkpoints loaded",
    "eval": "eval",
    "profiler": "profiled steps",
    "hang": "hangs",
    "superseded": "steps done again after resuming",
    "down": "down between attempts",
    "after_last_step": "after the last step",
    "other": "other (unattributed)",
}


def lost_time(
    split: dict[str, float],
    elapsed_s: float,
    inputs: dict[str, records.ExplainInput],
) -> str | None:
    """What the time goodput does not count was spent on, as a note; each bucket also goes into ``inputs``."""
    parts = []
    lost = 0.0
    for part in formulas.BADPUT_BUCKETS:
        seconds = split.get(part, 0.0)
        lost += seconds
        if abs(seconds) < 0.05 and part == "other":
            continue  # rounding, nothing to name
        if seconds <= 0 and part != "other":
            continue
        inputs[f"{part}_s"] = EI(value=seconds, unit="s")
        parts.append((seconds, f"{BUCKET_WORDS[part]} {seconds:.1f} s"))
    if not parts:
        return None
    inputs["lost_s"] = EI(value=lost, unit="s", source="elapsed − compute")
    named = ", ".join(text for _, text in sorted(parts, key=lambda p: -p[0]))
    return f"lost {lost:.1f} s of {elapsed_s:.1f} s: {named}"
