"""What the facts imply (model/engine/derived.py): recomputed once per change of the facts, tokens per step and the
data-parallel degree kept only inside their bounds, and the x values of a history point."""

from __future__ import annotations

import math

from trainmeter_core.model import records
from trainmeter_core.model.engine.derived import _OFU_CLOCKS_MAX, MAX_TOKENS_PER_STEP, Derived
from trainmeter_core.model.engine.state import EngineState
from trainmeter_core.model.rig import ofu_clock


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


def gpu_fact(tensor_clock_mhz: float | None) -> records.Fact:
    value = {
        "index": 0, "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3", "spec_id": "h100-sxm",
        "display_name": "NVIDIA H100 SXM", "dense_bf16_flop_per_s": 989.4e12, "peak_absent": None,
        "tensor_clock_mhz": tensor_clock_mhz, "memory_bandwidth_bps": 3.35e12, "sm_count": 132, "peak_source": "spec",
    }  # fmt: skip
    return records.Fact(
        name="gpu",
        value=value,
        provenance="detected",
        origin="sampler:nvml",
        device="n1/gpu0",
        t=0.0,
        wall=0.0,
    )


def test_the_ofu_clock_is_the_rigs_answer_and_follows_the_rig_when_a_fact_changes_it():
    state = EngineState()
    derived = Derived(state).refresh()
    # No gpu fact yet: no basis, and why, as the rig's own function says it
    assert derived.ofu_clock("n1/gpu0", 1980.0) == ofu_clock(None, 1980.0)
    assert derived.ofu_clock("n1/gpu0", 1980.0)[0] is None
    state.facts.add(gpu_fact(1830.0))
    derived.refresh()
    # Max SM clocks above the tensor clock, none, and below it (the max SM clock is then the basis)
    for clock_max in (1980.0, None, 1000.0):
        answer = derived.ofu_clock("n1/gpu0", clock_max)
        assert answer == ofu_clock(derived.rig.sampled["n1/gpu0"], clock_max)
        assert derived.ofu_clock("n1/gpu0", clock_max) is answer  # worked out once
    assert derived.ofu_clock("n1/gpu0", 1980.0)[0].label == "scaled to the 1830 MHz tensor clock"
    # A fact that changes the rig (a stated tensor clock of 1755 MHz) is never answered from before it
    state.facts.add(gpu_fact(1755.0))
    derived.refresh()
    assert derived.ofu_clock("n1/gpu0", 1980.0)[0].label == "scaled to the 1755 MHz tensor clock"


def test_the_ofu_clocks_kept_stay_bounded_when_every_sample_says_another_max_clock():
    state = EngineState()
    state.facts.add(gpu_fact(None))
    derived = Derived(state).refresh()
    for i in range(3 * _OFU_CLOCKS_MAX):
        clock_max = 1000.0 + i * 0.25
        basis, _ = derived.ofu_clock("n1/gpu0", clock_max)
        assert basis.mhz == clock_max  # no tensor clock: the sample's max SM clock is the basis
        assert len(derived.ofu_clocks) <= _OFU_CLOCKS_MAX
