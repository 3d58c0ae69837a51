"""The agent's C hooks against their Python twins without torch: stand-ins for a DataLoader iterator, tensors and an
optimizer, driven through both, must leave the same state and queue the same items (times aside).

Nothing here imports torch or patches a module of it, so it runs on any interpreter the C module is built for
(run it directly, ``python tests/test_agent_native_unit.py``, where pytest is not installed); tests/test_agent_native.py
does the same with real loops.
"""

from __future__ import annotations

import gc
import sys
import types
import weakref
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Tuple items of the outbox: which positions are times (they differ between two runs of the same calls).
TIMES = {
    2: (2, 3),
    1: (2, 3, 5, 11),
    3: (1,),
}  # PHASE: start_t, end_t; STEADY_STEP: t, step_time_s, agent_us, loss_t; METRIC: t


def native_module():
    """The C module, imported directly (a build by hand for another interpreter has no matching CRC)."""
    try:
        from trainmeter_agent import _native
    except ImportError as exc:
        import pytest

        pytest.skip(f"trainmeter_agent._native is not built for this interpreter: {exc}")
    from trainmeter_agent._forward import ModelForward

    _native.trace_as(_native.Forward, ModelForward.__call__)
    return _native


class Producer:
    """Takes what the agent sends; sends nothing."""

    dropped = 0

    def __init__(self) -> None:
        self.windows: list = []

    def send(self, record) -> bool:
        return True

    def send_many(self, records) -> bool:
        return True

    def send_window(self, items, records) -> bool:
        self.windows.append(list(items))
        return True

    def stamp(self, record, now_t, now_wall) -> None:
        pass


def agent_with_probes(native: bool):
    """An agent as attach_torch_probes leaves it, ready to send (hello said), its flush timer off."""
    from trainmeter_agent._agent import Agent
    from trainmeter_agent._flops import FlopCount
    from trainmeter_agent._loss import LossProbe
    from trainmeter_agent._model import ModelProbe
    from trainmeter_agent._nativelane import NativeLane
    from trainmeter_agent._phases import Phases

    agent = Agent("ipc:///nowhere")
    agent.outbox._start_timer = lambda: None
    agent.native = NativeLane(agent)
    # The C module as imported here (a build by hand for another interpreter, whose CRC the lane would refuse), or
    # none: the Python twins.
    agent.native.module, agent.native.why_not = (
        (native_module(), None) if native else (None, "for comparison")
    )
    agent.model, agent.flops, agent.loss, agent.phases = (
        ModelProbe(agent),
        FlopCount(agent),
        LossProbe(agent),
        Phases(agent),
    )
    agent.producer = Producer()
    agent.activated = True
    agent.outbox.ready = True
    return agent


def items(agent) -> list:
    """Everything the agent queued or sent, tuples with their times left out, records by kind."""
    agent.outbox.flush()
    out = []
    for window in agent.producer.windows:
        for item in window:
            if type(item) is tuple:
                times = TIMES.get(item[0], ())
                out.append(tuple("t" if i in times else v for i, v in enumerate(item)))
            else:
                out.append(type(item).__name__)
    return out


# --------------------------------------------------------------------------------------------------------------------
# The data wait


class Iterator:
    """Stands in for a DataLoader iterator: yields its batches, then StopIteration; a batch that is an exception
    is raised."""

    def __init__(self, batches) -> None:
        self.batches = list(batches)

    def __next__(self):
        if not self.batches:
            raise StopIteration
        batch = self.batches.pop(0)
        if isinstance(batch, BaseException):
            raise batch
        return batch


def fake_torch_with(iter_class):
    data = types.SimpleNamespace(dataloader=types.SimpleNamespace(_BaseDataLoaderIter=iter_class))
    return types.SimpleNamespace(utils=types.SimpleNamespace(data=data))


def run_data_waits(native: bool):
    agent = agent_with_probes(native)

    class Iter(Iterator):
        pass

    agent.phases.attach_data_wait(fake_torch_with(Iter))
    hook = Iter.__dict__["__next__"]
    it = Iter([[1], [2], {"input_ids": 3}, (4,), ValueError("the loader's own"), [5]])
    seen = []
    for _ in range(7):
        try:
            seen.append(next(it))
        except StopIteration:
            seen.append("stop")
        except ValueError as exc:
            seen.append(f"raised {exc}")
        agent.iterations.iteration += 1  # a step between batches: the data wait's label moves
    return type(hook).__name__, seen, items(agent), agent.phases.data_seen


def test_the_data_wait_hook_queues_what_its_python_twin_queues():
    native_module()
    kind, seen, queued, data_seen = run_data_waits(True)
    python_kind, python_seen, python_queued, python_data_seen = run_data_waits(False)
    assert (kind, python_kind) == ("DataNext", "function")
    assert seen == python_seen == [[1], [2], {"input_ids": 3}, (4,), "raised the loader's own", [5], "stop"]
    assert queued == python_queued and data_seen == python_data_seen
    # The first batch went the general way (a record, saying the probe attached), the rest as tuples; a dict batch
    # as a record again.
    assert queued[0] == "Fact" and (2, "data_wait", "t", "t", 2, "dataloader") in queued


def test_the_data_wait_hook_binds_as_a_method_and_reads_as_its_python_twin():
    native = native_module()
    agent = agent_with_probes(True)

    class Iter(Iterator):
        pass

    original = Iter.__next__
    agent.phases.attach_data_wait(fake_torch_with(Iter))
    hook = Iter.__dict__["__next__"]
    assert type(hook) is native.DataNext and Iter.__next__ is hook
    assert hook.__wrapped__ is original and hook._tm_wrapped is True and hook.__name__ == "__next__"
    it = Iter([[7]])
    assert it.__next__() == [7]  # bound to the iterator it is read from
    assert weakref.ref(hook)() is hook


# --------------------------------------------------------------------------------------------------------------------
# The loss at backward()


class Dtype:
    def __init__(self, name: str, floating: bool) -> None:
        self.name, self.is_floating_point = name, floating


FLOAT, LONG = Dtype("float32", True), Dtype("int64", False)


class Tensor:
    """Stands in for torch.Tensor where the loss probe reads it."""

    def __init__(self, value, dims: int = 0, dtype: Dtype = FLOAT, cpu: bool = True) -> None:
        self.value, self.dims, self.dtype, self.is_cpu = value, dims, dtype, cpu
        self.is_meta = False
        self.shape = (1,) * dims

    def dim(self) -> int:
        return self.dims

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def item(self):
        return self.value


def fake_torch_for_loss(backward):
    return types.SimpleNamespace(
        Tensor=Tensor,
        autograd=types.SimpleNamespace(backward=backward),
        compiler=types.SimpleNamespace(_is_compiling_flag=False),
        cuda=types.SimpleNamespace(is_current_stream_capturing=lambda: False),
    )


def run_backwards(native: bool):
    agent = agent_with_probes(native)
    calls = []

    def backward(tensors=None, grad_tensors=None, **kwargs):
        calls.append(tensors)
        if tensors == "raise":
            raise RuntimeError("torch's own")
        return None

    torch = fake_torch_for_loss(backward)
    agent.loss.attach(torch)
    wrapped = torch.autograd.backward
    seen = []
    for tensors in (Tensor(1.5), Tensor(0.25), Tensor(2.0, dims=1), "raise", Tensor(3.0, dtype=LONG)):
        try:
            seen.append(wrapped(tensors))
        except RuntimeError as exc:
            seen.append(f"raised {exc}")
    seen.append(wrapped(tensors=Tensor(4.0)))  # by keyword, as autograd.backward may be called
    probe = agent.loss
    return (
        type(wrapped).__name__,
        seen,
        len(calls),
        (probe._entries, probe._calls, probe._why, probe._depth),
    )


def test_the_backward_hook_reads_what_its_python_twin_reads():
    native_module()
    kind, seen, calls, state = run_backwards(True)
    python_kind, python_seen, python_calls, python_state = run_backwards(False)
    assert (kind, python_kind) == ("Backward", "function")
    assert seen == python_seen == [None, None, None, "raised torch's own", None, None]
    assert calls == python_calls == 6
    assert state == python_state
    entries, count, why, depth = state
    assert entries == [1.5, 0.25] and depth == 0  # then a vector: the iteration has no loss, and says why
    assert why is not None and "not a 0-dim floating-point loss" in why


# --------------------------------------------------------------------------------------------------------------------
# The model's forward


class Ids(Tensor):
    """Integer ids, as a loop feeds a language model."""

    def __init__(self, n: int) -> None:
        super().__init__(None, dims=2, dtype=LONG)
        self.n = n

    def numel(self) -> int:
        return self.n


class Module:
    """Stands in for the trained nn.Module: its forward returns what it got."""

    def __init__(self) -> None:
        self.training = True

    def forward(self, *args, **kwargs):
        return args, kwargs


def run_forwards(native: bool):
    from trainmeter_agent._forward import ModelForward

    agent = agent_with_probes(native)
    probe, grad = agent.model, {"on": True}
    probe._torch, probe._tensor_type, probe._int_dtypes = (
        types.SimpleNamespace(Tensor=Tensor),
        Tensor,
        (LONG,),
    )
    probe._grad_enabled, probe._profiler_on = lambda: grad["on"], lambda: False
    probe._is_compiling = lambda: False
    probe.seq_len_sent, agent.flops.done = True, True
    model = Module()
    forward = agent.native.forward(probe, model) if native else ModelForward(probe, model)
    results, counts = [], []
    calls = [
        ((Ids(8),), {}),
        ((Ids(16), "targets"), {}),  # the common forward(ids, targets)
        ((), {"input_ids": Ids(4)}),  # by keyword: the probe's general way
        (("not ids",), {}),  # no id tensor: its tokens are missing
        ((Ids(2),), {}),
    ]
    for args, kwargs in calls:
        results.append(forward(*args, **kwargs))
        counts.append((probe.micro_batches, probe.tokens, probe.tokens_source, probe.tokens_missing))
    model.training = False
    forward(Ids(32))  # eval mode: not a training forward
    model.training, grad["on"] = True, False
    forward(Ids(64))  # no_grad: not one either
    counts.append((probe.micro_batches, probe.tokens))
    return type(forward).__name__, [(len(a), sorted(k)) for a, k in results], counts


def test_the_forward_hook_counts_what_its_python_twin_counts():
    native_module()
    kind, results, counts = run_forwards(True)
    python_kind, python_results, python_counts = run_forwards(False)
    assert (kind, python_kind) == ("Forward", "ModelForward")
    assert results == python_results == [(1, []), (2, []), (0, ["input_ids"]), (1, []), (1, [])]
    assert counts == python_counts
    assert counts[-1] == (5, 30)  # five training forwards, 8 + 16 + 4 + 2 tokens (one without ids)


# --------------------------------------------------------------------------------------------------------------------
# The optimizer step


class Grad:
    """A gradient: its identity and its version are what the detector reads."""

    def __init__(self) -> None:
        self._version = 0


class Param:
    def __init__(self) -> None:
        self.grad = None


class Optimizer:
    def __init__(self) -> None:
        self.param = Param()
        self.param_groups = [{"params": [self.param]}]


def run_steps(native: bool):
    """Steps as torch calls the global pre-hook, around forwards, backwards and a second step without a backward."""
    from trainmeter_agent._agent import OVERHEAD_EVERY, OVERHEAD_FIRST
    from trainmeter_agent._loss import ATTACHED, ORIGIN
    from trainmeter_agent._outbox import STEADY_STEP

    module = native_module() if native else None
    agent = agent_with_probes(native)
    detector = agent.iterations
    detector.attached = True
    detector._register_post = lambda hook: types.SimpleNamespace(remove=lambda: None)
    if native:
        hook = module.StepPreHook(
            detector, agent, STEADY_STEP, ATTACHED, ORIGIN, OVERHEAD_FIRST, OVERHEAD_EVERY
        )
    else:
        hook = detector.pre_hook
    model, loss = agent.model, agent.loss
    model.root_ref, model.dp = weakref.ref(Optimizer), 1  # a model was found: any referent does
    agent.flops.done = True
    loss._said, loss._labelled = ATTACHED, 1
    optimizer = Optimizer()
    for i in range(30):
        if i % 7 != 3:  # a backward: a fresh gradient, or the same one bumped (zero_grad(set_to_none=False))
            if i % 2 or optimizer.param.grad is None:
                optimizer.param.grad = Grad()
            else:
                optimizer.param.grad._version += 1
        model.micro_batches, model.tokens, model.tokens_source = 1, 8, "input_ids"
        loss._entries, loss._calls = [0.5 + i], 1
        hook(optimizer, (optimizer,), {})
        if not detector._postless:
            detector.post_hook(optimizer, (optimizer,), {})
    gc.collect()
    return type(hook).__name__, items(agent), (detector.iteration, detector.counted, detector.pre_calls)


def test_the_step_hook_counts_and_queues_what_its_python_twin_does():
    native_module()
    kind, queued, counts = run_steps(True)
    python_kind, python_queued, python_counts = run_steps(False)
    assert (kind, python_kind) == ("StepPreHook", "method")
    assert counts == python_counts
    assert queued == python_queued
    steady = [item for item in queued if type(item) is tuple and item[0] == 1]
    assert len(steady) > 20  # most iterations took the steady lane, in C as in Python
    assert counts[0] < 30  # the steps without a backward joined their iteration


def test_a_changed_class_is_read_as_python_reads_it_not_at_the_offset_learnt_before():
    """Where a class changes (a property set over one of its slots), the C hooks read the attribute as Python does."""
    native_module()
    from trainmeter_agent._agent import Agent

    agent = agent_with_probes(True)

    class Iter(Iterator):
        pass

    agent.phases.attach_data_wait(fake_torch_with(Iter))
    it = Iter([[1], [2], [3]])
    next(it)
    next(it)  # the steady way: the hook has learnt where `activated` lives
    assert agent._held == []
    slot = Agent.__dict__["activated"]
    Agent.activated = property(lambda self: False)  # reads as not activated: the phase is held until hello
    try:
        next(it)
        assert len(agent._held) == 1 and type(agent._held[0]).__name__ == "Phase"
    finally:
        Agent.activated = slot


if __name__ == "__main__":
    for name, test in list(globals().items()):
        if name.startswith("test_"):
            test()
            print(f"ok {name}")
