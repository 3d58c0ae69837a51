"""The tokens of one step across all ranks, as the engine counts them on rank 0's step records: a declared count
beats a detected one (a disagreement is kept for a warning), and a detected one beats a ``tokens_per_step`` fact.

Pure: no I/O, no clock; the engine (``feed``) calls it at every step, with what it derived from the facts.
"""

from __future__ import annotations

from trainmeter_core.model import records as rec
from trainmeter_core.model.engine.state import _MAX_TOKENS_PER_STEP, EngineState


def step_tokens(
    state: EngineState, record: rec.Step, dp_fact: int | None, declared: int | None, other: int | None
) -> int | None:
    """Tokens in this step across all ranks, or None; ``dp_fact`` is the declared data-parallel degree, ``declared``
    the ``--tokens-per-step`` count and ``other`` a ``tokens_per_step`` fact that was not declared.

    The state's fields are stored only when their value changes, which is seldom: a store into a msgspec Struct goes
    the interpreter's generic way (40 ns, against 9 ns into a plain slot), and this runs at every step."""
    detected = record.tokens_global
    source = "tokens_global"
    dp_assumed = False
    if detected is None and record.tokens is not None:
        dp = dp_fact if dp_fact is not None else record.dp
        dp_assumed = dp is None
        detected = record.tokens * (dp if dp is not None else 1)
        source = "tokens × dp" if dp is not None else "tokens × dp (dp assumed 1)"
    if detected is not None and not 0 <= detected < _MAX_TOKENS_PER_STEP:
        detected = None  # a negative or absurd count is no count
    if declared is not None:
        mismatch = detected if detected is not None and detected != declared else None
        if state.tokens_mismatch != mismatch:
            state.tokens_mismatch = mismatch
        detected, source = declared, "declared --tokens-per-step"
        dp_assumed = False
    elif detected is None and other is not None:
        detected, source = other, "tokens_per_step fact"
    if state.dp_assumed is not dp_assumed:
        state.dp_assumed = dp_assumed
    if detected is not None:
        if state.last_tokens_per_step != detected:
            state.last_tokens_per_step = detected
        if state.last_tokens_source != source:
            state.last_tokens_source = source
    return detected
