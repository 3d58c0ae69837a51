"""Phase probes: data wait (the DataLoader iterator), checkpoints saved (torch.save, safetensors,
torch.distributed.checkpoint) and loaded (torch.load), compile time (torch.compile's first calls) and the eval loops of
HF Trainer and Lightning.

Each wraps one library function: the original runs first-class, with no ``try`` that could change what it raises,
and the probe records a span after it returns. A probe that fails stops itself only; none imports the library it
watches (it attaches when the user's code has imported it) or reads a tensor's values.
"""

from __future__ import annotations

import functools
import os
import time

from trainmeter_agent._compiling import full_check
from trainmeter_agent._gates import gate_input

_CHECKPOINT_DEPTH = [0]  # nested saves (DCP or save_pretrained calling torch.save) are one checkpoint
#: The fact naming every folder this process wrote checkpoints to (a list): the host sampler watches their
#: filesystems. A fact rather than the phases themselves, so that no subscriber filters for phases: a filter on a kind
#: makes the hub publish each of its records apart from the records around it (``bus/publish.py``), and a data wait is
#: a phase in every iteration.
CHECKPOINT_FOLDERS_FACT = "checkpoint.folders"
#: Folders named at most: a loop that saves to a new folder each time still makes a bounded fact.
MAX_CHECKPOINT_FOLDERS = 64


def _mark(wrapper, original):
    wrapper.__wrapped__ = original
    wrapper._tm_wrapped = True
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(wrapper, attr, getattr(original, attr))
        except (AttributeError, TypeError):
            pass
    return wrapper


def _path(target) -> str | None:
    """The file a save wrote to: a path, or a file object's name."""
    if isinstance(target, (str, os.PathLike)):
        return os.path.abspath(os.fspath(target))
    name = getattr(target, "name", None)
    if isinstance(name, str):
        return os.path.abspath(name)
    return None


class Phases:
    """The phase probes of one agent."""

    #: Whether a DataLoader batch was seen (and ``probe.data_wait`` said attached); a gate input (``_gates.py``).
    data_seen = gate_input("data_seen")

    def __init__(self, agent) -> None:
        self.agent = agent
        self.fast = False  # the agent's gate for the data wait's short way
        self.data_seen = False
        self._resume_after = False  # torch.compile(module) paused the model's discovery: resume it after
        self.checkpoint_folders: list[str] = []  # as said in the latest CHECKPOINT_FOLDERS_FACT

    def _regate(self) -> None:
        self.agent.regate()

    def _failed(self, probe: str, exc: BaseException) -> None:
        self.agent.stop_probe(probe, exc)

    def _live(self, probe: str) -> bool:
        return probe not in self.agent.stopped

    # -- data wait ------------------------------------------------------------------------------------------------

    def attach_data_wait(self, torch) -> None:
        iter_class = torch.utils.data.dataloader._BaseDataLoaderIter
        original = iter_class.__next__
        if getattr(original, "_tm_wrapped", False):
            return
        phases = self
        agent = self.agent
        iterations = agent.iterations  # the same object for the agent's life (a fork child resets it)
        monotonic = time.monotonic

        def __next__(self):
            started = monotonic()
            batch = original(self)
            if phases.fast and not isinstance(batch, dict):
                # The common batch, as _batch takes it: a phase with no extra field, labelled with the current step
                # (``phases.fast``: the agent said hello, the probe on, no fault to inject, the steps not the loop's
                # own).
                try:
                    ended = monotonic()
                    agent.outbox.put_phase(
                        "data_wait", started, ended, iterations.iteration or None, "dataloader"
                    )
                    if iterations.timed:
                        iterations._agent_s += monotonic() - ended
                except Exception as exc:
                    phases._failed("data_wait", exc)
            elif "data_wait" not in agent.stopped:
                phases._batch(started, batch)
            return batch

        iter_class.__next__ = _mark(__next__, original)
        self.agent.probe_state("data_wait", "not attached: no torch DataLoader iterated yet")

    def _batch(self, started: float, batch) -> None:
        try:
            agent = self.agent
            ended = time.monotonic()
            if agent._faults:
                agent.check_fault("data_wait")
            if not self.data_seen:
                self.data_seen = True
                agent.probe_state("data_wait", "attached")
            if isinstance(batch, dict) and "attention_mask" in batch:
                agent.model.remember_cpu_mask(batch)
            agent.phase("data_wait", started, ended, probe="dataloader")
            agent.iterations._agent_s += time.monotonic() - ended
        except Exception as exc:
            self._failed("data_wait", exc)

    # -- checkpoints ----------------------------------------------------------------------------------------------

    def _saver(self, original, how: str, paths_of):
        phases = self

        def save(*args, **kwargs):
            outer = _CHECKPOINT_DEPTH[0] == 0
            started = time.monotonic()
            _CHECKPOINT_DEPTH[0] += 1
            try:
                result = original(*args, **kwargs)
            finally:
                _CHECKPOINT_DEPTH[0] -= 1
            if outer and "checkpoint" not in phases.agent.stopped:
                phases._checkpoint(started, how, paths_of, args, kwargs)
            return result

        return _mark(save, original)

    def _checkpoint(self, started: float, how: str, paths_of, args, kwargs) -> None:
        try:
            ended = time.monotonic()
            if self.agent._faults:
                self.agent.check_fault("checkpoint")
            paths = [p for p in paths_of(args, kwargs) if p]
            if not paths and how == "torch.save":
                return  # into memory (io.BytesIO): torch.distributed's object collectives pickle this way
            self.agent.phase("checkpoint", started, ended, probe=how, paths=paths)
            self._new_folders(paths)
        except Exception as exc:
            self._failed("checkpoint", exc)

    def _new_folders(self, paths: list[str]) -> None:
        """Say ``CHECKPOINT_FOLDERS_FACT`` again when a checkpoint went to a folder not named yet (paths are absolute:
        a file's folder, or the folder itself for a directory checkpoint such as DCP's)."""
        folders = self.checkpoint_folders
        added = False
        for path in paths:
            folder = path if os.path.isdir(path) else os.path.dirname(path)
            if folder not in folders and len(folders) < MAX_CHECKPOINT_FOLDERS:
                folders.append(folder)
                added = True
        if added:
            self.agent.fact(CHECKPOINT_FOLDERS_FACT, list(folders), "checkpoint")

    def attach_torch_save(self, torch) -> None:
        original = torch.save
        if getattr(original, "_tm_wrapped", False):
            return

        def paths(args, kwargs):
            return [_path(args[1] if len(args) > 1 else kwargs.get("f"))]

        wrapped = self._saver(original, "torch.save", paths)
        torch.save = wrapped
        serialization = getattr(torch, "serialization", None)
        if serialization is not None and getattr(serialization, "save", None) is original:
            serialization.save = wrapped
        self.agent.probe_state("checkpoint", "attached")

    def attach_torch_load(self, torch) -> None:
        """``torch.load`` as a ``checkpoint_load`` phase: a resumed training's restore (the time split's bucket)."""
        original = torch.load
        if getattr(original, "_tm_wrapped", False):
            return
        phases = self

        def load(*args, **kwargs):
            started = time.monotonic()
            result = original(*args, **kwargs)
            if "checkpoint" not in phases.agent.stopped:
                try:
                    phases.agent.phase("checkpoint_load", started, time.monotonic(), probe="torch.load")
                except Exception as exc:
                    phases._failed("checkpoint", exc)
            return result

        wrapped = _mark(load, original)
        torch.load = wrapped
        serialization = getattr(torch, "serialization", None)
        if serialization is not None and getattr(serialization, "load", None) is original:
            serialization.load = wrapped

    def attach_safetensors(self, module) -> None:
        original = getattr(module, "save_file", None)
        if original is None or getattr(original, "_tm_wrapped", False):
            return

        def paths(args, kwargs):
            return [_path(args[1] if len(args) > 1 else kwargs.get("filename"))]

        module.save_file = self._saver(original, "safetensors.save_file", paths)

    def attach_dcp(self, module) -> None:
        def paths(args, kwargs):
            target = kwargs.get("checkpoint_id")
            if target is None:
                target = getattr(kwargs.get("storage_writer"), "path", None)
            return [_path(target)]

        for name in ("save", "async_save", "save_state_dict"):
            original = getattr(module, name, None)
            if original is not None and not getattr(original, "_tm_wrapped", False):
                setattr(module, name, self._saver(original, f"torch.distributed.checkpoint.{name}", paths))

    # -- compile --------------------------------------------------------------------------------------------------

    def attach_compile(self, torch) -> None:
        original = torch.compile
        if getattr(original, "_tm_wrapped", False):
            return
        phases = self

        def compile(*args, **kwargs):
            target = args[0] if args else kwargs.get("model")
            if target is None:  # torch.compile(mode=...) used as a decorator factory
                decorator = original(*args, **kwargs)

                def compile_decorator(fn):
                    phases._before_compile(fn)
                    return phases._compiled(fn, decorator(fn))

                return compile_decorator
            phases._before_compile(target)
            return phases._compiled(target, original(*args, **kwargs))

        torch.compile = _mark(compile, original)
        self.agent.probe_state("compile", "attached")

    def _before_compile(self, target) -> None:
        """Before torch.compile sees ``target``: the model probe must leave nothing dynamo could trace."""
        try:
            agent = self.agent
            torch = agent.model._torch
            if torch is not None:
                # Dynamo may trace the probes from now on: they ask torch's own check, which it knows by name, and
                # their short ways (which read torch.compiler's flag themselves) end.
                agent.model._is_compiling = agent.loss._is_compiling = full_check(torch)
                agent.model.eager = agent.loss.eager = False
            if agent._faults:
                agent.check_fault("compile")
            torch_nn = torch.nn if torch is not None else None
            if torch_nn is not None and isinstance(target, torch_nn.Module):
                # The compiled module captures nn.Module.__call__ now: it must be torch's own, never the probe's; and
                # the model's forward its class's.
                self._resume_after = agent.model.pause_discovery()
                agent.model.before_compiling(target)
            else:
                agent.compiled_functions += 1
                owner = getattr(target, "__self__", None)
                if (
                    torch_nn is not None
                    and isinstance(owner, torch_nn.Module)
                    and owner is agent.model.root()
                ):
                    agent.model.detach_root_hooks()  # model.compile() would trace them
                agent.model.stop_discovery(
                    "torch.compile of a function hides the model's inputs: pass --tokens-per-step"
                )
        except Exception as exc:
            self._failed("compile", exc)

    def _compiled(self, target, compiled):
        """Time the first call of what torch.compile returned (tracing and compiling happen there)."""
        try:
            if "compile" in self.agent.stopped:
                return compiled
            model = self.agent.model
            if isinstance(compiled, model._torch.nn.Module):
                resume, self._resume_after = self._resume_after, False
                if not model.adopt_compiled(compiled) and resume:
                    model.resume_discovery()  # the first training forward will find the model, compiled or not
                self._time_first_module_call(compiled)
                return compiled
            if callable(compiled):
                return self._time_first_function_call(compiled)
        except Exception as exc:
            self._failed("compile", exc)
        return compiled

    def _time_first_module_call(self, module) -> None:
        phases = self
        started: list[float] = []
        handles: list[object] = []

        def pre(module, args):
            if not started and not phases.agent.model._is_compiling():
                started.append(time.monotonic())

        def post(module, args, *rest):
            if not started or phases.agent.model._is_compiling():
                return None
            for handle in handles:
                handle.remove()
            if "compile" not in phases.agent.stopped:
                phases._compile_phase(started[0], f"first call of compiled {type(module._orig_mod).__name__}")
            return None

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post, always_call=True))

    def _time_first_function_call(self, compiled):
        phases = self
        state = {"first": True}
        is_compiling = self.agent.model._is_compiling

        @functools.wraps(compiled)
        def first_call_timed(*args, **kwargs):
            if not state["first"] or is_compiling():
                return compiled(*args, **kwargs)
            state["first"] = False
            started = time.monotonic()
            result = compiled(*args, **kwargs)
            if "compile" not in phases.agent.stopped:
                name = getattr(compiled, "__name__", "function")
                phases._compile_phase(started, f"first call of compiled {name}")
            return result

        return first_call_timed

    def _compile_phase(self, started: float, detail: str) -> None:
        try:
            self.agent.phase("compile", started, time.monotonic(), probe="torch.compile", detail=detail)
        except Exception as exc:
            self._failed("compile", exc)

    # -- eval loops of frameworks ---------------------------------------------------------------------------------

    def _eval_loop(self, original, how: str):
        phases = self

        def run(*args, **kwargs):
            model = phases.agent.model
            started = time.monotonic()
            model.framework_eval += 1
            try:
                return original(*args, **kwargs)
            finally:
                model.framework_eval -= 1
                if "eval" not in phases.agent.stopped:
                    phases._framework_eval(started, how)

        return _mark(run, original)

    def _framework_eval(self, started: float, how: str) -> None:
        try:
            agent = self.agent
            if agent._faults:
                agent.check_fault("eval")
            agent.model._eval_start_t = None  # the model's own eval() inside this loop is the same pass
            agent.phase("eval", started, time.monotonic(), probe=how)
        except Exception as exc:
            self._failed("eval", exc)

    def attach_hf_trainer(self, module) -> None:
        trainer = getattr(module, "Trainer", None)
        original = getattr(trainer, "evaluate", None)
        if original is not None and not getattr(original, "_tm_wrapped", False):
            trainer.evaluate = self._eval_loop(original, "transformers.Trainer.evaluate")
            self.agent.probe_state("eval", "attached")

    def attach_lightning(self, module) -> None:
        loop = getattr(module, "_EvaluationLoop", None)
        original = getattr(loop, "run", None)
        if original is not None and not getattr(original, "_tm_wrapped", False):
            loop.run = self._eval_loop(original, "lightning evaluation loop")
            self.agent.probe_state("eval", "attached")
