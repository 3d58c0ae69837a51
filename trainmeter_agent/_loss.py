"""The loss without a line of code: the 0-dim tensor a loop passes to ``backward()``, sent as ``train_loss``.

It wraps ``torch.autograd.backward`` (which ``Tensor.backward`` calls) and ``GradScaler.scale``. A CPU loss is read at
once; a CUDA loss is copied without blocking into pinned host memory behind an event and read at a later step, once
the event has completed. It never synchronizes or allocates on a device, reads nothing during CUDA-graph capture or
torch.compile tracing, and never lets an error reach the loop: the user's own exceptions pass through untouched.
"""

from __future__ import annotations

import collections
import weakref
from time import perf_counter

from trainmeter_agent._compiling import eager_check, eager_flag_holder
from trainmeter_agent._gates import gate_input

#: The metric's origin: the engine lets a tracker's or ``emit``'s own train loss win over this one.
ORIGIN = "backward"
#: Loss copies in flight per dtype and device. A loop running this many backward calls ahead of its GPU loses the
#: newest losses (said in ``probe.loss``) rather than overwriting a copy that has not landed.
PINNED_SLOTS = 256
#: Backward calls kept for one iteration at most: a loop that never steps a torch.optim optimizer groups nothing.
MAX_CALLS_PER_ITERATION = 4096
ATTACHED = "attached"


class _PinnedRing:
    """Pinned host slots for one dtype on one CUDA device, each with its event; taken and given back one by one."""

    def __init__(self, torch, dtype, device) -> None:
        self.host = torch.empty(PINNED_SLOTS, dtype=dtype, pin_memory=True)  # host memory, allocated once
        self.views = list(self.host.unbind())
        self.events = [torch.cuda.Event() for _ in range(PINNED_SLOTS)]
        self.stream_of = torch.cuda.current_stream
        self.device = device
        self.free = list(range(PINNED_SLOTS - 1, -1, -1))

    def copy(self, tensor) -> int | None:
        """Queue a copy of the 0-dim ``tensor`` on its stream, then an event; the slot, or None if all are in use."""
        if not self.free:
            return None
        slot = self.free.pop()
        self.views[slot].copy_(tensor, non_blocking=True)
        self.events[slot].record(self.stream_of(self.device))
        return slot

    def landed(self, slot: int) -> bool:
        return self.events[slot].query()  # cudaEventQuery: never waits

    def read(self, slot: int) -> float:
        value = self.views[slot].item()  # a pinned CPU tensor: reading it touches no device
        self.free.append(slot)
        return value


class LossProbe:
    """Collects the losses passed to backward in each iteration and sends their sum once every one is readable."""

    # The states the agent's gates read (``_gates.py``): backward()'s short way runs while ``fast``.
    on = gate_input("on")
    _said = gate_input("_said", "the latest probe.loss state")
    eager = gate_input(
        "eager", "torch.compile never called: the compile flag is read from torch.compiler itself"
    )

    def __init__(self, agent) -> None:
        self.agent = agent
        self.iterations = agent.iterations  # the same object for the agent's life (a fork child resets it)
        self.fast = False
        self.eager = False
        self._compiler = None  # torch.compiler while eager
        self.on = True
        self._torch = None
        self._tensor_type: type | tuple = ()  # torch.Tensor, once attached
        self._is_compiling = lambda: False
        self._capturing = lambda: False
        self._depth = 0  # backward calls in progress: a nested one (reentrant checkpoint) is not the loop's
        self._scaled: tuple[object, object] | None = None  # (weakref to GradScaler.scale's output, its input)
        self._rings: dict[tuple, _PinnedRing] = {}
        # Iterations whose losses are not all readable yet, in order: (step or None, entries, backward calls).
        self._pending: collections.deque = collections.deque()
        self._labelled: int | None = None  # backward calls per iteration the label fact describes
        self._said = None
        self.reset_iteration()

    def _regate(self) -> None:
        self.agent.regate()

    def reset_iteration(self) -> None:
        self._calls = 0
        self._entries: list = []  # floats (CPU) and (ring, slot) pairs (CUDA)
        self._copies = False  # whether an entry is a copy in flight
        self._why: str | None = None  # why this iteration has no loss

    # -- attaching ------------------------------------------------------------------------------------------------

    def attach(self, torch) -> None:
        """Wrap ``torch.autograd.backward`` and ``GradScaler.scale``; torch is already imported by the user."""
        self._torch = torch
        self._tensor_type = torch.Tensor
        self._is_compiling = eager_check(torch)  # torch's own check once torch.compile is called (Phases)
        self._compiler = eager_flag_holder(torch)
        self.eager = self._compiler is not None
        cuda = getattr(torch, "cuda", None)
        self._capturing = getattr(cuda, "is_current_stream_capturing", self._capturing)
        autograd = torch.autograd
        original = autograd.backward
        if not getattr(original, "_tm_wrapped", False):
            autograd.backward = _wrap_backward(original, self)
        self._wrap_scale()
        self._say("not attached: no backward() seen yet")

    def _wrap_scale(self) -> None:
        """``GradScaler.scale``: its input is the loss before scaling, read instead of the scaled one."""
        import sys

        for module_name in ("torch.amp.grad_scaler", "torch.cuda.amp.grad_scaler"):
            module = sys.modules.get(module_name)
            scaler_class = getattr(module, "GradScaler", None) if module is not None else None
            original = scaler_class.__dict__.get("scale") if scaler_class is not None else None
            if original is None or getattr(original, "_tm_wrapped", False):
                continue
            scaler_class.scale = _wrap_scale(original, self)

    # -- what the wrappers see ------------------------------------------------------------------------------------

    def scaled(self, outputs, result) -> None:
        """GradScaler.scale(outputs) returned ``result``: remember the pair (a detached view: no graph kept alive)."""
        torch = self._torch
        if isinstance(outputs, torch.Tensor) and isinstance(result, torch.Tensor) and result is not outputs:
            self._scaled = (weakref.ref(result), outputs.detach())
        else:
            self._scaled = None

    def backward_ran(self, tensors) -> None:
        """The outermost backward returned: its root's value (or why there is none) joins the iteration."""
        agent = self.agent
        started = perf_counter()
        try:
            if agent._faults:
                agent.check_fault("loss")
            if self._is_compiling() or agent._step_owner == "emit":
                return  # traced, not run; or steps the loop declares itself, which the losses cannot be grouped by
            tensor_type = self._tensor_type
            if isinstance(tensors, tensor_type):
                root, roots = tensors, 1
            elif isinstance(tensors, (list, tuple)):
                roots = len(tensors)
                root = tensors[0] if roots == 1 else None
            else:
                root, roots = tensors, 1
            is_tensor = isinstance(root, tensor_type)
            if is_tensor and root.is_meta:
                return  # a shape-only run (the FLOP count's meta copy): no loss there
            if self._calls >= MAX_CALLS_PER_ITERATION:
                self._why = f"more than {MAX_CALLS_PER_ITERATION} backward() calls without an optimizer step"
                if self._copies:  # their slots return once landed
                    self._pending.append((None, self._entries, self._calls))
                self._entries, self._copies = [], False
                return
            self._calls += 1
            if self._why is not None:
                return
            if root is None:
                self._why = f"backward() was called on {roots} tensors at once: several backward roots"
            elif not is_tensor:
                self._why = f"backward() was called on a {type(root).__name__}, not a tensor"
            elif root.dim() != 0 or not root.is_floating_point():
                self._why = (
                    f"the tensor passed to backward() is {str(root.dtype).replace('torch.', '')} of shape "
                    f"{tuple(root.shape)}, not a 0-dim floating-point loss"
                )
            else:
                self._read(root)
        except Exception as exc:
            agent.stop_probe("loss", exc)
        finally:
            agent.iterations._agent_s += perf_counter() - started

    def _read(self, root) -> None:
        value = root
        scaled = self._scaled
        if scaled is not None:
            self._scaled = None
            if scaled[0]() is root:
                value = scaled[1]  # the loss before GradScaler multiplied it by its scale
        if root.is_cpu:
            self._entries.append(value.item())
        elif root.is_cuda:
            if self._capturing():
                self._why = "backward() ran inside CUDA-graph capture: its loss is never read"
                return
            device = root.device
            key = (value.dtype, device)
            ring = self._rings.get(key)
            if ring is None:
                ring = self._rings[key] = _PinnedRing(self._torch, value.dtype, device)
            slot = ring.copy(value.detach())
            if slot is None:
                self._why = (
                    f"{PINNED_SLOTS} loss copies still in flight: the loop runs too far ahead of its GPU"
                )
            else:
                self._entries.append((ring, slot))
                self._copies = True
        else:
            self._why = (
                f"the loss is on {root.device.type}: tm reads a loss from backward() on the CPU and CUDA only"
            )

    # -- iterations -----------------------------------------------------------------------------------------------

    def end_iteration(self, fields: dict) -> None:
        """The optimizer stepped (step record ``fields``): close this iteration's losses, send those now readable."""
        self.end_step(fields["step"], fields.get("micro_batches"))

    def end_step(self, step: int, micro_batches: int | None) -> None:
        """Step ``step`` ended with ``micro_batches`` forwards seen (None: unknown): as ``end_iteration``."""
        calls, entries, why, copies = self._calls, self._entries, self._why, self._copies
        if calls:
            self.reset_iteration()
            if why is None and micro_batches is not None and calls != micro_batches:
                why = (
                    f"{calls} backward() calls for {micro_batches} micro-batches: several backward roots in one "
                    "iteration"
                )
            if why is not None:
                self._say(f"not attached: {why}")
                if copies:
                    # Nothing to send; the slots return once their copies have landed.
                    self._pending.append((None, entries, calls))
            elif not copies and not self._pending:
                self._send(step, sum(entries), calls)  # CPU values, nothing waiting before them
                return
            elif entries:
                self._pending.append((step, entries, calls))
        if self._pending:
            self.poll()

    def poll(self) -> None:
        """Send, in order, every pending iteration whose copies have all landed; the first one not landed waits."""
        pending = self._pending
        while pending:
            step, entries, calls = pending[0]
            for entry in entries:
                if type(entry) is tuple and not entry[0].landed(entry[1]):
                    return
            pending.popleft()
            total = 0.0
            for entry in entries:
                total += entry if type(entry) is float else entry[0].read(entry[1])
            if step is not None:
                self._send(step, total, calls)

    def _send(self, step: int, total: float, calls: int) -> None:
        if self._said is not ATTACHED:
            self._say(ATTACHED)
        if self._labelled != calls:
            self._label(calls)
        self.agent.tapped(ORIGIN, {"train_loss": total}, step)

    def _say(self, state: str) -> None:
        self._said = state
        self.agent.probe_state("loss", state)  # sent only when it changes

    def _label(self, calls: int) -> None:
        """Say once (and again when it changes) what ``train_loss`` from backward is, and what it assumes."""
        self._labelled = calls
        note = "the 0-dim tensor passed to backward() in each iteration, before GradScaler's scaling"
        if calls > 1:
            note = (
                f"the sum of the {calls} 0-dim tensors passed to backward() in each iteration, before GradScaler's "
                f"scaling; assumes the loop divides each micro-batch loss by {calls}"
            )
        self.agent.fact("loss_from_backward", calls, "loss", unit="backward calls/step", note=note)

    def after_fork(self) -> None:
        """A fork child starts with nothing pending (its parent's copies are the parent's)."""
        self._pending = collections.deque()
        self._rings = {}
        self._scaled = None
        self._depth = 0
        self.reset_iteration()


def _wrap_backward(original, probe: LossProbe):
    """``torch.autograd.backward`` that tells the probe about its root after the real one returned.

    The user's exceptions (and a KeyboardInterrupt) pass through untouched: the ``finally`` only restores the depth,
    and a backward that raised adds no loss. Calls nested in another backward (a reentrant checkpoint) are skipped.
    """

    def backward(*args, **kwargs):
        probe._depth += 1
        try:
            result = original(*args, **kwargs)
        finally:
            probe._depth -= 1
        if probe._depth:
            return result
        tensors = args[0] if args else kwargs.get("tensors")
        if probe.fast:
            # The common case, in place: a 0-dim CPU floating-point loss with no scaler, read as backward_ran reads it
            # (``probe.fast``: the probe on, no fault to inject, the steps not the loop's own, torch.compile never
            # called).
            iterations = probe.iterations
            timed = iterations.timed
            if timed:
                started = perf_counter()
            try:
                if (
                    type(tensors) is probe._tensor_type
                    and probe._scaled is None
                    and probe._why is None
                    and probe._calls < MAX_CALLS_PER_ITERATION
                    and not probe._compiler._is_compiling_flag
                    and tensors.is_cpu
                    and tensors.ndim == 0
                    and tensors.dtype.is_floating_point
                ):
                    probe._entries.append(tensors.item())
                    probe._calls += 1
                    if timed:
                        iterations._agent_s += perf_counter() - started
                    return result
            except Exception as exc:
                probe.agent.stop_probe("loss", exc)
                return result
        if probe.on:
            probe.backward_ran(tensors)
        return result

    backward.__wrapped__ = original
    backward._tm_wrapped = True
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(backward, attr, getattr(original, attr, None))
    return backward


def _wrap_scale(original, probe: LossProbe):
    def scale(self, outputs):
        result = original(self, outputs)
        if probe.on:
            try:
                probe.scaled(outputs, result)
            except Exception as exc:
                probe.agent.stop_probe("loss", exc)
        return result

    scale.__wrapped__ = original
    scale._tm_wrapped = True
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(scale, attr, getattr(original, attr, None))
    return scale
