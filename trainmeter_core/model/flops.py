"""Model FLOPs per token under the four named conventions (titan, megatron, hf, all_params), plus `counted`.

Pure integer arithmetic on a model's shape: no I/O, no clock, no torch. It must never return a number
without its convention, and never a zero for a missing input: a convention that lacks one, or whose inputs
leave no matmul weight (N = E), is absent, with the flag that would enable it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import msgspec

__all__ = [
    "CONVENTIONS",
    "SHAPE_INPUT_FLAGS",
    "Convention",
    "ModelShape",
    "counted_flop_per_token",
    "flop_per_token",
    "flop_per_token_absent_reasons",
    "flop_per_token_all",
    "hf_trainer_total_flos_per_token",
]

# Training is one forward GEMM (2 FLOPs per weight per token) and two backward GEMMs (4): 6 per weight.
_TRAIN_FLOPS_PER_PARAM = 6
# Attention scores QK^T and their product with V: 2 GEMMs x 2 FLOPs x 3 (forward + backward) = 12 per
# layer, width and context position, when the whole T x T matrix is counted.
_FULL_ATTENTION_FACTOR = 12
# A causal mask leaves half of that matrix to compute, which is how Megatron-LM counts it.
_CAUSAL_ATTENTION_FACTOR = 6


class Convention(msgspec.Struct, frozen=True):
    """One way of counting model FLOPs per token: its formula, who counts this way, what it needs."""

    name: str
    formula: str
    who: str
    needs: tuple[str, ...]


CONVENTIONS: Mapping[str, Convention] = MappingProxyType(
    {
        "titan": Convention(
            name="titan",
            formula="6(N-E) + 12·L·d·T",
            who=(
                "TorchTitan, nanochat, nanoGPT's estimate_mfu (there E is the position table; "
                "the tied token table stays in N)"
            ),
            needs=("n_params", "embedding_params", "layers", "d_model", "seq_len"),
        ),
        "megatron": Convention(
            name="megatron",
            formula="6(N-E) + 6·L·d·T",
            who="Megatron-LM (the causal mask halves the attention term)",
            needs=("n_params", "embedding_params", "layers", "d_model", "seq_len"),
        ),
        "hf": Convention(
            name="hf",
            formula="6(N-E)",
            who=(
                "HF Trainer's parameter-only count (no attention term); Trainer's own total_flos also "
                "drops a tied token table, 6·d·V per token below this"
            ),
            needs=("n_params", "embedding_params"),
        ),
        "all_params": Convention(
            name="all_params",
            formula="6N + 12·L·d·T",
            who="every parameter counted as a matmul, position tables included (an upper bound)",
            needs=("n_params", "layers", "d_model", "seq_len"),
        ),
    }
)

# The flag that declares each shape input, named in every "absent" reason and error.
SHAPE_INPUT_FLAGS: Mapping[str, str] = MappingProxyType(
    {
        "n_params": "--params",
        "embedding_params": "--embedding-params",
        "layers": "--layers",
        "d_model": "--d-model",
        "seq_len": "--seq-len",
    }
)

# How a reason names the input, in words a person reads in a tooltip.
_SHAPE_INPUT_WORDS: Mapping[str, str] = MappingProxyType(
    {
        "n_params": "parameter count",
        "embedding_params": "embedding parameters",
        "layers": "layers",
        "d_model": "model width",
        "seq_len": "sequence length",
    }
)


class ModelShape(msgspec.Struct, frozen=True):
    """What FLOPs per token are computed from; None means not known (not declared, not detected)."""

    n_params: int | None = None
    embedding_params: int | None = None
    layers: int | None = None
    d_model: int | None = None
    seq_len: int | None = None


def flop_per_token(
    convention: str,
    *,
    n_params: int | None = None,
    embedding_params: int | None = None,
    layers: int | None = None,
    d_model: int | None = None,
    seq_len: int | None = None,
) -> int:
    """Training FLOPs per token under `convention`, exactly, as an integer.

    Raises ValueError (one line naming the flag) for an unknown convention, a missing needed input or an
    impossible one; inputs a convention does not need (L, d, T for `hf`) may be left out.
    """
    chosen = _convention(convention)
    shape = ModelShape(n_params, embedding_params, layers, d_model, seq_len)
    problems = _problems(chosen, shape)
    if problems:
        raise ValueError(f"{chosen.name} FLOPs per token: " + "; ".join(problems))
    return _formula(chosen.name, shape)


def flop_per_token_all(shape: ModelShape | Mapping[str, int | None]) -> dict[str, int | None]:
    """FLOPs per token under every convention, in CONVENTIONS order; None where an input is missing.

    Never raises for a missing or impossible input: that convention is None, and
    flop_per_token_absent_reasons() says why and which flag would enable it.
    """
    known = _shape(shape)
    return {
        name: None if _problems(convention, known) else _formula(name, known)
        for name, convention in CONVENTIONS.items()
    }


def flop_per_token_absent_reasons(shape: ModelShape | Mapping[str, int | None]) -> dict[str, str]:
    """For each convention that flop_per_token_all() leaves absent, why (e.g. "layers unknown: pass --layers")."""
    known = _shape(shape)
    reasons: dict[str, str] = {}
    for name, convention in CONVENTIONS.items():
        problems = _problems(convention, known)
        if problems:
            reasons[name] = "; ".join(problems)
    return reasons


def counted_flop_per_token(step_flops: int, tokens: int) -> float:
    """`counted`: executed FLOPs of one real step (FlopCounterMode, recompute included) over its tokens.

    Shown beside MFU, never in place of a named convention.
    """
    if not _is_int(step_flops) or step_flops < 0:
        raise ValueError(
            f"counted FLOPs per token: step FLOPs must be a whole number >= 0, got {step_flops!r}"
        )
    if not _is_int(tokens) or tokens <= 0:
        raise ValueError(
            f"counted FLOPs per token: the step's tokens must be a whole number > 0, got {tokens!r}"
        )
    return step_flops / tokens


def hf_trainer_total_flos_per_token(
    n_params: int, embedding_params: int, tied_token_table_params: int
) -> int:
    """What HF Trainer's `total_flos` adds per token: 6 x (N - E - tied token table).

    Trainer counts 6 x tokens x num_parameters(exclude_embeddings=True), which drops every nn.Embedding
    weight. A tied token table is also the output head's matmul, so by our definition it is not in E, yet
    Trainer drops it too: its figure sits 6·d·V per token below `hf` for tied models and equals `hf` for
    untied ones (pass 0). Shown beside `hf` with that note, never as a convention of its own.
    """
    for label, value in (
        ("--params", n_params),
        ("--embedding-params", embedding_params),
        ("tied token table parameters", tied_token_table_params),
    ):
        if not _is_int(value) or value < 0:
            raise ValueError(f"HF Trainer total_flos: {label} must be a whole number >= 0, got {value!r}")
    if embedding_params + tied_token_table_params > n_params:
        raise ValueError(
            "HF Trainer total_flos: embedding parameters plus the tied token table "
            f"({embedding_params + tied_token_table_params}) exceed --params ({n_params})"
        )
    return _TRAIN_FLOPS_PER_PARAM * (n_params - embedding_params - tied_token_table_params)


def _formula(name: str, shape: ModelShape) -> int:
    """The formula itself; callers have checked that every input it reads is a valid int."""
    n, e, lay, d, t = shape.n_params, shape.embedding_params, shape.layers, shape.d_model, shape.seq_len
    if name == "titan":
        return _TRAIN_FLOPS_PER_PARAM * (n - e) + _FULL_ATTENTION_FACTOR * lay * d * t
    if name == "megatron":
        return _TRAIN_FLOPS_PER_PARAM * (n - e) + _CAUSAL_ATTENTION_FACTOR * lay * d * t
    if name == "hf":
        return _TRAIN_FLOPS_PER_PARAM * (n - e)
    if name == "all_params":
        return _TRAIN_FLOPS_PER_PARAM * n + _FULL_ATTENTION_FACTOR * lay * d * t
    raise AssertionError(f"no formula for convention {name!r}")  # CONVENTIONS and this list disagree


def _problems(convention: Convention, shape: ModelShape) -> list[str]:
    """Why `convention` cannot be computed from `shape`, one phrase per input; empty when it can."""
    problems: list[str] = []
    for input_name in convention.needs:
        value = getattr(shape, input_name)
        words, flag = _SHAPE_INPUT_WORDS[input_name], SHAPE_INPUT_FLAGS[input_name]
        if value is None:
            problems.append(f"{words} unknown: pass {flag}")
        elif not _is_int(value):
            problems.append(f"{words} must be a whole number: {flag} got {value!r}")
        elif value < 0 or (value == 0 and input_name != "embedding_params"):
            # A model can have no lookup-only embeddings (RoPE, tied head); it cannot have no layers.
            lowest = "0 or more" if input_name == "embedding_params" else "more than 0"
            problems.append(f"{words} must be {lowest}: {flag} got {value}")
    if (
        not problems and "embedding_params" in convention.needs and shape.embedding_params > shape.n_params  # type: ignore[operator]
    ):
        problems.append(
            f"embedding parameters ({shape.embedding_params}) exceed the parameter count ({shape.n_params}): "
            "--embedding-params is part of --params"
        )
    elif not problems and "embedding_params" in convention.needs and shape.embedding_params == shape.n_params:
        # 6(N-E) would be 0: no matmul weight at all, which is a model seen only in part (its embedding table), not a
        # model that costs nothing. A zero would read as a measurement; the figure is absent instead.
        problems.append(
            f"no parameter outside the embedding tables (parameter count {shape.n_params} = embedding parameters): "
            "N-E would be 0; pass --params"
        )
    return problems


def _convention(name: str) -> Convention:
    if name not in CONVENTIONS:
        raise ValueError(f"unknown FLOPs convention {name!r}; accepted: {', '.join(CONVENTIONS)}")
    return CONVENTIONS[name]


def _shape(shape: ModelShape | Mapping[str, int | None]) -> ModelShape:
    if isinstance(shape, ModelShape):
        return shape
    return ModelShape(**{name: shape.get(name) for name in ModelShape.__struct_fields__})


def _is_int(value: object) -> bool:
    # bool is an int subclass; True parameters is a bug upstream, not a count.
    return isinstance(value, int) and not isinstance(value, bool)
