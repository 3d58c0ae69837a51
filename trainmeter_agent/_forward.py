"""How the model probe sees each forward of the trained model: its ``forward``, set on the model itself.

A forward pre-hook would do, but any hook takes ``nn.Module.__call__`` off its fast path: torch then builds a closure,
a set and a tuple of hooks on every call, which cost a tight loop more than the probe's own work (11.5k instructions
an iteration, counted under callgrind). An attribute of the model's own ``__dict__`` named ``forward`` is what
``__call__`` calls on the fast path, in front of the class's. It runs the probe on the arguments a pre-hook gets,
then the class's ``forward``.

Nothing of it leaves with the model: ``nn.Module.__getstate__`` (what ``copy.copy``, ``copy.deepcopy`` and pickle
read) and ``DataParallel``'s replicas leave it out, so a copy calls its own class's ``forward`` as without tm; a class
with a ``__getstate__`` of its own that keeps it still gets a plain ``forward`` bound to the copy. Where the model's
``forward`` is not a plain function of its class (already set on the model, a TorchScript module), the probe hooks.
"""

from __future__ import annotations

import copy
import inspect
import types
import weakref
from time import perf_counter


class ModelForward:
    """The model's ``forward`` while the probe watches it: ``probe._pre_hook(model, args, kwargs)``, then the class's.

    It reads as the bound method it stands for: ``__self__``, ``__func__``, ``__wrapped__`` (so
    ``inspect.signature(model.forward)`` is the model's own, as the HF Trainer reads it), and every other attribute
    of its function, as a bound method reads them (``__code__``: torch.export's non-strict tracing reads it)."""

    __slots__ = ("probe", "module_ref", "function", "__weakref__", "__dict__")  # dynamo guards read __dict__

    def __init__(self, probe, module) -> None:
        self.probe = probe
        self.module_ref = weakref.ref(module)  # the model owns this object: no cycle, nothing kept alive
        self.function = type(module).forward

    def __call__(self, *args, **kwargs):
        module = self.module_ref()
        probe = self.probe
        if probe.fast and args and not kwargs and not probe._compiler._is_compiling_flag:
            # The probe's short way, here rather than a call away (a tight loop pays for each call): what
            # ``ModelProbe._pre_hook`` does for the common forward(ids) of a steady iteration (``probe.fast``: the
            # probe on, torch.compile never called, the sequence length said, the FLOP count over).
            iterations = probe.iterations
            timed = iterations.timed
            if timed:
                started = perf_counter()
            try:
                if probe._profiler_on():
                    probe.profiled = True
                if module.training and probe._grad_enabled():
                    ids = args[0]
                    if (
                        isinstance(ids, probe._tensor_type)
                        and ids.dtype in probe._int_dtypes
                        and not ids.is_meta
                    ):
                        probe.micro_batches += 1
                        probe.tokens += ids.numel()
                        probe.tokens_source = "input_ids"
                    else:
                        probe._micro_batch(args, kwargs)
            except Exception as exc:
                probe.agent.stop_probe("model", exc)
            if timed:
                iterations._agent_s += perf_counter() - started
            if len(args) == 1:
                # forward(ids) called as a plain call: no argument tuple or dict built, and the interpreter runs the
                # class's forward in its own loop instead of a C call that unpacks them.
                return self.function(module, args[0])
            return self.function(module, *args)
        probe._pre_hook(module, args, kwargs)
        return self.function(module, *args, **kwargs)

    def __getattr__(self, name: str):
        # Any other attribute as the bound method reads it, from its function (__code__, __defaults__, __name__, ...).
        if name in ModelForward.__slots__:
            raise AttributeError(name)  # not set yet (a copy being built): never the function's
        module = self.module_ref()
        if module is None:
            raise AttributeError(name)  # the model is gone: there is no bound method to read
        return getattr(types.MethodType(self.function, module), name)

    @property
    def __self__(self):
        return self.module_ref()

    @property
    def __func__(self):
        return self.function

    @property
    def __wrapped__(self):
        return types.MethodType(self.function, self.module_ref())

    def __deepcopy__(self, memo):
        # Only reached through a class whose own __getstate__ keeps it: the copy's forward is then its class's, bound
        # to the copy (copy.deepcopy puts the model's copy in memo before copying its attributes).
        return copy.deepcopy(types.MethodType(self.function, self.module_ref()), memo)

    def __reduce__(self):
        # The same, for pickle: the loaded model's forward is its class's (pickle creates the model before it reads
        # its attributes), and loading needs nothing of trainmeter.
        return (getattr, (self.module_ref(), "forward"))


class ForwardHandle:
    """Takes the probe's ``forward`` off the model again (the way a hook's handle removes the hook)."""

    def __init__(self, module, forward: ModelForward) -> None:
        self.module_ref = weakref.ref(module)
        self.forward = forward

    def remove(self) -> None:
        module = self.module_ref()
        if module is not None and module.__dict__.get("forward") is self.forward:
            del module.__dict__["forward"]


def can_set_forward(module, torch) -> bool:
    """Whether ``module``'s forward is a plain function of its class, with nothing set on the module itself."""
    if "forward" in module.__dict__ or isinstance(module, torch.jit.ScriptModule):
        return False
    return isinstance(inspect.getattr_static(type(module), "forward", None), types.FunctionType)


def set_forward(probe, module, torch) -> ForwardHandle:
    """Put the probe's ``forward`` on ``module``; the handle takes it off."""
    _leave_out_of_copies(torch.nn.Module)
    forward = ModelForward(probe, module)
    module.__dict__["forward"] = forward
    return ForwardHandle(module, forward)


def _leave_out_of_copies(module_class) -> None:
    """Wrap ``nn.Module.__getstate__`` and ``_replicate_for_data_parallel`` (once) to drop the probe's forward."""
    getstate = module_class.__dict__.get("__getstate__")
    if getstate is not None and not getattr(getstate, "_tm_wrapped", False):

        def __getstate__(self):
            state = getstate(self)
            if type(state) is dict and type(state.get("forward")) is ModelForward:
                if state is self.__dict__:
                    state = dict(state)
                del state["forward"]
            return state

        module_class.__getstate__ = _marked(__getstate__, getstate)
    replicate = module_class.__dict__.get("_replicate_for_data_parallel")
    if replicate is not None and not getattr(replicate, "_tm_wrapped", False):

        def _replicate_for_data_parallel(self):
            replica = replicate(self)
            if type(replica.__dict__.get("forward")) is ModelForward:
                del replica.__dict__["forward"]
            return replica

        module_class._replicate_for_data_parallel = _marked(_replicate_for_data_parallel, replicate)


def _marked(wrapper, original):
    wrapper.__wrapped__ = original
    wrapper._tm_wrapped = True
    wrapper.__name__ = original.__name__
    wrapper.__qualname__ = original.__qualname__
    wrapper.__doc__ = original.__doc__
    return wrapper
