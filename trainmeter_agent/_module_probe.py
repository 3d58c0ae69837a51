"""The model probe: finds the module the loop trains, counts its micro-batches and tokens, reports its shape, device
and data-parallel degree, and times its eval passes (``eval()`` to ``train()``).

The model is the first module called outermost with gradients on while training: until then ``nn.Module.__call__``
is briefly wrapped (no global module hook, which would make torch.compile warn); afterwards one forward pre-hook on
that module alone reads its inputs' shapes. Where that module holds only part of what the optimizer steps (a training
step that calls its submodules one by one), the shape facts are sent again, at the first optimizer step, for the
module that holds it all (``_model_owner.py``); the first module's forward still counts the micro-batches and tokens.
It never reads an accelerator tensor's values, never synchronizes a device, never runs inside torch.compile's tracing
(every hook is a no-op there) and never raises into the loop.
"""

from __future__ import annotations

import contextlib
import sys
import time
import weakref
from collections.abc import Mapping
from time import perf_counter

from trainmeter_agent import _model_owner, _shape
from trainmeter_agent._compiling import eager_check, eager_flag_holder
from trainmeter_agent._forward import ForwardHandle, can_set_forward, set_forward
from trainmeter_agent._gates import gate_input
from trainmeter_agent._reasons import NO_TOKENS

_ID_KEYWORDS = ("input_ids", "idx", "tokens", "token_ids")


def _inert_hook():
    """What a copy or a pickle of the model gets in place of the probe's forward pre-hook: a bound method of the
    standard library's ``nullcontext`` that takes any arguments and returns None. It loads wherever torch does, with no
    trainmeter installed, and does nothing."""
    return contextlib.nullcontext().__exit__


class ModelProbe:
    """What the agent knows of the trained model, and the per-iteration counts it hands to each step record.

    It sees the model's forwards through a ``forward`` set on the model (``_forward.py``), or, where that cannot be
    set, as the model's forward pre-hook (``__call__``). A model copied with ``copy.deepcopy`` (an EMA, an eval copy)
    or pickled whole (``torch.save(model)``, a spawn argument) takes neither along: the hook leaves an inert stand-in
    in its place, so neither the probe nor its agent, with their locks and sockets, ever travels with a model.
    """

    # The states the agent's gates read (``_gates.py``): the short way of ``ModelForward`` runs while ``fast``.
    on = gate_input("on")
    root_ref = gate_input("root_ref")
    dp = gate_input("dp")
    seq_len_sent = gate_input("seq_len_sent")
    eager = gate_input(
        "eager", "torch.compile never called: the compile flag is read from torch.compiler itself"
    )

    def __deepcopy__(self, memo):
        return _inert_hook()

    def __reduce__(self):
        return (getattr, (contextlib.nullcontext(), "__exit__"))

    def __init__(self, agent) -> None:
        self.agent = agent
        self.iterations = agent.iterations  # the same object for the agent's life (a fork child resets it)
        self.fast = False
        self.eager = False
        self._compiler = None  # torch.compiler while eager: its flag says whether dynamo or export traces now
        self.on = True
        self.root_ref = None
        self.why_no_root = "no training forward of a module seen yet"
        self._torch = None
        self._original_call = None
        self._outer_depth = 0
        self._handles: list[object] = []
        self._int_dtypes: tuple = ()
        self._tensor_type: type | tuple = ()  # torch.Tensor, once attached
        self._grad_enabled = lambda: False
        self._is_compiling = lambda: False
        self._profiler_on = lambda: False
        self.dp = None
        self.dp_reason = "the model was not seen yet"
        self._eval_start_t: float | None = None
        self.framework_eval = 0  # >0 inside an HF Trainer or Lightning eval loop (their phase wins)
        self.seq_len_sent = False
        # shape -> the CPU attention mask the DataLoader last yielded (for a mask that is on an accelerator now)
        self.cpu_masks: dict[tuple, object] = {}
        # Modules holding the adopted one, from the call stack when it was adopted (weak references), until the first
        # optimizer step decides which one the model is (``first_optimizer_step``).
        self._owner_candidates: list = []
        self._owner_decided = False
        self.reset_iteration()

    def _regate(self) -> None:
        self.agent.regate()

    def reset_iteration(self) -> None:
        self.micro_batches = 0
        self.tokens = 0
        self.tokens_source: str | None = None
        self.tokens_missing = False
        self.profiled = False

    # -- attaching ------------------------------------------------------------------------------------------------

    def attach(self, torch) -> None:
        """Wrap ``nn.Module.__call__`` until the trained model shows itself."""
        self._torch = torch
        self._tensor_type = torch.Tensor
        self._grad_enabled = torch.is_grad_enabled
        self._int_dtypes = (torch.int64, torch.int32)
        self._is_compiling = eager_check(torch)  # torch's own check once torch.compile is called (Phases)
        self._compiler = eager_flag_holder(torch)
        self.eager = self._compiler is not None
        autograd = getattr(torch._C, "_autograd", None)
        self._profiler_on = getattr(autograd, "_profiler_enabled", self._profiler_on)
        self._install_discovery()
        self.agent.probe_state("model", "not attached: no training forward of a module seen yet")

    def _install_discovery(self) -> None:
        module_class = self._torch.nn.Module
        original = module_class.__call__
        if getattr(original, "_tm_wrapped", False):
            return
        probe = self

        def __call__(self, *args, **kwargs):
            if probe._outer_depth or probe._is_compiling():
                return original(self, *args, **kwargs)
            if probe.root_ref is None and probe._adoptable(self):
                probe._adopt(self)
                return original(self, *args, **kwargs)
            probe._outer_depth += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                probe._outer_depth -= 1

        __call__.__wrapped__ = original
        __call__._tm_wrapped = True
        self._original_call = original
        module_class.__call__ = __call__

    def pause_discovery(self) -> bool:
        """Before torch.compile(module): it must capture torch's own ``__call__``. True if discovery was on."""
        if self._original_call is None:
            return False
        self.stop_discovery()
        return True

    def resume_discovery(self) -> None:
        """After torch.compile(module) returned, while the model is still unknown (blocks compiled one by one)."""
        if self.on and self.root_ref is None and "model" not in self.agent.stopped:
            self._install_discovery()

    def stop_discovery(self, reason: str | None = None) -> None:
        """Give ``nn.Module.__call__`` back (the model was found, the probe stopped, or torch.compile hides it)."""
        original, self._original_call = self._original_call, None
        torch = self._torch
        if original is not None and torch is not None:
            if getattr(torch.nn.Module.__call__, "_tm_wrapped", False):
                torch.nn.Module.__call__ = original
        if reason is not None and self.root_ref is None:
            self.why_no_root = reason
            self.agent.probe_state("model", f"not attached: {reason}")

    def detach(self) -> None:
        """Remove every hook (the probe failed): the loop runs as without tm."""
        self.on = False
        self.stop_discovery()
        handles, self._handles = self._handles, []
        for handle in handles:
            try:
                handle.remove()
            except Exception:
                pass

    def _adoptable(self, module) -> bool:
        try:
            if not module.training or not self._torch.is_grad_enabled():
                return False
            return any(param.requires_grad for param in module.parameters())
        except Exception:
            return False

    def _adopt(self, module) -> None:
        """Make ``module`` the model: the probe on each of its forwards, facts about it; discovery ends."""
        try:
            self.stop_discovery()
            if not self.on:
                return
            if getattr(module, "_compiled_call_impl", None) is not None:
                # model.compile() traces the module's own hooks: they would be no-ops inside the compiled code.
                self.why_no_root = "model.compile() hides the model's inputs: use torch.compile(model)"
                self.agent.probe_state("model", f"not attached: {self.why_no_root}")
                return
            self.root_ref = weakref.ref(module)
            if can_set_forward(module, self._torch):  # _forward.py says why rather than a hook
                self._handles.append(set_forward(self, module, self._torch))
            else:
                self._handles.append(module.register_forward_pre_hook(self, with_kwargs=True))
            self._watch_train_mode(type(module))
            self.agent.probe_state("model", "attached")
            self.agent.probe_state("eval", "attached")
            self._send_model_facts(module)
            if not self._owner_decided:
                adopted = tuple(_shape.unwrap(module))
                frame = sys._getframe(1)  # the caller: nn.Module.__call__'s wrapper, or adopt_compiled
                self._owner_candidates += _model_owner.stack_candidates(adopted, self._torch.nn.Module, frame)
        except Exception as exc:
            self.agent.stop_probe("model", exc)

    def first_optimizer_step(self, optimizer) -> None:
        """The process's first optimizer step: where the adopted module holds only part of what ``optimizer`` steps,
        the shape facts are sent again for the whole model (``_model_owner.py``). Once; never per iteration."""
        if self._owner_decided:
            return
        self._owner_decided = True
        candidates, self._owner_candidates = self._owner_candidates, []
        root = self.root()
        if root is None or not self.on or "model" in self.agent.stopped:
            return
        try:
            model, outside = _model_owner.owner(root, candidates, optimizer)
            first = type(_shape.unwrap(root)[-1]).__name__
            if model is not None:
                whose = (
                    f"; the model is {type(model).__name__}, which holds every parameter the optimizer steps "
                    f"(its training step called the {first} in it first)"
                )
                facts = _shape.shape_facts(model, whose=whose)
            elif outside:
                whose = (
                    f"; the {first} called first and the {len(outside)} parameter tensors the optimizer steps "
                    "outside it (no module holding both was seen)"
                )
                facts = _shape.shape_facts(root, outside, whose)
            else:
                return
            for name, value, extra in facts:
                if name != "seq_len":  # the inputs' own length was sent with the first micro-batch
                    self.agent.fact(name, value, "model", **extra)
        except Exception as exc:
            self.agent.stop_probe("model", exc)

    def adopt_compiled(self, compiled) -> bool:
        """torch.compile(model) returned ``compiled``: if it wraps the model, the loop will call it from now on."""
        current = self.root()
        if current is None or "model" in self.agent.stopped:
            return False
        if not any(inner is current for inner in _shape.unwrap(compiled)):
            return True  # a block compiled inside the model already found (TorchTitan style): the model stays
        self.detach_root_hooks()
        self._adopt(compiled)
        return True

    def before_compiling(self, target) -> None:
        """torch.compile(``target``) is about to look at the modules it wraps: where one is the model, its ``forward``
        must be its class's, as without tm (the compiled module is adopted once torch.compile returns)."""
        root = self.root()
        if root is None or not any(inner is root for inner in _shape.unwrap(target)):
            return
        for handle in self._handles:
            if isinstance(handle, ForwardHandle):
                handle.remove()

    def detach_root_hooks(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self.root_ref = None

    def root(self):
        ref = self.root_ref
        return ref() if ref is not None else None

    # -- the model's facts ----------------------------------------------------------------------------------------

    def _send_model_facts(self, module) -> None:
        agent = self.agent
        for name, value, extra in _shape.shape_facts(module):
            if name == "seq_len":
                continue  # the inputs' own length is sent with the first micro-batch; the config's is a fallback
            agent.fact(name, value, "model", **extra)
        self._config_seq = None
        config = _shape.find_config(module)
        if config is not None:
            self._config_seq = _shape.config_int(config, _shape.SEQ_KEYS)
        device = _shape.device_of(module)
        if device is not None:
            agent.fact("device", device, "model", note="the device of the model's parameters")
        self.dp, self.dp_reason = _shape.data_parallel_degree(module)
        agent.fact("dp", self.dp, "model", note=self.dp_reason)
        size = _shape.world_size()
        agent.fact("world_size", size if size is not None else 1, "model", note="WORLD_SIZE, or one process")

    def _send_seq_len(self, ids) -> None:
        self.seq_len_sent = True
        if ids is not None and ids.dim() >= 2:
            self.agent.fact(
                "seq_len", int(ids.shape[-1]), "model", note="the last dimension of the input ids"
            )
        elif getattr(self, "_config_seq", None) is not None:
            key, value = self._config_seq
            self.agent.fact("seq_len", value, "model", note=f"model config {key}")

    # -- micro-batches and tokens ---------------------------------------------------------------------------------

    def _pre_hook(self, module, args, kwargs):
        if self._is_compiling() or not self.on:
            # Traced by dynamo: its own check first, which it knows by name (``on`` is a gate input's property).
            return None  # a hook that returns something replaces the module's inputs: always None
        started = perf_counter()
        agent = self.agent
        try:
            if agent._faults:
                agent.check_fault("model")
            if self._profiler_on():
                self.profiled = True
            if module.training and self._grad_enabled():
                if args and not kwargs and self.seq_len_sent and (self.micro_batches or agent.flops.done):
                    ids = args[0]
                    if (
                        isinstance(ids, self._tensor_type)
                        and ids.dtype in self._int_dtypes
                        and not ids.is_meta
                    ):
                        # The common forward(ids), counted as _micro_batch counts it: every position is a token.
                        self.micro_batches += 1
                        self.tokens += ids.numel()
                        self.tokens_source = "input_ids"
                    else:
                        self._micro_batch(args, kwargs)
                else:
                    self._micro_batch(args, kwargs)
        except Exception as exc:
            agent.stop_probe("model", exc)
        agent.iterations._agent_s += perf_counter() - started
        return None

    __call__ = _pre_hook  # the probe is the hook torch calls

    def _micro_batch(self, args, kwargs) -> None:
        """A training forward of the model: one more micro-batch, and its tokens."""
        ids, mask = self._find_ids(args, kwargs)
        first = self.micro_batches == 0
        self.micro_batches += 1
        if ids is None:
            self.tokens_missing = True
        else:
            if mask is None:
                tokens, source = ids.numel(), "input_ids"
            else:
                tokens, source = self._count(ids, mask)
            self.tokens += tokens
            self.tokens_source = source if self.tokens_source in (None, source) else "input_ids"
        if not self.seq_len_sent:
            self._send_seq_len(ids)
        if first and not self.agent.flops.done:
            self.agent.flops.micro_batch(self, args, kwargs)

    def _find_ids(self, args, kwargs, meta: bool = False):
        """The integer id tensor of a forward's inputs and its attention mask (or None): keywords first.

        Ids on the meta device are someone's shape-only run, not training (``meta`` accepts them: the FLOPs count).
        """
        tensor_type = self._torch.Tensor
        mapping = kwargs
        ids = None
        if kwargs:
            for key in _ID_KEYWORDS:
                value = kwargs.get(key)
                if isinstance(value, tensor_type):
                    ids = value
                    break
        if ids is None and args:
            first = args[0]
            if isinstance(first, tensor_type):
                ids = first  # only the first positional input: a later integer tensor is usually labels
            elif isinstance(first, Mapping):
                mapping = first
                value = first.get("input_ids")
                ids = value if isinstance(value, tensor_type) else None
        # is_meta rather than device.type: building a device object costs more than the rest of this hook.
        if ids is None or ids.dtype not in self._int_dtypes or (ids.is_meta and not meta):
            return None, None
        mask = mapping.get("attention_mask") if mapping else None
        return ids, mask if isinstance(mask, tensor_type) else None

    def _count(self, ids, mask) -> tuple[int, str]:
        """Tokens of one micro-batch: real tokens from a CPU attention mask, else every position of the ids."""
        if mask is not None and tuple(mask.shape) == tuple(ids.shape):
            if mask.device.type != "cpu":
                # Reading it would synchronize the device: use the same batch's mask as the DataLoader yielded it.
                mask = self.cpu_masks.get(tuple(mask.shape))
            if mask is not None:
                return int(mask.count_nonzero()), "attention_mask"
        return ids.numel(), "input_ids"

    def remember_cpu_mask(self, batch) -> None:
        """A DataLoader batch (a mapping) with a CPU attention mask: kept until the next, for an accelerator run."""
        mask = batch.get("attention_mask")
        if isinstance(mask, self._torch.Tensor) and mask.device.type == "cpu":
            self.cpu_masks = {tuple(mask.shape): mask}

    def end_iteration(self, fields: dict) -> None:
        """Add this iteration's micro-batches, tokens, dp and profiler flag to its step record, then start over."""
        absent = dict(fields.get("absent") or {})
        if self._profiler_on():
            self.profiled = True
        if self.profiled:
            fields["profiled"] = True
        if self.root_ref is None or self.micro_batches == 0:
            reason = (
                self.why_no_root if self.root_ref is None else "the model's forward was not seen in this step"
            )
            absent["micro_batches"] = reason
            absent["tokens"] = NO_TOKENS
        else:
            fields["micro_batches"] = self.micro_batches
            if self.tokens_missing:
                absent["tokens"] = NO_TOKENS
            else:
                fields["tokens"] = self.tokens
                fields["tokens_source"] = self.tokens_source
        if self.dp is not None:
            fields["dp"] = self.dp
        else:
            absent["dp"] = self.dp_reason
        if absent:
            fields["absent"] = absent
        self.reset_iteration()

    # -- eval passes ----------------------------------------------------------------------------------------------

    def _watch_train_mode(self, module_class) -> None:
        """Wrap ``train`` on the model's class: ``eval()`` to ``train()`` on the model itself is an eval phase."""
        original = module_class.train
        if getattr(original, "_tm_wrapped", False):
            return
        probe = self

        def train(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            if probe.on and probe.root_ref is not None and probe.root_ref() is self:
                mode = args[0] if args else kwargs.get("mode", True)
                probe._train_mode(bool(mode))
            return result

        train.__wrapped__ = original
        train._tm_wrapped = True
        train.__name__ = getattr(original, "__name__", "train")
        train.__qualname__ = getattr(original, "__qualname__", "train")
        module_class.train = train

    def _train_mode(self, training: bool) -> None:
        try:
            agent = self.agent
            if agent._faults:
                agent.check_fault("eval")
            if "eval" in agent.stopped:
                return
            now = time.monotonic()
            if not training:
                if self._eval_start_t is None:
                    self._eval_start_t = now
            elif self._eval_start_t is not None:
                start, self._eval_start_t = self._eval_start_t, None
                if not self.framework_eval:
                    agent.phase("eval", start, now, probe="model.eval")
        except Exception as exc:
            self.agent.stop_probe("eval", exc)
