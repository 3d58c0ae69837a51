"""The body of ``emit()``: each value read by the agent's one rule of a number (``_real_number``) and queued as a
metric; ``step=`` and ``tokens=`` declare a training step for a loop the optimizer hooks cannot see.

A value that is not a real number is refused alone, with one ``tm:`` line naming its key; the other values of the
call, and every later call, still go out.
"""

from __future__ import annotations

import time

from trainmeter_agent._real_number import NotANumber, real_number


class EmitCalls:
    """The ``emit()`` part of ``Agent`` (``_agent.py``), which mixes it in: these methods read and write the agent's
    state as ``Agent.__init__`` sets it up (its outbox, step owner and the emitted steps)."""

    def emit(self, values: dict) -> None:
        """The body of ``trainmeter_agent.emit``: values checked, queued, flushed in batches. Never raises."""
        if not self.emit_on:
            return
        try:
            if self._faults:
                self.check_fault("emit")
            if "step" in values or "tokens" in values:
                step = self._emit_step(values)
                if not values:
                    return
            else:
                step = self.current_step()
            bad = None
            for key, value in values.items():
                kind = type(value)
                if kind is float:
                    continue
                if kind is int or kind is bool:  # real_number's own first lane, without its call
                    try:
                        values[key] = float(value)
                        continue
                    except OverflowError:
                        pass  # an int beyond a float's range: real_number refuses it, with its line
                number = self._number(key, value)
                if number is None:
                    bad = [key] if bad is None else [*bad, key]
                else:
                    values[key] = number
            if bad is not None:
                for key in bad:
                    del values[key]
                if not values:
                    return
            now = time.monotonic()
            self._queue_metric(now, values, step, "emit")
        except Exception as exc:
            self.stop_probe("emit", exc)

    def _number(self, key: str, value: object) -> float | None:
        """The float ``real_number`` reads from a value, or None to skip it, with one line naming the key (said once
        per key)."""
        try:
            return real_number(value)
        except NotANumber as refused:
            advice = refused.advice.format(key=key)
            self.say(f"emit({key}=...) got {refused.got}: {advice}", key)
            return None

    def _emit_step(self, values: dict) -> int | None:
        """``emit(step=..., tokens=...)``: a declared step (loops without torch.optim) or tokens for the next one.

        Returns the step that labels the call's other values. Where the optimizer hooks watch but have not counted
        an iteration yet, a declared step waits: a second one declared before any optimizer step proves the loop
        steps without torch.optim (both are then sent); an optimizer step first makes the hooks the step clock.
        """
        step = values.pop("step", None)
        tokens = values.pop("tokens", None)
        if tokens is not None:
            tokens = self._count(tokens, "tokens")
        if step is not None:
            step = self._count(step, "step")
        if step is None:
            if tokens is not None:  # tokens of the iteration the optimizer hooks will count next
                self._pending_tokens = (self._pending_tokens or 0) + tokens
            return self.current_step()
        if self._step_owner == "hooks":
            if tokens is not None:
                self._pending_tokens = (self._pending_tokens or 0) + tokens
            return step  # the loop's own step number labels its metrics
        now = time.monotonic()
        if self._step_owner is None and self.iterations.watching and not self.iterations.counted:
            waiting = self._waiting_step
            if waiting is None or waiting[0] == step:
                if waiting is None:
                    self._waiting_step = (step, now, tokens)
                elif tokens is not None:
                    self._waiting_step = (step, waiting[1], (waiting[2] or 0) + tokens)
                return step
            self._waiting_step = None
            self._step_owner = "emit"
            self._send_emitted_step(*waiting)
        if self._step_owner != "emit":  # set once: each assignment recomputes the gates
            self._step_owner = "emit"
        self._send_emitted_step(step, now, tokens)
        return step

    def _send_emitted_step(self, step: int, now: float, tokens: int | None) -> None:
        if step == self._last_emitted_step:
            return  # several emit calls for one step declare it once
        fields: dict = {"step": step, "t": now}
        if self._last_emitted_step_t is None:
            fields["absent"] = {"step_time_s": "first step"}
        else:
            fields["step_time_s"] = now - self._last_emitted_step_t
        if tokens is not None:
            fields["tokens"] = tokens
            fields["tokens_source"] = "emitted"
        self._last_emitted_step, self._last_emitted_step_t = step, now
        self._queue_record(self._rec_module().Step(**fields), now)

    def _count(self, value: object, key: str) -> int | None:
        """An int from ``step=`` or ``tokens=`` (an int, or an integral float or 0-dim CPU tensor), else None."""
        try:
            number = float(value) if type(value) in (int, float) else self._number(key, value)
        except OverflowError:
            number = self._number(key, value)  # an int beyond a float's range: refused, with its line
        # NaN and infinities fail the range test; the range keeps int() from raising.
        if number is None or not 0 <= number < 2.0**63 or number != int(number):
            if number is not None:
                self.say(f"emit({key}=...) got {value!r}: pass a whole number >= 0", key)
            return None
        return int(number)
