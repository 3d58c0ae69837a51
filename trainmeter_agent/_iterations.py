"""Training iterations, seen through torch's global optimizer step hooks and GradScaler's skipped steps.

An iteration is the first ``Optimizer.step`` after a backward pass; a backward is read from the gradients' identity
and version counter, never by patching autograd. Nothing here imports torch (it attaches once the user's code has),
reads a tensor's value, synchronizes a device, or lets an error reach the training loop. The one number it reads is a
restored optimizer's ``step`` at a process's first iteration, and only from a CPU tensor or a plain number.
"""

from __future__ import annotations

import sys
import weakref
from time import monotonic, perf_counter

from trainmeter_agent._gates import gate_input

#: The agent times itself (``agent_us``) in one iteration of this many: the iterations whose step is a multiple of it.
#: Two clock reads in each hook of every iteration were a tenth of what the agent added to a tight loop's iteration;
#: one in 16 gives the same mean, and 16 is no multiple of the decimal periods a loop evaluates or logs at.
AGENT_US_EVERY = 16
#: Steps of the steady lane, in a row, that left their optimizer's first gradient as they found it (same object, same
#: version) before the lane stops calling the post-hook: the pre-hook then writes the mark the post-hook would write.
POSTLESS_AFTER = 3


def restored_step(optimizer: object) -> int | None:
    """The ``step`` an optimizer's state holds before this process stepped it: the step a resumed training loaded from
    its checkpoint (``load_state_dict``), or None (a fresh optimizer's state is empty until its first step).

    Read from the first parameter that has state, and only from a CPU tensor or a number: reading a tensor on a device
    would synchronize it (a fused or capturable Adam keeps its step there: then the step stays unknown)."""
    state = getattr(optimizer, "state", None)
    if not state:
        return None
    for group in optimizer.param_groups:
        for param in group["params"]:
            entry = state.get(param)
            if not entry or "step" not in entry:
                continue
            step = entry["step"]
            if isinstance(step, (int, float)) and not isinstance(step, bool):
                value = step
            elif getattr(getattr(step, "device", None), "type", None) == "cpu" and step.numel() == 1:
                value = step.item()
            else:
                return None
            return int(value) if value >= 1 and value == int(value) else None
    return None


def _first_grad(optimizer: object):
    """The gradient of the optimizer's first parameter that has one, or None."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            grad = param.grad
            if grad is not None:
                return grad
    return None


class IterationDetector:
    """Groups optimizer steps into iterations and hands each new one to the agent as a step record.

    An optimizer stepping with fresh gradients starts a new iteration if it already stepped in the current one,
    and joins the current one otherwise: Muon with AdamW, or a GAN's D and G, count once per loop iteration. A
    step GradScaler skipped (inf/NaN gradients) starts or joins an iteration the same way, marked skipped.
    """

    #: Whether the hooks count steps (False once the steps probe stopped); a gate input (``_gates.py``).
    steps_on = gate_input("steps_on")

    def __init__(self, agent) -> None:
        self.agent = agent
        self.lane_on = False  # steps_on, read by the lane without the property
        # The agent's gate: the steady step may be sent the short way (Agent.send_steady_step).
        self.steady = False
        self.steps_on = True
        self.scaler_on = True
        self.attached = False
        self._pre_handle = None
        self._post_handle = None
        self._postless = False  # attached, and the lane goes without the post-hook (see _lane_postless)
        self._register_post = None  # torch's register_optimizer_step_post_hook, once attached
        # Whether the lane may still go without the post-hook: once it had to take it back, it keeps it.
        self._postless_allowed = True
        self.reset()

    def reset(self) -> None:
        """Forget every count (a fork child starts from zero)."""
        # The step number: this process's iterations, after the step a resumed training loaded.
        self.iteration = 0
        self.counted = 0  # iterations counted in this process
        self.pre_calls = 0  # optimizer.step entries ever: GradScaler's wrapper compares it around its call
        # id(optimizer) -> [a weakref to it, a weakref to its first gradient, that gradient's version]: a list, which the
        # steady lane writes in place (a tuple per step would be an object per step, and tracemalloc's count of them
        # at a line would depend on whether each came from the free list: tests/e2e/test_agent_steady_alloc.py)
        self._marks: dict[int, list] = {}
        self._members: set[int] = set()  # optimizers that stepped in the current iteration
        self._closure_steps: set[int] = set()  # optimizers inside a step(closure) call
        self._calls = 0  # optimizer.step calls (skipped ones included) in the current iteration
        self._iteration_start_t: float | None = None
        self._agent_s = 0.0  # the agent's own time in the current iteration (counted where ``timed``)
        # Whether the hooks' short ways time themselves in this iteration (``AGENT_US_EVERY``); the general ways always
        # do, and a step record carries ``agent_us`` only for a timed iteration.
        self.timed = False
        # The steady lane: id() of the one optimizer that makes up each iteration, once it has counted one (None
        # otherwise). Its hooks then take a short way with the same outcome as the general one (see ``pre_hook``).
        self._lane: int | None = None
        # ``_marks`` of the lane's optimizer (None while it has none): the lane's hooks read it here, one object less
        # for an iteration to touch (``_lane_marked`` keeps it so)
        self._lane_mark: list | None = None
        # Steps in a row of the lane that left the first gradient as they found it: its id() and version in the
        # pre-hook, compared in the post-hook (ids only: the gradient lives through the step; no reference is kept).
        self._clean_steps = 0
        self._seen_grad = 0
        self._seen_version = -1

    def _lane_marked(self) -> None:
        """``_lane_mark`` again, after the lane or the marks changed (a mark's list is changed in place by both ways)."""
        self._lane_mark = self._marks.get(self._lane) if self._lane is not None else None

    def _regate(self) -> None:
        self.lane_on = self.steps_on
        self.agent.regate()

    @property
    def watching(self) -> bool:
        """Whether the optimizer hooks are attached and counting."""
        return self.attached and self.steps_on

    # -- the hooks (called by torch inside Optimizer.step) ---------------------------------------------------------

    def pre_hook(self, optimizer: object, args: object, kwargs: object) -> None:
        self.pre_calls += 1
        key = id(optimizer)
        if key == self._lane and self.lane_on and len(args) == 1 and not kwargs:
            # The steady lane: the optimizer that alone makes up each iteration, stepped without a closure. What
            # _grads_changed and _count decide for it, decided in place: its first parameter's gradient is the first
            # gradient, and a new one (or a bumped version) starts the next iteration. Anything else goes the
            # general way below, from the same state. One clock here, monotonic, for the step's time and the agent's
            # own (perf_counter reads the same clock on Linux).
            now = monotonic()
            try:
                params = optimizer.param_groups[0]["params"]
                grad = params[0].grad if params else None
                mark = self._lane_mark
                if grad is not None and mark is not None and mark[0]() is optimizer:
                    version = grad._version
                    same = mark[1]() is grad
                    if same and version == mark[2]:
                        self._calls += 1  # stepped again without a backward: the same iteration
                        if self.timed:
                            self._agent_s += monotonic() - now
                        return None
                    if self._postless:
                        # No post-hook (_lane_postless): its mark, written here, as it would find it after the step.
                        if not same:
                            mark[1] = weakref.ref(grad)
                        mark[2] = version
                    else:
                        self._seen_grad, self._seen_version = id(grad), version
                    # A new iteration: what _count does for an optimizer alone in the iteration that ends, which is
                    # neither the first nor skipped.
                    previous_start_t = self._iteration_start_t
                    previous_calls = self._calls
                    timed = self.timed
                    previous_agent_s = self._agent_s
                    self.counted += 1
                    step = self.iteration = self.iteration + 1
                    self._calls = 1
                    self._iteration_start_t = now
                    self._agent_s = 0.0
                    self.timed = (step + 1) % AGENT_US_EVERY == 0
                    agent_us = (previous_agent_s + (monotonic() - now)) * 1e6 if timed else None
                    if not self.agent.send_steady_step(
                        step, now, now - previous_start_t, previous_calls, agent_us
                    ):
                        self._send_fields(now, previous_start_t, previous_calls, agent_us, None, False)
                    if self.timed:
                        # What is left of this call belongs to the new iteration (as _count and pre_hook count it).
                        self._agent_s = monotonic() - now
                    return None
            except Exception as exc:
                self.agent.stop_probe("steps", exc)
                return None
        if not self.steps_on:
            return None  # a hook that returns something replaces the step's arguments: always None
        started = perf_counter()
        try:
            if self._postless:
                self._take_post_hook_back()  # in time for this step: torch reads its post-hooks after the step
            agent = self.agent
            if agent._faults:
                agent.check_fault("steps")
            self._calls += 1
            closure = args[1] if len(args) > 1 else (kwargs.get("closure") if kwargs else None)
            if closure is not None:
                # step(closure): forward and backward run inside the step, so the post-hook counts it (Lightning).
                self._closure_steps.add(id(optimizer))
            elif self._grads_changed(optimizer):
                self._count(optimizer, skipped=False, started=started)
        except Exception as exc:
            self.agent.stop_probe("steps", exc)
        self._agent_s += perf_counter() - started
        return None

    def post_hook(self, optimizer: object, args: object, kwargs: object) -> None:
        if not self.steps_on:
            return None
        started = perf_counter()
        try:
            key = id(optimizer)
            if key == self._lane and not self._closure_steps:
                # The steady lane (see pre_hook): the mark the general way would write, written in place.
                params = optimizer.param_groups[0]["params"]
                grad = params[0].grad if params else None
                mark = self._lane_mark
                if grad is not None and mark is not None and mark[0]() is optimizer:
                    if mark[1]() is not grad:
                        mark[1] = weakref.ref(grad)
                    version = mark[2] = grad._version
                    # What this step's pre-hook saw (0 if it went another way), compared once.
                    seen, self._seen_grad = self._seen_grad, 0
                    if id(grad) == seen and version == self._seen_version:
                        self._clean_steps += 1
                        if self._clean_steps >= POSTLESS_AFTER and self._postless_allowed and self.attached:
                            self._lane_postless()
                    else:
                        self._clean_steps = 0
                    self._agent_s += perf_counter() - started
                    return None
            if self._closure_steps and key in self._closure_steps:
                self._closure_steps.discard(key)
                if self._grads_changed(optimizer):
                    self._count(optimizer, skipped=False, started=started, stepped=True)
            grad = _first_grad(optimizer)
            if grad is None:
                self._marks.pop(key, None)
            else:
                mark = self._marks.get(key)
                if mark is not None and mark[0]() is optimizer:
                    # The same gradient object (zero_grad(set_to_none=False)) keeps its weakref: only its version moves.
                    if mark[1]() is not grad:
                        mark[1] = weakref.ref(grad)
                    mark[2] = grad._version
                else:
                    self._marks[key] = [weakref.ref(optimizer), weakref.ref(grad), grad._version]
            self._lane_marked()
        except Exception as exc:
            self.agent.stop_probe("steps", exc)
        self._agent_s += perf_counter() - started
        return None

    def skipped_step(self, optimizer: object) -> None:
        """GradScaler did not call ``optimizer.step`` (inf/NaN gradients): the iteration still counts, skipped."""
        if not self.steps_on:
            return
        started = perf_counter()
        self._calls += 1
        self._count(optimizer, skipped=True, started=started)

    def _grads_changed(self, optimizer: object) -> bool:
        """Whether a backward ran since this optimizer's last step: another gradient object, or a bumped version."""
        grad = _first_grad(optimizer)
        if grad is None:
            return False  # nothing to apply: no backward reached this optimizer
        mark = self._marks.get(id(optimizer))
        if mark is None or mark[0]() is not optimizer:
            return True
        return mark[1]() is not grad or grad._version != mark[2]

    def _count(self, optimizer: object, *, skipped: bool, started: float, stepped: bool = False) -> None:
        key = id(optimizer)
        if self.counted and key not in self._members:
            self._members.add(key)
            self._lane = None  # two optimizers make up this iteration
            self._lane_marked()
            return
        # A new iteration; its step record describes the one that just ended.
        previous_start_t = self._iteration_start_t
        previous_calls = self._calls - 1
        agent_us = (self._agent_s + (perf_counter() - started)) * 1e6 if self.timed else None
        resumed = None
        if not self.counted:
            # A process's first iteration: an optimizer restored from a checkpoint goes on from its step (after a
            # step(closure) the state already counts this one).
            resumed = restored_step(optimizer)
            if resumed is not None and stepped:
                resumed = resumed - 1 if resumed > 1 else None
            if resumed is not None:
                self.iteration = resumed
            if self.agent.model is not None:
                # Once: what the optimizer steps says which module is the model (``_model_owner.py``).
                self.agent.model.first_optimizer_step(optimizer)
        self.counted += 1
        self.iteration += 1
        if len(self._members) != 1 or key not in self._members:
            self._members = {key}
        # From the next iteration on, this optimizer alone may take the steady lane (its hooks' short way).
        agent = self.agent
        self._lane = key if agent.lean and "steps" not in agent._faults else None
        self._lane_marked()
        self._calls = 1
        self._agent_s = 0.0
        self.timed = (self.iteration + 1) % AGENT_US_EVERY == 0
        if not agent.activated:
            agent.activate()  # hello first, also in time: the step's own time is taken after it
        now = monotonic()
        self._iteration_start_t = now
        if previous_start_t is not None and resumed is None and not skipped:
            # A steady iteration: the agent builds its record without a field dict where every probe is steady.
            if agent.send_steady_step(self.iteration, now, now - previous_start_t, previous_calls, agent_us):
                return
        self._send_fields(now, previous_start_t, previous_calls, agent_us, resumed, skipped)

    def _send_fields(
        self,
        now: float,
        previous_start_t: float | None,
        previous_calls: int,
        agent_us: float | None,
        resumed: int | None,
        skipped: bool,
    ) -> None:
        """The step record of the iteration that just ended, built from its fields (the general way); ``agent_us``
        is None where the iteration was not timed (``AGENT_US_EVERY``)."""
        fields: dict[str, object] = {"step": self.iteration, "t": now}
        if resumed is not None:
            fields["resumed_from"] = resumed
        if skipped:
            fields["skipped"] = True
        if previous_start_t is None:
            fields["absent"] = {
                "step_time_s": "first step",
                "optimizers": "first step",
                "agent_us": "first step",
            }
        else:
            fields["step_time_s"] = now - previous_start_t
            fields["optimizers"] = previous_calls
            if agent_us is not None:
                fields["agent_us"] = agent_us
        self.agent.send_step(fields)

    # -- attaching to torch ----------------------------------------------------------------------------------------

    def attach(self) -> None:
        """Register the global optimizer hooks and wrap GradScaler; torch must already be imported by the user."""
        if self.attached:
            return
        optimizer_module = sys.modules.get("torch.optim.optimizer")
        if optimizer_module is None:
            import torch.optim.optimizer as optimizer_module  # torch imports it itself; this only looks it up
        register_pre = getattr(optimizer_module, "register_optimizer_step_pre_hook", None)
        register_post = getattr(optimizer_module, "register_optimizer_step_post_hook", None)
        if register_pre is None or register_post is None:
            raise RuntimeError("this torch has no global optimizer step hooks (torch >= 2.0 needed)")
        self._pre_handle, self._post_handle = register_pre(self.pre_hook), register_post(self.post_hook)
        self._register_post = register_post
        self.attached = True
        try:
            self._wrap_grad_scalers()
        except Exception as exc:
            self.agent.stop_probe("grad_scaler", exc)

    def detach(self) -> None:
        """Remove the optimizer hooks (GradScaler's wrapper stays, idle without them)."""
        handles, self._pre_handle, self._post_handle = (self._pre_handle, self._post_handle), None, None
        for handle in handles:
            if handle is not None:
                handle.remove()
        self.attached = False
        self._postless = False
        self._lane = None
        self._lane_marked()
        self._clean_steps = 0

    def _lane_postless(self) -> None:
        """The lane's optimizer has left its first gradient as it found it for ``POSTLESS_AFTER`` steps in a row: the
        post-hook goes, and the lane's pre-hook writes the mark it wrote (the gradient and its version, which the
        step does not move). A call on any other way takes it back first (``_take_post_hook_back``).

        On issue 16's tight loop the post-hook cost about 3k instructions an iteration of the agent's 51k: torch's
        call of it, two clock reads, the first gradient looked up again and its mark written (docs/performance.md,
        "Where the instructions went")."""
        handle, self._post_handle = self._post_handle, None
        self._postless = True
        if handle is not None:
            handle.remove()

    def _take_post_hook_back(self) -> None:
        """Register the post-hook again, for good: the lane's optimizer, another one or a ``step(closure)`` takes the
        general way, where the post-hook writes the marks (and counts a closure's step)."""
        self._postless_allowed = False
        self._clean_steps = 0
        self._post_handle = self._register_post(self.post_hook)
        self._postless = False

    def _wrap_grad_scalers(self) -> None:
        """Wrap ``GradScaler._maybe_opt_step`` (torch.amp's, and torch.cuda.amp's if it ever defines its own)."""
        for module_name in ("torch.amp.grad_scaler", "torch.cuda.amp.grad_scaler"):
            module = sys.modules.get(module_name)
            scaler_class = getattr(module, "GradScaler", None) if module is not None else None
            original = scaler_class.__dict__.get("_maybe_opt_step") if scaler_class is not None else None
            if original is None or getattr(original, "_tm_wrapped", False):
                continue  # torch.cuda.amp.GradScaler inherits torch.amp's, already wrapped
            scaler_class._maybe_opt_step = _wrap_maybe_opt_step(original, self)


def _wrap_maybe_opt_step(original, detector: IterationDetector):
    """GradScaler's "step unless inf/NaN" with the agent watching whether the optimizer stepped.

    The scaler has already read ``found_inf``; the agent only sees that no optimizer step hook fired during the call.
    The user's own exceptions (from their optimizer's step) pass through untouched: there is no try around the call.
    """

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        steps_before = detector.pre_calls
        retval = original(self, optimizer, optimizer_state, *args, **kwargs)
        if detector.scaler_on:
            try:
                agent = detector.agent
                if agent._faults:
                    agent.check_fault("grad_scaler")
                if detector.pre_calls == steps_before:
                    detector.skipped_step(optimizer)
            except Exception as exc:
                detector.agent.stop_probe("grad_scaler", exc)
        return retval

    _maybe_opt_step.__wrapped__ = original
    _maybe_opt_step.__name__ = getattr(original, "__name__", "_maybe_opt_step")
    _maybe_opt_step.__qualname__ = getattr(original, "__qualname__", "_maybe_opt_step")
    _maybe_opt_step._tm_wrapped = True
    return _maybe_opt_step
