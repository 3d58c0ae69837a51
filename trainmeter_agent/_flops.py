"""Counted FLOPs: one real training step counted with ``torch.utils.flop_counter.FlopCounterMode``, early, on rank 0.

The count covers every micro-batch of step 2 (forward and backward, activation-checkpoint recompute included) from
the first forward to the optimizer step, attention counted as its math whatever kernel runs; shapes only, so no device
is synchronized and no extra real forward runs (no RNG drawn, no ``.grad`` touched). A compiled model runs outside
torch's dispatcher, so it is counted on an uncompiled copy on the meta device instead, or reported as not counted with
the reason: never a partial number passed off as whole.
"""

from __future__ import annotations

import sys

from trainmeter_agent import _shape
from trainmeter_agent._forward import ModelForward
from trainmeter_agent._gates import gate_input

#: The iteration whose micro-batches are counted: the first one after a whole step has run (lazy inits done). It is
#: the process's second, whatever the step numbers say (a resumed training's go on from its checkpoint).
COUNTED_STEP = 2


class _GlobalOnly:
    """Stands in for FlopCounterMode's module tracker, which would register global module hooks while counting."""

    parents = frozenset({"Global"})

    def __enter__(self):
        return self

    def __exit__(self, *args):
        return None


#: Attention backward kernels whose formula in torch's registry counts five T x T matmuls (the fused kernels recompute
#: QK^T), with where each takes its query and value: (query index, value index) among its arguments.
_FUSED_ATTENTION_BACKWARD = {
    "_scaled_dot_product_flash_attention_backward": (1, 3),
    "_scaled_dot_product_efficient_attention_backward": (1, 3),
    "_scaled_dot_product_cudnn_attention_backward": (1, 3),
    "_flash_attention_backward": (1, 3),
    "_efficient_attention_backward": (1, 3),
    "flex_attention_backward": (0, 2),
}
#: Attention kernels torch's registry has no formula for (B, H, T, d layout, query, key and value first after
#: grad_out in the backward): without one their step would be counted without its attention, a partial number.
_UNREGISTERED_ATTENTION = (
    ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"),
    (
        "_scaled_dot_product_fused_attention_overrideable",
        "_scaled_dot_product_fused_attention_overrideable_backward",
    ),
)


def math_backward(torch_formula, query_index: int, value_index: int):
    """A fused attention backward counted as the math path's: 4 T x T matmuls where torch's formula counts 5.

    Per (batch, head, query, key) position torch counts 2 x (3 d_q + 2 d_v) FLOPs: the recompute of QK^T (d_q), dS =
    dO V^T (d_v), dV = P^T dO (d_v), dQ = dS K (d_q), dK = dS^T Q (d_q). The math path stores P and skips the
    recompute: 2 x (2 d_q + 2 d_v). Scaling torch's own total keeps its handling of layouts and nested batches.
    """

    def formula(*args, out_val=None, **kwargs):
        total = torch_formula(*args, out_val=out_val, **kwargs)
        d_q, d_v = args[query_index].shape[-1], args[value_index].shape[-1]
        fused, math = 3 * d_q + 2 * d_v, 2 * (d_q + d_v)
        return total // fused * math if total % fused == 0 else round(total * math / fused)

    formula._get_raw = True  # FlopCounterMode passes the raw arguments, as to the registry's own formula
    return formula


def _counter():
    """A FlopCounterMode that tracks no modules and counts every attention kernel as the math path would run it.

    Scaled dot-product attention is counted as its math, whatever kernel runs: QK^T and PV forward (over the whole
    T x T, also when causal), four matmuls backward. An eager step on a GPU (flash kernels, whose backward recomputes
    QK^T) and a compiled model counted on a meta copy (math kernels) then agree.
    """
    from torch.utils import flop_counter

    aten = sys.modules["torch"].ops.aten
    registry = flop_counter.flop_registry
    mapping = {}
    for target, formula in registry.items():
        indices = _FUSED_ATTENTION_BACKWARD.get(str(target).rsplit(".", 1)[-1])
        if indices is not None:
            mapping[target] = math_backward(formula, *indices)
    count_forward = getattr(flop_counter, "sdpa_flop_count", None)
    for forward_name, backward_name in _UNREGISTERED_ATTENTION:
        forward = getattr(aten, forward_name, None)
        backward = getattr(aten, backward_name, None)
        if count_forward is None:
            break
        if forward is not None and forward not in registry:

            def attention(query, key, value, *args, out_shape=None, **kwargs):
                return count_forward(query, key, value)

            mapping[forward] = attention
        if backward is not None and backward not in registry:

            def attention_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs):
                return 2 * count_forward(query, key, value)  # four matmuls of the forward's two sizes

            mapping[backward] = attention_backward
    counter = flop_counter.FlopCounterMode(display=False, custom_mapping=mapping)
    if hasattr(counter, "mod_tracker"):
        counter.mod_tracker = _GlobalOnly()
    return counter


class FlopCount:
    """The state of the one count: waiting, counting (the mode is on the dispatch stack), done."""

    # The states the agent's gates read (``_gates.py``): the model's and the step's short ways wait for the count.
    done = gate_input("done")
    _started_step = gate_input("_started_step", "the step the count started at, or None")

    def __init__(self, agent) -> None:
        self.agent = agent
        self.done = False
        self._counter = None
        self._started_step = None
        self._meta_inputs = None  # (args, kwargs) as meta tensors, for a compiled model
        rank = _shape.env_int("RANK")
        self._counting_rank = rank is None or rank == 0  # one rank counts: the others would only repeat it

    def _regate(self) -> None:
        self.agent.regate()

    def _wanted(self) -> bool:
        return not self.done and self._counting_rank

    def _finish(self, value: float | None, note: str) -> None:
        self.done = True
        self.agent.fact("counted_flop_per_token", value, "flops", unit="FLOP/token", note=note)

    def micro_batch(self, model_probe, args, kwargs) -> None:
        """The first micro-batch of an iteration is about to run: start counting if this is the counted step."""
        if self.done or not self._wanted() or self._counter is not None or self._meta_inputs is not None:
            return
        agent = self.agent
        if agent.iterations.counted != COUNTED_STEP - 1 or "flops" in agent.stopped:
            return
        try:
            if agent._faults:
                agent.check_fault("flops")
            root = model_probe.root()
            compiled = root is not None and any(
                type(m).__name__ == "OptimizedModule" for m in _shape.unwrap(root)
            )
            if compiled or agent.compiled_functions:
                self._meta_inputs = _to_meta(args, kwargs, sys.modules["torch"])
                self._started_step = COUNTED_STEP
                return
            python_dispatch = sys.modules.get("torch.utils._python_dispatch")
            if python_dispatch is not None and python_dispatch._get_current_dispatch_mode() is not None:
                self._finish(None, "another dispatch mode was active at step 2: not counted")
                return
            counter = _counter()
            counter.__enter__()
            self._counter = counter
            self._started_step = COUNTED_STEP
        except Exception as exc:
            self._counter = None
            self._finish(None, f"not counted: internal error {type(exc).__name__}")
            agent.stop_probe("flops", exc)

    def end_iteration(self, fields: dict, model_probe) -> None:
        """The counted iteration ended (optimizer step): stop counting and send the fact."""
        if self._started_step is None or self.done:
            return
        agent = self.agent
        try:
            tokens = fields.get("tokens")
            micro_batches = fields.get("micro_batches")
            if self._counter is not None:
                counter, self._counter = self._counter, None
                python_dispatch = sys.modules["torch.utils._python_dispatch"]
                if python_dispatch._get_current_dispatch_mode() is not counter.mode:
                    # Another mode sits above ours: popping now would pop it. Count nothing, leave when it has gone.
                    self._counter = counter
                    return
                counter.__exit__(None, None, None)
                fields["profiled"] = (
                    True  # the counted step ran slower under the counter: keep it out of averages
                )
                flops = counter.get_total_flops()
                how = f"FlopCounterMode over step {COUNTED_STEP}: forward and backward of {micro_batches} micro-batches"
                self._report(flops, tokens, how)
            elif self._meta_inputs is not None:
                args, kwargs = self._meta_inputs
                self._meta_inputs = None
                self._count_on_meta(model_probe, args, kwargs)
                model_probe.profiled = True  # the copy ran between two steps: the next one took longer
        except Exception as exc:
            self._counter = None
            self._finish(None, f"not counted: internal error {type(exc).__name__}")
            agent.stop_probe("flops", exc)

    def _report(self, flops: int, tokens: int | None, how: str) -> None:
        if not flops:
            self._finish(None, f"{how} saw no matmul or convolution: the work ran outside torch's dispatcher")
        elif not tokens:
            # The count is real; only its divisor is missing. Send the count, so a declared --tokens-per-step gives
            # FLOPs per token in the engine, and say that the tokens (not the counting) are what is missing.
            self.agent.fact("counted_step_flop", flops, "flops", unit="FLOP", note=f"{how}, on rank 0")
            self._finish(
                None,
                f"the counted step's tokens are unknown: pass --tokens-per-step "
                f"(FlopCounterMode counted {flops:,} FLOPs in step {COUNTED_STEP})",
            )
        else:
            self._finish(
                flops / tokens,
                f"{how}, {tokens} tokens on this rank; activation recompute included, attention counted as its math "
                "(2 matmuls forward, 4 backward, over the whole T x T)",
            )

    def _count_on_meta(self, model_probe, args, kwargs) -> None:
        """A compiled model: count one micro-batch on an uncompiled meta copy (no real compute, RNG or .grad)."""
        torch = sys.modules["torch"]
        root = model_probe.root()
        if root is None:
            self._finish(None, "torch.compile hides the model: FLOPs not counted")
            return
        chain = _shape.unwrap(root)
        eager = chain[-1]
        if any(type(m).__name__ in ("DistributedDataParallel", "FullyShardedDataParallel") for m in chain):
            self._finish(
                None, "a compiled model under DDP/FSDP is not copied to the meta device: not counted"
            )
            return
        ids, _ = model_probe._find_ids(args, kwargs, meta=True)
        if ids is None:
            self._finish(
                None, "no integer id tensor in the compiled model's inputs: FLOPs per token not counted"
            )
            return
        tokens = ids.numel()  # meta ids: every position (a mask on meta has no values to count)
        try:
            copy = meta_copy(eager, torch)
        except Exception as exc:
            self._finish(
                None, f"the compiled model could not be copied to the meta device ({type(exc).__name__})"
            )
            return
        counter = _counter()
        try:
            with torch.enable_grad(), torch.device("meta"), counter:
                output = copy(*args, **kwargs)
                loss = _scalar(output, torch)
                if loss is None:
                    raise ValueError("no floating-point output to run backward from")
                loss.backward()
        except Exception as exc:
            self._finish(
                None, f"the meta copy of the compiled model did not run ({type(exc).__name__}: {exc})"
            )
            return
        how = "FlopCounterMode on an uncompiled meta copy: forward and backward of one micro-batch of step 2"
        self._report(counter.get_total_flops(), tokens, how)


def _to_meta(args, kwargs, torch):
    """The same inputs as meta tensors (shapes and dtypes only; nothing is read or kept alive)."""

    def convert(value):
        if isinstance(value, torch.Tensor):
            return torch.empty_like(value, device="meta")
        if isinstance(value, dict):
            return {key: convert(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
            return type(value)(convert(item) for item in value)
        return value

    return tuple(convert(a) for a in args), {key: convert(v) for key, v in kwargs.items()}


def _scalar(output, torch):
    """What to call backward on: a 0-dim float tensor of the output (its loss), else the first float tensor summed."""
    candidates = []
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        candidates.append(loss)
    items = (
        output.values()
        if isinstance(output, dict)
        else output
        if isinstance(output, (list, tuple))
        else [output]
    )
    candidates.extend(item for item in items if isinstance(item, torch.Tensor))
    floats = [c for c in candidates if c.is_floating_point() and c.requires_grad]
    for candidate in floats:
        if candidate.dim() == 0:
            return candidate
    return floats[0].sum() if floats else None


def meta_copy(module, torch, memo: dict | None = None):
    """A structural copy of ``module`` whose parameters and buffers are meta tensors; other attributes are shared.

    ``copy.deepcopy`` would copy real storages (device memory) and everything a module references (a trainer, a
    data loader); this copies modules only, so forward runs on shapes without touching the original.
    """
    memo = {} if memo is None else memo
    if id(module) in memo:
        return memo[id(module)]
    new = module.__class__.__new__(module.__class__)
    memo[id(module)] = new
    state = dict(module.__dict__)
    parameters = {}
    for name, param in module._parameters.items():
        if param is None:
            parameters[name] = None
        elif id(param) in memo:
            parameters[name] = memo[id(param)]
        else:
            copied = torch.nn.Parameter(
                torch.empty_like(param, device="meta"), requires_grad=param.requires_grad
            )
            memo[id(param)] = copied
            parameters[name] = copied
    state["_parameters"] = parameters
    state["_buffers"] = {
        name: None if buffer is None else torch.empty_like(buffer, device="meta")
        for name, buffer in module._buffers.items()
    }
    state["_modules"] = {
        name: None if child is None else meta_copy(child, torch, memo)
        for name, child in module._modules.items()
    }
    for key, value in list(state.items()):
        if isinstance(value, torch.Tensor) and key not in ("_parameters", "_buffers"):
            state[key] = torch.empty_like(value, device="meta")
        elif key.endswith("_hooks") or key.endswith("_hooks_with_kwargs") or key.endswith("_always_called"):
            state[key] = type(value)(value) if isinstance(value, dict) else value
    if "_compiled_call_impl" in state:
        state["_compiled_call_impl"] = None
    if type(state.get("forward")) is ModelForward:
        del state["forward"]  # the model probe's: it would run the model itself, not this copy
    new.__dict__.update(state)
    return new
