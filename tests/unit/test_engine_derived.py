"""What the facts imply (model/engine/derived.py): recomputed once per change of the facts, tokens per step and the
data-parallel degree kept only inside their bounds, and the x values of a history point."""

from __future__ import annotations

import math

from trainmeter_core.model import records
from trainmeter_core.model.engine.derived import MAX_TOKENS_PER_STEP, Derived
from trainmeter_core.model.engine.state import EngineState


def fact(name: str, value, provenance: str = "declared") -> records.Fact:
    return records.Fact(name=name, value=value, provenance=provenance, origin=f"--{name}", t=0.0, wall=0.0)


def test_the_values_are_recomputed_only_when_a_fact_changed():
    state = EngineState()
    derived = Derived(state)
    assert derived.refresh() is derived and derived.declared_tokens_per_step is None
    state.facts.add(fact("tokens_per_step", 2048))
    assert derived.refresh().declared_tokens_per_step == 2048
    derived.declared_tokens_per_step = 1  # a value no refresh would make: it stays while the facts stay
    assert derived.refresh().declared_tokens_per_step == 1
    state.facts.add(fact("dp", 8))
    assert derived.refresh().declared_tokens_per_step == 2048 and derived.dp == 8


def test_a_declared_tokens_per_step_is_declared_and_any_other_is_other():
    state = EngineState()
    state.facts.add(fact("tokens_per_step", 4096, provenance="emitted"))
    derived = Derived(state).refresh()
    assert (derived.declared_tokens_per_step, derived.other_tokens_per_step) == (None, 4096)


def test_an_absurd_tokens_per_step_or_dp_is_none():
    state = EngineState()
    state.facts.add(
        fact("tokens_per_step", MAX_TOKENS_PER_STEP)
    )  # 2**40 tokens in one step: a broken emitter
    state.facts.add(fact("dp", 0))
    derived = Derived(state).refresh()
    assert derived.declared_tokens_per_step is None and derived.dp is None


def test_the_x_values_are_nan_until_known():
    state = EngineState()
    derived = Derived(state)
    assert all(math.isnan(v) for v in derived.x())
    state.last_step, state.tokens_seen, state.steps_with_tokens = 7, 14336, 7
    step, tokens, flop = derived.x()
    # No FLOPs per token without the model's shape: the FLOPs-spent x is NaN while step and tokens are known.
    assert (step, tokens) == (7.0, 14336.0) and math.isnan(flop)
