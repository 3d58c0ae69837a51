"""The agent's four hottest hooks in C (``_native.c``) where this install has them, and the way back to Python.

Each C hook transliterates one Python function of the agent (the data wait's ``__next__``, the model probe's hook on
each forward, the ``backward`` wrapper, the optimizer pre-hook's steady lane with the steady step record) and calls
back into the Python code for every other branch, so both give the same records; ``tests/test_agent_native.py`` runs
the same loops both ways and compares them. A Python function called at each of those points cost issue 16's
tight loop more than the probes' own work (docs/architecture.md, "What an iteration costs inside a loop, counted").

Dynamo can trace the Python hooks (they step aside while it compiles) but not C ones. The model's ``forward``, which
dynamo traces wherever it traces the model (``torch.export``, a compiled function that calls the model), reads to it
as ``ModelForward``: its type's ``__call__`` attribute is ``ModelForward.__call__``, which dynamo inlines, while
CPython calls the C one. The other three are swapped for their Python twins, for good, once the process calls
``torch.compile`` or dynamo starts compiling anything. Where
the C part is missing (no C compiler when tm was installed, or ``TM_AGENT_NATIVE=0``) the Python hooks run from the
start. Either way the ``probe.native`` fact says which run and why.
"""

from __future__ import annotations

import os
import sys
import zlib

#: Why the C hooks are not used, when this install was built without them.
NOT_BUILT = (
    "trainmeter_agent._native is not in this install (it is built with tm when a C compiler and Python's headers "
    "are there): the agent runs its Python hooks, which add about 1.7x as much to a tight loop's iteration"
)


def load() -> tuple[object | None, str | None]:
    """The C module, or None and why not."""
    if os.environ.get("TM_AGENT_NATIVE") == "0":
        return None, "TM_AGENT_NATIVE=0: the agent runs its Python hooks"
    if not sys.platform.startswith("linux"):
        return (
            None,
            f"the C hooks are built for Linux only (this is {sys.platform}): the agent runs its Python hooks",
        )
    try:
        from trainmeter_agent import _native
    except ImportError as exc:
        return None, f"{NOT_BUILT} ({exc})"
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native.c")
    try:
        with open(source, "rb") as text:
            crc = zlib.crc32(text.read())
    except OSError as exc:
        return None, f"its C source is not readable ({exc}): the agent runs its Python hooks"
    if getattr(_native, "SOURCE_CRC", None) != crc:
        return None, (
            f"{_native.__file__} was built from another _native.c than the one beside it: the agent runs its Python "
            "hooks (./scripts/setup, or any reinstall of tm, builds it again)"
        )
    from trainmeter_agent._forward import ModelForward

    # What dynamo (and anything else that reads a callable's __call__ to trace it) reads for the C forward: the
    # Python twin's. CPython itself calls the C one.
    _native.trace_as(_native.Forward, ModelForward.__call__)
    return _native, None


class NativeLane:
    """Makes the C hooks for the probes while it is on, and puts their Python twins back (``leave``) when dynamo
    could see them."""

    def __init__(self, agent) -> None:
        self.agent = agent
        self.module, self.why_not = load()
        self._put_back: list = []  # functions that each swap one installed C hook for its Python twin

    @property
    def on(self) -> bool:
        return self.module is not None

    def say_state(self) -> None:
        self.agent.probe_state("native", "attached" if self.on else f"not attached: {self.why_not}")

    # -- the hooks --------------------------------------------------------------------------------------------------

    def data_next(self, iter_class, original, phases, python_next):
        """What goes in ``_BaseDataLoaderIter.__next__``: the C twin of ``python_next``, or ``python_next``."""
        if not self.on:
            return python_next
        from trainmeter_agent._outbox import PHASE

        hook = self.module.DataNext(original, self.agent, phases, PHASE)
        _copy_marks(hook, python_next)

        def put_back() -> None:
            if iter_class.__dict__.get("__next__") is hook:
                iter_class.__next__ = python_next

        self._put_back.append(put_back)
        return hook

    def backward(self, autograd, original, probe, python_backward):
        """What goes in ``torch.autograd.backward``: the C twin of ``python_backward``, or ``python_backward``."""
        if not self.on:
            return python_backward
        from trainmeter_agent._loss import MAX_CALLS_PER_ITERATION

        hook = self.module.Backward(original, probe, self.agent, MAX_CALLS_PER_ITERATION)
        _copy_marks(hook, python_backward)

        def put_back() -> None:
            if autograd.backward is hook:
                autograd.backward = python_backward

        self._put_back.append(put_back)
        return hook

    def step_pre_hook(self, detector):
        """The global optimizer step pre-hook: the C twin of ``detector.pre_hook``, or ``detector.pre_hook`` (the
        detector puts it back itself: ``IterationDetector.use_python_pre_hook``)."""
        if not self.on:
            return detector.pre_hook
        from trainmeter_agent._agent import OVERHEAD_EVERY, OVERHEAD_FIRST
        from trainmeter_agent._loss import ATTACHED, ORIGIN
        from trainmeter_agent._outbox import STEADY_STEP

        hook = self.module.StepPreHook(
            detector, self.agent, STEADY_STEP, ATTACHED, ORIGIN, OVERHEAD_FIRST, OVERHEAD_EVERY
        )
        if not any(f == detector.use_python_pre_hook for f in self._put_back):
            self._put_back.append(detector.use_python_pre_hook)
        return hook

    def forward(self, probe, module):
        """The C twin of ``ModelForward(probe, module)`` (the model probe swaps it back itself:
        ``ModelProbe.use_python_forwards``), or None while the lane is off."""
        if not self.on:
            return None
        if not any(f == probe.use_python_forwards for f in self._put_back):
            self._put_back.append(probe.use_python_forwards)
        return self.module.Forward(probe, module, type(module).forward, self.agent)

    # -- the way back -----------------------------------------------------------------------------------------------

    def leave(self, reason: str) -> None:
        """Swap every C hook for its Python twin and make only Python ones from now on (dynamo is about to trace)."""
        if not self.on:
            return
        self.module, self.why_not = None, reason
        put_back, self._put_back = self._put_back, []
        for swap in put_back:
            try:
                swap()
            except Exception as exc:
                self.agent.stop_probe("native", exc)
        self.say_state()

    def watch_dynamo(self, dynamo) -> None:
        """Leave as dynamo starts its first compilation (``torch.export``, ``torch._dynamo.optimize``: anything that
        does not pass through ``torch.compile``, which leaves before it calls dynamo)."""
        if not self.on:
            return
        register = getattr(getattr(dynamo, "callback", None), "on_compile_start", None)
        if register is None:
            return  # an older dynamo: torch.compile's own wrapper still makes the lane leave

        def compile_started(*_args) -> None:
            self.leave("dynamo started compiling: the agent runs its Python hooks, which dynamo can trace")

        register(compile_started)


def _copy_marks(hook, python_twin) -> None:
    """The attributes the Python twin carries as a wrapper (``__wrapped__``, ``_tm_wrapped``, its names)."""
    for attr in ("__wrapped__", "_tm_wrapped", "__name__", "__qualname__", "__doc__", "__module__"):
        if hasattr(python_twin, attr):
            setattr(hook, attr, getattr(python_twin, attr))
