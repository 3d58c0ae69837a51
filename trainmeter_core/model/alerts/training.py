"""Alert rules about the training loop: hung, throughput drop, NaN or spiked loss, a straggler rank, the process died.

Pure functions of a rule's state and one snapshot: no clock (a snapshot's ``t`` is the time), no I/O. A rule that
cannot judge yet (start-up, an eval or checkpoint span, too little history) holds, and never guesses.
"""

from __future__ import annotations

import math
import signal

from trainmeter_core.model import records
from trainmeter_core.model.alerts import collective_wait
from trainmeter_core.model.alerts.episodes import Condition, Rule, RuleState, Verdict, metric
from trainmeter_core.model.formulas import median

# Signals a person or a scheduler sends to stop a run: a death by one of them is news, not an emergency.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def hung_threshold_s(snapshot: records.Snapshot, factor: float, floor_s: float) -> float:
    """How long without a step counts as hung: max(factor × the median step time, floor); the floor alone before the
    first interval is known."""
    median_s = metric(snapshot, "step_time_median_s")
    return max(factor * median_s, floor_s) if median_s is not None else floor_s


def is_stepping(snapshot: records.Snapshot, factor: float, floor_s: float) -> bool:
    """The training process lives and steps: alive, and a step came within the hung threshold (or, before the first
    step, the run is younger than the floor). The heartbeat pings only then."""
    if snapshot.final or metric(snapshot, "child_alive") != 1.0:
        return False
    since_s = metric(snapshot, "since_step_s")
    if since_s is None:
        # Before the first step of the run, or of a resumed attempt (its restart counts like a start-up).
        young_s = metric(snapshot, "since_attempt_start_s")
        if young_s is None:
            young_s = snapshot.elapsed_s
        return young_s is not None and young_s <= floor_s
    return since_s <= hung_threshold_s(snapshot, factor, floor_s)


class Hung(Rule):
    """No step for max(factor × the median step time, floor_s) while the training process lives; or sooner, after
    ``collective_floor_s`` without a step, when ranks wait in a collective that a rank of its group never entered
    (``collective_wait.py``): then the alert names the group, the operation, its sequence number, the ranks that entered
    it and those that did not, with every rank's stacks attached. A rank that never entered because it is in a phase
    tm knows (saving a checkpoint, an evaluation) is that phase, no hang.

    At the run's end, a run that stepped again within that time of its end is no longer hung (its episode clears); one
    that ended without stepping again stays hung, and none fires at the end.
    """

    name = "hung"
    severity = "critical"
    defaults = {"factor": 10.0, "floor_s": 300.0, "collective_floor_s": 60.0, "clear_after_s": 10.0}

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        config = state.config
        since_s = metric(snapshot, "since_step_s")
        alive = metric(snapshot, "child_alive")
        if since_s is None:
            return Verdict()  # no step yet: start-up and compile are no hang
        if alive == 1.0 and not snapshot.final:
            verdict = _collective_verdict(snapshot, since_s, config["collective_floor_s"])
            if verdict is not None:
                return verdict
        threshold_s = hung_threshold_s(snapshot, config["factor"], config["floor_s"])
        median_s = metric(snapshot, "step_time_median_s")
        numbers = {"since_step_s": since_s, "threshold_s": threshold_s, "steps": float(snapshot.steps)}
        if median_s is not None:
            numbers["step_time_median_s"] = median_s
        if snapshot.final:
            if since_s > threshold_s:
                return Verdict(held=True)  # it ended with no step since: an open episode stays open
            words = (
                f"it stepped until the end: its last step came {since_s:.1f} s before the run ended, "
                f"after {snapshot.steps} steps"
            )
            return Verdict(normal=[Condition(words, numbers)])
        if alive == 1.0 and since_s > threshold_s:
            usual = (
                f"{config['factor']:g} × the median step {median_s:.3g} s"
                if median_s is not None
                else "no median yet"
            )
            message = (
                f"no step for {since_s:.0f} s after step {snapshot.steps} while the training process lives "
                f"(threshold {threshold_s:.0f} s: {usual}, floor {config['floor_s']:.0f} s)"
            )
            return Verdict(active=[Condition(message, numbers)])
        words = (
            "the training process is gone"
            if alive == 0.0
            else f"stepping again, last step {since_s:.1f} s ago"
        )
        return Verdict(normal=[Condition(words, numbers)])


def _collective_verdict(snapshot: records.Snapshot, since_s: float, floor_s: float) -> Verdict | None:
    """The hung rule's collective part: None when no rank waits in a collective another never entered, or the wait
    is shorter than ``floor_s`` (the step floor judges then)."""
    if since_s <= floor_s:
        return None
    hang = collective_wait.find_hang(snapshot.facts)
    if hang is None:
        return None
    numbers = {
        "collective_wait_s": since_s,
        "collective_floor_s": floor_s,
        "seq": float(hang.seq),
        "steps": float(snapshot.steps),
    }
    if set(hang.phases) == set(hang.missing):
        return Verdict(normal=[Condition(collective_wait.describe_phase(hang), numbers)])
    # The episode's subject is the ranks that reported, alive, and never entered: a rank that sent no report is named
    # in the message only, so a report that comes late (or is replaced a moment after a step learnt late) changes
    # the words of the same hang, never starts a second episode of it
    subject = ", ".join(f"rank {rank}" for rank in hang.missing if rank not in hang.silent)
    attachments = {f"rank {rank} stacks": text for rank, text in hang.stacks.items()}
    condition = Condition(
        collective_wait.describe(hang, since_s), numbers, subject=subject, attachments=attachments
    )
    return Verdict(active=[condition])


class ThroughputDrop(Rule):
    """Tokens/s (steps/s when tokens are unknown) below ``fraction`` of its running median, sustained.

    The measure is the median over rank 0's latest steps of tokens / step interval, so a single long step (a stall, the
    step after an eval) does not move it. Its running median (the baseline) keeps the values of the last
    ``baseline_window_s`` that were not low, and stays frozen while the rate is low, so a drop never becomes its own
    baseline (a run that stays slow stays fired until it recovers or ends). It holds during
    ``warmup_s`` after the first step, until ``min_samples`` values are in the baseline, and for ``pause_holdoff_s``
    after an eval or checkpoint span. Once low, it stays low until the rate is back above ``clear_fraction``.
    """

    name = "throughput_drop"
    severity = "warning"
    defaults = {
        "fraction": 0.7,
        "clear_fraction": 0.85,
        "baseline_window_s": 1800.0,
        "warmup_s": 300.0,
        "min_samples": 30.0,
        "pause_holdoff_s": 120.0,
        "fire_after_s": 120.0,
        "clear_after_s": 60.0,
    }

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        config, memory = state.config, state.memory
        rate, unit = _rate(snapshot, memory)
        if rate is None or snapshot.final:
            return Verdict(held=True)
        now = snapshot.t
        first_t = memory.setdefault("first_t", now)
        new_step = snapshot.steps != memory.get("steps")
        memory["steps"] = snapshot.steps
        since_pause_s = metric(snapshot, "since_pause_s")
        if now - first_t < config["warmup_s"] or (
            since_pause_s is not None and since_pause_s < config["pause_holdoff_s"]
        ):
            return Verdict(held=True)
        samples: list[tuple[float, float]] = memory.setdefault("samples", [])
        # While low, the baseline is frozen: letting its old values expire would make the drop the new normal.
        while not memory.get("low") and samples and samples[0][0] < now - config["baseline_window_s"]:
            samples.pop(0)
        if len(samples) < max(1.0, config["min_samples"]):
            if new_step:
                samples.append((now, rate))
            return Verdict(held=True)
        baseline = median([value for _, value in samples])
        was_low = memory.get("low", False)
        low = rate < (config["clear_fraction"] if was_low else config["fraction"]) * baseline
        if low and not was_low:
            memory["low_since"] = now
        elif was_low and not low:
            # The baseline was frozen while low: it ages from now on as if the low span had not been.
            shift = now - memory.pop("low_since", now)
            samples[:] = [(t + shift, value) for t, value in samples]
        memory["low"] = low
        if new_step and not low:
            samples.append((now, rate))
        ratio = rate / baseline if baseline > 0 else math.inf
        numbers = {unit: rate, f"median_{unit}": baseline, "ratio": ratio, "fraction": config["fraction"]}
        words = unit.replace("_per_s", "/s")
        if low:
            message = (
                f"{words} {rate:.4g} is {ratio:.0%} of its running median {baseline:.4g} "
                f"(alert below {config['fraction']:.0%})"
            )
            return Verdict(active=[Condition(message, numbers)])
        return Verdict(normal=[Condition(f"{words} {rate:.4g}, {ratio:.0%} of its running median", numbers)])


def _rate(snapshot: records.Snapshot, memory: dict) -> tuple[float | None, str]:
    """tokens/s, or steps/s when the run has no token counts; the first one seen is kept for the whole run."""
    unit = memory.get("unit")
    if unit in (None, "tokens_per_s"):
        tokens = metric(snapshot, "tokens_per_s_median")
        if tokens is not None:
            memory["unit"] = "tokens_per_s"
            return tokens, "tokens_per_s"
        if unit is not None:
            return None, unit
    median_s = metric(snapshot, "step_time_median_s")
    if median_s is None or median_s <= 0:
        return None, unit or "steps_per_s"
    memory["unit"] = "steps_per_s"
    return 1.0 / median_s, "steps_per_s"


class LossNan(Rule):
    """The training loss is NaN or infinite (the latest value, or any since the previous snapshot). The alert names
    the step of the first NaN or infinite value of the episode, not the latest one's."""

    name = "loss_nan"
    severity = "critical"
    defaults = {"clear_after_s": 60.0}

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        count = metric(snapshot, "loss_nonfinite")
        if count is None:
            return Verdict()
        memory = state.memory
        before = memory.get("count", 0.0)
        memory["count"] = count
        point = snapshot.series.get("train_loss")
        latest = point.value if point is not None else math.nan
        if count > before and not memory.get("open"):
            # The condition starts here: its first value is the first one since the previous snapshot.
            memory["open"] = True
            memory["first_step"] = metric(snapshot, "loss_tick_nonfinite_step")
        first = memory.get("first_step") if memory.get("open") else None
        numbers = {"nonfinite_values": count, "new_nonfinite_values": count - before, "train_loss": latest}
        if point is not None and point.step is not None:
            numbers["step"] = numbers["latest_step"] = float(point.step)
        if first is not None:
            numbers["step"] = first  # the first NaN or infinite value's
        at = f" at step {first:.0f}" if first is not None else ""
        latest_at = f" at step {point.step}" if point is not None and point.step is not None else ""
        if not math.isfinite(latest):
            so_far = f"{count:.0f} NaN or infinite values so far"
            if not at or at == latest_at:
                message = f"train_loss is {latest}{latest_at} ({so_far})"
            else:
                latest_words = f", the latest{latest_at}" if latest_at else ""
                message = f"train_loss is {latest} (the first NaN or infinite value{at}; {count:.0f} so far{latest_words})"
            return Verdict(active=[Condition(message, numbers)])
        if count > before:
            first_at = f", the first{at}" if at else ""
            message = (
                f"{count - before:.0f} NaN or infinite train_loss values since the previous check{first_at}; "
                f"latest {latest:.4g}{latest_at}"
            )
            return Verdict(active=[Condition(message, numbers)])
        memory["open"] = False
        return Verdict(normal=[Condition(f"train_loss is finite again: {latest:.4g}{latest_at}", numbers)])


class LossSpike(Rule):
    """The training loss far above its recent range: above max + factor × (max − min), and at least
    ``min_rise`` × |max| above max, over the largest loss of each of the latest ``window`` snapshots.

    Spiked values stay out of the window, so a spike never widens the range it is judged by.
    """

    name = "loss_spike"
    severity = "warning"
    defaults = {"factor": 1.0, "min_rise": 0.1, "window": 60.0, "min_points": 20.0, "clear_after_s": 60.0}

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        config = state.config
        loss = metric(snapshot, "loss_tick_max")
        if loss is None:
            return Verdict(held=True)  # no new loss since the previous snapshot: nothing to judge
        window: list[float] = state.memory.setdefault("window", [])
        if len(window) < max(2.0, config["min_points"]):
            window.append(loss)
            return Verdict(held=True)
        low, high = min(window), max(window)
        limit = high + max(config["factor"] * (high - low), config["min_rise"] * abs(high))
        numbers = {"train_loss": loss, "recent_min": low, "recent_max": high, "limit": limit}
        if loss > limit:
            message = f"train_loss {loss:.4g} is far above its recent range {low:.4g}..{high:.4g} (limit {limit:.4g})"
            return Verdict(active=[Condition(message, numbers)])
        window.append(loss)
        if len(window) > config["window"]:
            del window[0 : len(window) - int(config["window"])]
        return Verdict(normal=[Condition(f"train_loss {loss:.4g} is back within range", numbers)])


class Straggler(Rule):
    """The rank that makes the others wait, and a rank that steps slower than the others.

    Under synchronous data parallel (DDP, FSDP) every rank's step time is the same, as the collectives make the fast
    ranks wait for the slow one; the slow rank is the one that waits least. The engine names it (``straggler_rank``,
    from each rank's own exposed collective wait, with its cause in ``straggler_wait_s``'s label) once the others wait
    for it more than 10% of the median step; this rule fires on that after ``collective_fire_after_s``, naming the
    rank, its host and the cause. Where ranks step on their own (pipeline stages, independent workers), a rank whose
    step-time EMA is above the median of the other ranks' by more than ``margin`` fires after ``fire_after_s``.
    """

    name = "straggler"
    severity = "warning"
    defaults = {
        "margin": 0.25,
        "min_steps": 20.0,
        "fire_after_s": 120.0,
        "collective_fire_after_s": 5.0,
        "clear_after_s": 60.0,
    }

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        config = state.config
        waited = _made_to_wait(config, snapshot)
        timed = [r for r in snapshot.ranks if r.step_time_s is not None and r.steps >= config["min_steps"]]
        if len(timed) < 2 and waited is None:
            return Verdict(held=True)
        verdict = Verdict()
        if waited is not None:
            (verdict.active if waited.fire_after_s is not None else verdict.normal).append(waited)
        named = waited.subject if waited is not None and waited.fire_after_s is not None else None
        for rank in timed if len(timed) >= 2 else []:
            others = median([r.step_time_s for r in timed if r is not rank])  # type: ignore[misc]
            step_s = rank.step_time_s
            assert step_s is not None
            ratio = step_s / others if others > 0 else math.inf
            numbers = {
                "rank": float(rank.rank),
                "step_time_s": step_s,
                "others_median_s": others,
                "ratio": ratio,
            }
            subject = f"rank {rank.rank}"
            if subject == named:
                continue  # named by the wait it causes, the stronger evidence
            if ratio > 1 + config["margin"]:
                message = (
                    f"rank {rank.rank} on {rank.host} steps in {step_s:.3g} s, {ratio:.2f} × the other ranks' "
                    f"median {others:.3g} s (alert above {1 + config['margin']:.2f} ×)"
                )
                verdict.active.append(Condition(message, numbers, subject))
            else:
                verdict.normal.append(
                    Condition(f"rank {rank.rank} at {ratio:.2f} × the others", numbers, subject)
                )
        return verdict


def _made_to_wait(config: dict[str, float], snapshot: records.Snapshot) -> Condition | None:
    """The engine's straggler as a condition: one that holds (its ``fire_after_s`` set) where a rank is named, one for
    the clear's words where ranks report collective waits and none makes the others wait; None without them."""
    wait = snapshot.metrics.get("straggler_wait_s")
    if wait is None or wait.value is None:
        return None
    rank = metric(snapshot, "straggler_rank")
    step_s = metric(snapshot, "step_time_median_s")
    numbers = {"wait_caused_s": wait.value}
    if step_s is not None:
        numbers["step_time_median_s"] = step_s
    if rank is None:
        return Condition(
            f"no rank makes the others wait ({wait.value * 1e3:.1f} ms per step at most)", numbers
        )
    numbers["rank"] = rank
    host = snapshot.metrics["straggler_rank"].label or "its host"
    cause = wait.label or "unknown"
    share = f", {wait.value / step_s:.0%} of the median step {step_s:.3g} s" if step_s else ""
    message = (
        f"rank {rank:.0f} on {host} makes the other ranks wait {wait.value * 1e3:.0f} ms per step in their "
        f"collectives{share}; cause: {cause}"
    )
    return Condition(message, numbers, f"rank {rank:.0f}", fire_after_s=config["collective_fire_after_s"])


class Died(Rule):
    """The training process ended with a non-zero exit code or a signal (from the final snapshot's exit).

    A resumed run says the same of its attempt before: an attempt that was lost (tm stopped with it, so nothing could
    say so then) is reported while the next one restarts, and the episode clears once that one steps.
    """

    name = "died"
    severity = "critical"
    defaults = {"clear_after_s": 0.0}

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        if not snapshot.final:
            return _resumed(snapshot)
        code, sig = metric(snapshot, "exit_code"), metric(snapshot, "exit_signal")
        numbers = {"steps": float(snapshot.steps)}
        if snapshot.elapsed_s is not None:
            numbers["elapsed_s"] = snapshot.elapsed_s
        if sig is not None:
            numbers["signal"] = sig
            label = snapshot.metrics["exit_signal"].label or _signal_name(int(sig))
            severity = "warning" if int(sig) in _STOP_SIGNALS else "critical"
            message = (
                f"the training process was killed by {label} (signal {sig:.0f}) after {snapshot.steps} steps"
            )
            return Verdict(active=[Condition(message, numbers, severity=severity)])  # type: ignore[arg-type]
        if code is not None and code != 0:
            numbers["exit_code"] = code
            message = f"the training process exited with code {code:.0f} after {snapshot.steps} steps"
            return Verdict(active=[Condition(message, numbers)])
        return Verdict()


#: A lost attempt is reported through the next attempt's first seconds, however fast that one steps: long enough for
#: the alerts component, started after the command, to see a snapshot of them.
_RESUMED_REPORT_S = 10.0


def _resumed(snapshot: records.Snapshot) -> Verdict:
    """A resumed run's attempt before the current one: how it ended, while this one restarts; back once it steps."""
    if len(snapshot.attempts) < 2:
        return Verdict()
    before, now = snapshot.attempts[-2], snapshot.attempts[-1]
    numbers = {"attempt": float(now.attempt)}
    if now.gap_s is not None:
        numbers["gap_s"] = now.gap_s
    if before.last_step is not None:
        numbers["steps"] = float(before.last_step)
    after = f"after step {before.last_step}" if before.last_step is not None else "before its first step"
    young_s = metric(snapshot, "since_attempt_start_s")
    restarting = now.first_step is None or (young_s is not None and young_s < _RESUMED_REPORT_S)
    if restarting and before.end == "lost":
        message = (
            f"attempt {before.attempt} of the run was lost {after}: tm stopped with the training, so no exit was "
            f"seen; attempt {now.attempt} resumes it"
        )
        return Verdict(active=[Condition(message, numbers, severity="warning")])
    if restarting and before.end.startswith(("exited", "killed")) and before.end != "exited 0":
        message = (
            f"attempt {before.attempt} of the run {before.end} {after}; attempt {now.attempt} resumes it"
        )
        return Verdict(active=[Condition(message, numbers)])
    if now.first_step is None:
        return Verdict()
    gap = f" after {now.gap_s:.0f} s down" if now.gap_s is not None else ""
    return Verdict(
        normal=[
            Condition(
                f"the run resumed: attempt {now.attempt} steps again from step {now.first_step}{gap}", numbers
            )
        ]
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
