"""FLOPs per token under the four named conventions, `counted`, and HF Trainer's total_flos figure."""

import pytest

from trainmeter_core.model.flops import (
    CONVENTIONS,
    ModelShape,
    counted_flop_per_token,
    flop_per_token,
    flop_per_token_absent_reasons,
    flop_per_token_all,
    hf_trainer_total_flos_per_token,
)

# The SPEC's 1.04B example: d 2048, 18 layers, T 1024, V 32000 with an untied head and a learned position
# table, so E = (32000 + 1024) x 2048 = 67,633,152.
N = 1_039_290_368
E = 67_633_152
L, D, T = 18, 2048, 1024
PINNED = ModelShape(n_params=N, embedding_params=E, layers=L, d_model=D, seq_len=T)


def test_pinned_example_gives_the_exact_integers_of_every_convention():
    # N - E = 971,657,216 and 6(N - E) = 5,829,943,296; L·d·T = 18 x 2048 x 1024 = 37,748,736.
    # hf         = 5,829,943,296
    # megatron   = 5,829,943,296 + 6 x 37,748,736 (226,492,416)  = 6,056,435,712
    # titan      = 5,829,943,296 + 12 x 37,748,736 (452,984,832) = 6,282,928,128
    # all_params = 6 x 1,039,290,368 (6,235,742,208) + 452,984,832 = 6,688,727,040
    assert flop_per_token_all(PINNED) == {
        "titan": 6_282_928_128,
        "megatron": 6_056_435_712,
        "hf": 5_829_943_296,
        "all_params": 6_688_727_040,
    }


@pytest.mark.parametrize(
    ("convention", "expected"),
    [
        ("titan", 6_282_928_128),
        ("megatron", 6_056_435_712),
        ("hf", 5_829_943_296),
        ("all_params", 6_688_727_040),
    ],
)
def test_flop_per_token_returns_an_exact_int_for_each_convention(convention, expected):
    result = flop_per_token(convention, n_params=N, embedding_params=E, layers=L, d_model=D, seq_len=T)
    assert type(result) is int
    assert result == expected


def test_arithmetic_stays_exact_past_float_precision():
    # 6 x (10**18 + 1 - 1) = 6 x 10**18 exactly; a float path would lose the +1 before subtracting.
    assert flop_per_token("hf", n_params=10**18 + 1, embedding_params=1) == 6 * 10**18
    # all_params: 6 x (2**60 + 1) + 12 x 1 x 1 x 1 = 6 x 2**60 + 18
    assert flop_per_token("all_params", n_params=2**60 + 1, layers=1, d_model=1, seq_len=1) == 6 * 2**60 + 18


def test_megatron_counts_half_the_attention_term_of_titan():
    titan = flop_per_token("titan", n_params=N, embedding_params=E, layers=L, d_model=D, seq_len=T)
    megatron = flop_per_token("megatron", n_params=N, embedding_params=E, layers=L, d_model=D, seq_len=T)
    # titan - megatron = (12 - 6) x L·d·T = 6 x 37,748,736 = 226,492,416
    assert titan - megatron == 226_492_416


def test_hf_needs_only_params_and_embedding_params():
    shape = ModelShape(n_params=N, embedding_params=E)
    assert flop_per_token_all(shape) == {
        "titan": None,
        "megatron": None,
        "hf": 5_829_943_296,
        "all_params": None,
    }
    assert "hf" not in flop_per_token_absent_reasons(shape)


def test_a_convention_missing_the_layers_is_absent_with_the_flag_that_enables_it():
    shape = ModelShape(n_params=N, embedding_params=E, d_model=D, seq_len=T)
    reasons = flop_per_token_absent_reasons(shape)
    assert reasons == {
        "titan": "layers unknown: pass --layers",
        "megatron": "layers unknown: pass --layers",
        "all_params": "layers unknown: pass --layers",
    }
    assert flop_per_token_all(shape)["titan"] is None


def test_all_params_does_not_need_embedding_params_but_hf_does():
    shape = {"n_params": N, "layers": L, "d_model": D, "seq_len": T}  # a plain mapping is accepted too
    # all_params = 6,688,727,040 (see the pinned example)
    assert flop_per_token_all(shape)["all_params"] == 6_688_727_040
    assert (
        flop_per_token_absent_reasons(shape)["hf"] == "embedding parameters unknown: pass --embedding-params"
    )


def test_every_missing_input_is_named_in_the_reason():
    reasons = flop_per_token_absent_reasons(ModelShape())
    assert reasons["hf"] == (
        "parameter count unknown: pass --params; embedding parameters unknown: pass --embedding-params"
    )
    for flag in ("--params", "--layers", "--d-model", "--seq-len"):
        assert flag in reasons["all_params"]


def test_a_missing_value_is_never_a_zero():
    values = flop_per_token_all(ModelShape(n_params=N))
    assert all(value is None for value in values.values())


def test_zero_embedding_params_is_a_real_answer_for_a_rope_model_with_a_tied_head():
    # 6 x (1000 - 0) = 6000
    assert flop_per_token("hf", n_params=1000, embedding_params=0) == 6000


def test_embedding_params_above_params_is_refused_by_flop_per_token():
    with pytest.raises(
        ValueError, match=r"exceed the parameter count .*--embedding-params is part of --params"
    ):
        flop_per_token("hf", n_params=10, embedding_params=11)


def test_embedding_params_above_params_leaves_those_conventions_absent_with_the_reason():
    shape = ModelShape(n_params=10, embedding_params=11, layers=1, d_model=1, seq_len=1)
    values = flop_per_token_all(shape)
    # all_params does not read E: 6 x 10 + 12 x 1 = 72
    assert values == {"titan": None, "megatron": None, "hf": None, "all_params": 72}
    assert "exceed the parameter count" in flop_per_token_absent_reasons(shape)["hf"]


def test_a_shape_that_is_all_embedding_tables_leaves_those_conventions_absent_rather_than_zero():
    # Issue 41: the agent took an Embedding(50, 16) for the model, N = E = 50 x 16 = 800, and 6(N-E) printed as 0.
    shape = ModelShape(n_params=800, embedding_params=800, layers=1, d_model=16, seq_len=8)
    values = flop_per_token_all(shape)
    # all_params does not read E: 6 x 800 + 12 x 1 x 16 x 8 = 4800 + 1536 = 6336
    assert values == {"titan": None, "megatron": None, "hf": None, "all_params": 6336}
    reason = flop_per_token_absent_reasons(shape)["hf"]
    assert reason == (
        "no parameter outside the embedding tables (parameter count 800 = embedding parameters): "
        "N-E would be 0; pass --params"
    )
    with pytest.raises(ValueError, match="no parameter outside the embedding tables"):
        flop_per_token("hf", n_params=800, embedding_params=800)


@pytest.mark.parametrize(
    ("inputs", "expected_words"),
    [
        ({"n_params": N, "embedding_params": E, "layers": 0, "d_model": D, "seq_len": T}, "--layers got 0"),
        (
            {"n_params": N, "embedding_params": E, "layers": L, "d_model": -1, "seq_len": T},
            "--d-model got -1",
        ),
        ({"n_params": N, "embedding_params": E, "layers": 2.5, "d_model": D, "seq_len": T}, "whole number"),
        ({"n_params": N, "embedding_params": E, "layers": True, "d_model": D, "seq_len": T}, "whole number"),
        (
            {"n_params": N, "embedding_params": E, "layers": L, "d_model": D},
            "sequence length unknown: pass --seq-len",
        ),
    ],
)
def test_bad_or_missing_inputs_raise_one_line_naming_the_flag(inputs, expected_words):
    with pytest.raises(ValueError) as caught:
        flop_per_token("titan", **inputs)
    assert expected_words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_unknown_convention_is_refused_with_the_accepted_names():
    with pytest.raises(
        ValueError, match=r"unknown FLOPs convention 'palm'; accepted: titan, megatron, hf, all_params"
    ):
        flop_per_token("palm", n_params=N, embedding_params=E)


def test_conventions_describe_their_formula_who_and_needs():
    assert list(CONVENTIONS) == ["titan", "megatron", "hf", "all_params"]
    assert CONVENTIONS["megatron"].formula == "6(N-E) + 6·L·d·T"
    assert CONVENTIONS["hf"].needs == ("n_params", "embedding_params")
    assert "embedding_params" not in CONVENTIONS["all_params"].needs
    assert "TorchTitan" in CONVENTIONS["titan"].who
    with pytest.raises(AttributeError):  # frozen
        CONVENTIONS["titan"].formula = "6N"  # type: ignore[misc]
    with pytest.raises(TypeError):
        CONVENTIONS["palm"] = CONVENTIONS["titan"]  # type: ignore[index]


def test_counted_is_step_flops_over_step_tokens():
    # 6,282,928,128 x 8 sequences x 1024 tokens, counted over those 8,192 tokens, is the per-token figure
    step_tokens = 8 * 1024
    assert counted_flop_per_token(6_282_928_128 * step_tokens, step_tokens) == 6_282_928_128.0
    # 10 / 4 = 2.5: counted need not be whole
    assert counted_flop_per_token(10, 4) == 2.5


@pytest.mark.parametrize(("step_flops", "tokens"), [(100, 0), (100, -1), (-1, 10), (100, 2.0), (True, 10)])
def test_counted_refuses_impossible_steps(step_flops, tokens):
    with pytest.raises(ValueError, match="counted FLOPs per token"):
        counted_flop_per_token(step_flops, tokens)


def test_hf_trainer_total_flos_drops_a_tied_token_table_below_hf():
    # A tied GPT of the pinned shape: E is the position table only, 1024 x 2048 = 2,097,152, and the token
    # table 32000 x 2048 = 65,536,000 is the head too. Trainer drops both embeddings:
    # 6 x (1,039,290,368 - 2,097,152 - 65,536,000) = 6 x 971,657,216 = 5,829,943,296
    trainer = hf_trainer_total_flos_per_token(N, 2_097_152, 65_536_000)
    assert trainer == 5_829_943_296
    # hf keeps the tied table: 6 x (1,039,290,368 - 2,097,152) = 6,223,159,296, 6·d·V = 393,216,000 above
    hf = flop_per_token("hf", n_params=N, embedding_params=2_097_152)
    assert hf - trainer == 6 * 2048 * 32000 == 393_216_000


def test_hf_trainer_total_flos_equals_hf_for_an_untied_model():
    assert hf_trainer_total_flos_per_token(N, E, 0) == flop_per_token("hf", n_params=N, embedding_params=E)


def test_hf_trainer_total_flos_refuses_tables_larger_than_the_model():
    with pytest.raises(ValueError, match=r"exceed --params"):
        hf_trainer_total_flos_per_token(100, 60, 50)
    with pytest.raises(ValueError, match="tied token table"):
        hf_trainer_total_flos_per_token(100, 0, -1)
