"""The agent's step records: one per training iteration the optimizer hooks see, built the general way from a field
dict or the steady way straight from the probes' per-iteration state, and now and then the agent's own cost as a fact.

``send_steady_step`` is the hot path of every iteration (docs/architecture.md, "What an iteration costs"): it reads
the probes' state itself instead of calling them, and ``tests/e2e/test_agent_depth.py`` checks both ways send the same.
"""

from __future__ import annotations

import math
import time
from array import array
from time import monotonic

from trainmeter_agent._iterations import AGENT_US_EVERY

#: The overhead fact goes out at the first timed step, then every OVERHEAD_EVERY steps (a timed one too) once
#: OVERHEAD_MIN_S passed since the last: a fast loop's 256 steps take a few milliseconds, and each fact is a record for
#: every process of tm (the engine works out what the facts imply again: 0.26 ms, about 1 µs a step at 4,000 steps/s).
OVERHEAD_FIRST, OVERHEAD_EVERY = AGENT_US_EVERY, 16 * AGENT_US_EVERY
OVERHEAD_MIN_S = 1.0

# The agent's overhead sums (``overhead_sums``): the µs of its timed steps since the last overhead fact, how many, and
# the time of that fact's step
_SUM_US, _STEPS, _FACT_T = 0, 1, 2


def overhead_sums() -> array:
    """The agent's overhead sums before any step: nothing timed, no fact yet."""
    return array("d", (0.0, 0.0, -math.inf))


class StepRecords:
    """The step records' part of ``Agent`` (``_agent.py``), which mixes it in: these methods read and write the agent's
    state as ``Agent.__init__`` sets it up (its probes, outbox, step owner and the steady step's gates)."""

    def send_step(self, fields: dict) -> None:
        """A step record from the optimizer hooks, queued after the metrics emitted before it."""
        if self._step_owner is None:
            self._step_owner = "hooks"
            waiting, self._waiting_step = self._waiting_step, None
            if waiting is not None and waiting[2] is not None:
                self._pending_tokens = (self._pending_tokens or 0) + waiting[2]
        elif self._step_owner != "hooks":
            return  # the loop declares its own steps with emit(step=...): those win over detected ones
        if self.model is not None and "model" not in self.stopped:
            try:
                self.model.end_iteration(fields)
                if not self.flops.done:
                    self.flops.end_iteration(fields, self.model)
            except Exception as exc:
                self.stop_probe("model", exc)
        if self.loss is not None and self.loss.on:
            try:
                self.loss.end_iteration(fields)  # after the model's: it reads the micro-batch count
            except Exception as exc:
                self.stop_probe("loss", exc)
        if self._pending_tokens is not None:
            fields["tokens"] = self._pending_tokens
            fields["tokens_source"] = "emitted"
            self._pending_tokens = None
            absent = fields.get("absent")
            if absent and "tokens" in absent:
                fields["absent"] = {k: v for k, v in absent.items() if k != "tokens"}
        if fields.get("tokens") is not None and fields.get("dp") is not None:
            fields["tokens_global"] = fields["tokens"] * fields["dp"]
        self._queue_record(self._rec_module().Step(**fields), fields.get("t") or time.monotonic())
        self._count_overhead(fields)

    def send_steady_step(
        self, step: int, t: float, step_time_s: float, optimizers: int, agent_us: float | None
    ) -> bool:
        """The step record of a steady iteration, the same record ``send_step`` would build, without its field dict.

        Steady (``iterations.steady``, and this iteration's own terms asked here): the hooks own the steps, no emitted
        tokens wait, no FLOP count ends here and the model probe saw this iteration's forward and its dp (its tokens,
        or that a forward had no token ids: then the step has no count, as the general way says).
        Then what ``ModelProbe.end_iteration`` and ``LossProbe.end_step`` would add is read from their per-iteration
        state here, in one function: on a tight loop every call and line of an iteration shows (docs/architecture.md,
        "What an iteration costs"), and ``tests/e2e/test_agent_depth.py`` checks that both ways send the same records.
        False (nothing changed) sends the iteration down ``send_step``.
        """
        model = self._steady_model
        if model is None:
            return False
        try:
            if (
                not model.micro_batches
                or model.profiled
                or self._pending_tokens is not None
                or model._profiler_on()
            ):
                return False
        except Exception as exc:
            self.stop_probe("model", exc)
            return False
        micro_batches = model.micro_batches
        if model.tokens_missing:
            # A micro-batch without token ids (a model fed floats): the step has no count, as end_iteration says,
            # and its row none (the outbox's block says why once).
            tokens = tokens_source = None
            model.tokens_missing = False
        else:
            tokens, tokens_source = model.tokens, model.tokens_source
        model.micro_batches = 0
        model.tokens = 0
        model.tokens_source = None
        loss_value = loss_t = None
        outbox = self.outbox
        if self._loss_on:
            loss = self._steady_loss
            try:
                if (
                    loss is not None
                    and loss._calls == micro_batches
                    and loss._why is None
                    and not loss._copies
                    and not loss._pending
                    and loss._labelled == micro_batches
                ):
                    # One CPU value per micro-batch, nothing pending, its label and state already said: the loss
                    # leaves with the step (LossProbe.end_step would send it at once).
                    # sum() of one float is 0.0 plus it, which this is (-0.0 and NaN included) without the
                    # builtin's C code: torch's work leaves it cold, and on a tight loop it cost about 1 µs a step.
                    entries = loss._entries
                    loss_value = entries[0] + 0.0 if micro_batches == 1 else sum(entries)
                    loss._calls = 0  # LossProbe.reset_iteration: why and copies are already None and False
                    entries.clear()  # nobody else holds it: nothing is pending
                    # The row stands for two records: the loss metric, then the step.
                    loss_t = monotonic()
                else:
                    self.loss.end_step(step, micro_batches)  # queues its own metric, before the step record
            except Exception as exc:
                self.stop_probe("loss", exc)
        # One row of the window's columns for the metric and the step record (records.Block stands for both).
        outbox.put_step(
            step,
            t,
            step_time_s,
            optimizers,
            agent_us,
            micro_batches,
            tokens,
            tokens_source,
            model.dp,
            loss_value,
            loss_t,
        )
        if agent_us is not None:
            overhead = self._overhead
            overhead[_SUM_US] += agent_us
            overhead[_STEPS] += 1.0
            if step == OVERHEAD_FIRST or (  # timed steps, both
                step % OVERHEAD_EVERY == 0 and t - overhead[_FACT_T] >= OVERHEAD_MIN_S
            ):
                self._overhead_fact(step, t)
        return True

    def _count_overhead(self, fields: dict) -> None:
        """Now and then, the agent's own cost per step as a fact (with the drops so far) for the dashboard."""
        agent_us = fields.get("agent_us")
        if agent_us is not None and not fields.get("profiled"):
            # A counted step holds the FLOP counter's one-off cost, not the agent's steady one.
            overhead = self._overhead
            overhead[_SUM_US] += agent_us
            overhead[_STEPS] += 1.0
        step = fields["step"]
        t = fields.get("t") or time.monotonic()
        if step == OVERHEAD_FIRST or (
            step % OVERHEAD_EVERY == 0 and t - self._overhead[_FACT_T] >= OVERHEAD_MIN_S
        ):
            self._overhead_fact(step, t)

    def _overhead_fact(self, step: int, t: float) -> None:
        overhead = self._overhead
        steps = int(overhead[_STEPS])
        if not steps:
            return  # no timed iteration since the last one (AGENT_US_EVERY)
        mean_us = overhead[_SUM_US] / steps
        dropped = getattr(self.producer, "dropped", 0)
        note = f"mean over {steps} steps up to {step}; records dropped so far: {dropped}"
        self.fact("agent_overhead_us", mean_us, "steps", unit="us/step", note=note)
        overhead[_SUM_US] = overhead[_STEPS] = 0.0
        overhead[_FACT_T] = t
