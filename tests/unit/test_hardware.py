"""Tests for trainmeter_core.model.device_specs: spec validation, NVML name matching and dense peaks (MIG slices included)."""

from __future__ import annotations

import copy

import pytest

from trainmeter_core.model.device_specs import (
    SPARSE_HALF_TOLERANCE,
    SpecError,
    dense_peak_flop_per_s,
    derived_tensor_clock_mhz,
    match_spec,
    parse_spec,
    sm_count_from_cores,
)
from trainmeter_core.run.specstore import load_specs

URL = "https://example.com/datasheet.pdf"


def figure(value, quote="Figure 1", **extra):
    return {"value": value, "sources": [{"url": URL, "quote": quote}], **extra}


def spec_data(**overrides):
    """A small valid spec for a made-up card; tests change one thing each."""
    data = {
        "id": "test-card",
        "display_name": "Test Card",
        "architecture": "hopper",
        "adapter": "server",
        "match": ["Test Card"],
        "exclude": [],
        "sm_count": figure(100),
        "dense_bf16_tflop_per_s": figure(400.0),
        "tensor_clock_mhz": {"value": None, "sources": [], "note": "not stated"},
        "memory_kind": "HBM3",
        "memory_gb": figure(80),
        "memory_bandwidth_gbps": figure(3000),
        "checked": "2026-11-29",
    }
    data.update(copy.deepcopy(overrides))
    return data


def made_up(id_, match, exclude=(), dense=400.0, sm_count=100):
    return parse_spec(
        spec_data(
            id=id_,
            match=list(match),
            exclude=list(exclude),
            dense_bf16_tflop_per_s=figure(dense),
            sm_count=figure(sm_count),
        ),
        f"{id_}.json",
    )


@pytest.fixture(scope="module")
def builtin_specs():
    return load_specs()


def builtin(specs, spec_id):
    return next(s for s in specs if s.id == spec_id)


# ---------------------------------------------------------------------------------------------------------------------
# Validation


def test_a_complete_spec_parses_into_its_figures():
    spec = parse_spec(spec_data(), "test-card.json")
    assert spec.id == "test-card"
    assert spec.dense_bf16_tflop_per_s.value == 400.0
    assert spec.dense_bf16_tflop_per_s.sources[0].quote == "Figure 1"
    assert spec.tensor_clock_mhz.value is None
    assert spec.origin == "test-card.json"


def test_a_null_figure_without_a_note_is_refused():
    data = spec_data(memory_gb={"value": None, "sources": []})
    with pytest.raises(SpecError, match=r"^card\.json: memory_gb is null without a note"):
        parse_spec(data, "card.json")


def test_a_source_without_a_quote_is_refused():
    data = spec_data(dense_bf16_tflop_per_s={"value": 400.0, "sources": [{"url": URL}]})
    with pytest.raises(SpecError, match="needs the quoted words"):
        parse_spec(data, "card.json")


def test_a_source_without_an_address_is_refused():
    data = spec_data(dense_bf16_tflop_per_s={"value": 400.0, "sources": [{"quote": "400 TFLOPS"}]})
    with pytest.raises(SpecError, match="needs a url"):
        parse_spec(data, "card.json")


def test_a_figure_with_a_value_but_no_source_is_refused():
    data = spec_data(sm_count={"value": 100, "sources": []})
    with pytest.raises(SpecError, match="sm_count = 100 cites no source"):
        parse_spec(data, "card.json")


def test_an_error_is_one_line_naming_the_file():
    data = spec_data(memory_gb={"value": None, "sources": []})
    with pytest.raises(SpecError) as caught:
        parse_spec(data, "/plugins/spark/gb10.json")
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("/plugins/spark/gb10.json: ")


def test_a_misspelt_key_is_refused_instead_of_ignored():
    data = spec_data()
    data["dense_bf16_tflop"] = data.pop("dense_bf16_tflop_per_s")
    with pytest.raises(SpecError, match="unknown key 'dense_bf16_tflop'"):
        parse_spec(data, "card.json")


def test_a_pattern_that_does_not_compile_is_refused():
    with pytest.raises(SpecError, match=r"match pattern 'H100\(' does not compile"):
        parse_spec(spec_data(match=["H100("]), "card.json")


def test_a_pattern_matching_empty_text_is_refused_because_it_would_match_every_card():
    with pytest.raises(SpecError, match="matches the empty string"):
        parse_spec(spec_data(match=["(H100)?"]), "card.json")


def test_a_spec_without_match_patterns_is_refused():
    with pytest.raises(SpecError, match="match needs at least one pattern"):
        parse_spec(spec_data(match=[]), "card.json")


def test_a_checked_date_must_be_a_calendar_date():
    with pytest.raises(SpecError, match="not a date written YYYY-MM-DD"):
        parse_spec(spec_data(checked="29/11/2026"), "card.json")


def test_a_boolean_is_not_accepted_as_a_figure():
    with pytest.raises(SpecError, match="must be a number or null"):
        parse_spec(spec_data(memory_gb=figure(True)), "card.json")


def test_an_sm_count_must_be_whole():
    with pytest.raises(SpecError, match="sm_count must be a whole number"):
        parse_spec(spec_data(sm_count=figure(132.5)), "card.json")


def test_a_quoted_sparse_figure_must_be_recorded_so_its_half_can_be_checked():
    data = spec_data(dense_bf16_tflop_per_s=figure(989.5, quote="1,979 teraFLOPS* (* With sparsity)"))
    with pytest.raises(SpecError, match="record it as sparse_tflop_per_s"):
        parse_spec(data, "card.json")


def test_copying_the_sparse_headline_in_as_the_dense_peak_is_refused():
    # The 2x error the spec warns about: 1,979 is the with-sparsity figure, so using it halves MFU.
    data = spec_data(
        dense_bf16_tflop_per_s=figure(1979, quote="1,979 teraFLOPS* With sparsity", sparse_tflop_per_s=1979)
    )
    with pytest.raises(SpecError, match="not half the sparse 1979"):
        parse_spec(data, "card.json")


def test_a_dense_figure_that_is_half_the_sparse_one_is_accepted():
    # 1,979 / 2 = 989.5
    data = spec_data(
        dense_bf16_tflop_per_s=figure(989.5, quote="1,979 teraFLOPS* With sparsity", sparse_tflop_per_s=1979)
    )
    assert parse_spec(data, "card.json").dense_bf16_tflop_per_s.sparse_tflop_per_s == 1979


def derived_clock(value, per_sm=4096, sources=2):
    return {
        "value": value,
        "sources": [{"url": URL, "quote": f"source {i}"} for i in range(sources)],
        "derived": {"formula": "peak / (SMs x FLOP per clock per SM)", "flop_per_clock_per_sm": per_sm},
    }


def test_a_derived_tensor_clock_that_agrees_with_its_formula_is_accepted():
    # 989.4 TFLOPS / (132 SMs x 4096 FLOP/clock) = 989.4e12 / 540,672 = 1,829.94 MHz, written as 1830
    data = spec_data(
        sm_count=figure(132), dense_bf16_tflop_per_s=figure(989.4), tensor_clock_mhz=derived_clock(1830)
    )
    spec = parse_spec(data, "card.json")
    assert spec.tensor_clock_mhz.value == 1830
    assert spec.tensor_clock_mhz.derived.flop_per_clock_per_sm == 4096


def test_a_derived_tensor_clock_that_disagrees_with_its_formula_is_refused():
    # 1980 MHz is H100 SXM's maximum SM clock, not the 1829.9 MHz its dense peak is stated at.
    data = spec_data(
        sm_count=figure(132), dense_bf16_tflop_per_s=figure(989.4), tensor_clock_mhz=derived_clock(1980)
    )
    with pytest.raises(SpecError, match=r"= 1829\.9 MHz"):
        parse_spec(data, "card.json")


def test_a_derived_tensor_clock_must_cite_datasheet_and_whitepaper():
    data = spec_data(
        sm_count=figure(132),
        dense_bf16_tflop_per_s=figure(989.4),
        tensor_clock_mhz=derived_clock(1830, sources=1),
    )
    with pytest.raises(SpecError, match="cites both the datasheet and the architecture whitepaper"):
        parse_spec(data, "card.json")


def test_a_derived_tensor_clock_needs_a_known_sm_count():
    data = spec_data(
        sm_count={"value": None, "sources": [], "note": "not stated"},
        dense_bf16_tflop_per_s=figure(989.4),
        tensor_clock_mhz=derived_clock(1830),
    )
    with pytest.raises(SpecError, match="sm_count or dense_bf16_tflop_per_s is null"):
        parse_spec(data, "card.json")


def test_a_spec_without_the_per_sm_figures_reads_them_as_unknown_with_a_note():
    spec = parse_spec(spec_data(), "card.json")  # an older or plugin spec file has neither key
    for figure_ in (spec.dense_bf16_flop_per_clock_per_sm, spec.fp32_cores_per_sm):
        assert figure_.value is None and figure_.note == "not given in this spec file"


def test_a_per_sm_figure_must_be_whole_and_must_agree_with_a_derived_clock():
    with pytest.raises(SpecError, match="fp32_cores_per_sm must be a whole number"):
        parse_spec(spec_data(fp32_cores_per_sm=figure(127.5)), "card.json")
    data = spec_data(
        sm_count=figure(132),
        dense_bf16_tflop_per_s=figure(989.4),
        tensor_clock_mhz=derived_clock(1830),
        dense_bf16_flop_per_clock_per_sm=figure(2048),
    )
    with pytest.raises(SpecError, match="derived with 4096 FLOP per clock per SM but .* gives 2048"):
        parse_spec(data, "card.json")


def test_every_hopper_spec_gives_the_whitepapers_per_sm_figures_and_blackwell_says_why_not(builtin_specs):
    for spec in builtin_specs:
        if spec.architecture == "hopper":
            # 1024 dense FMA per A100 SM per clock × 2 FLOP × 2 (Hopper's SM doubles it) = 4096; 128 FP32 cores per SM
            assert spec.dense_bf16_flop_per_clock_per_sm.value == 4096, spec.id
            assert spec.fp32_cores_per_sm.value == 128, spec.id
        elif spec.architecture == "blackwell":
            assert spec.dense_bf16_flop_per_clock_per_sm.value is None, spec.id
            assert "max SM clock" in spec.dense_bf16_flop_per_clock_per_sm.note, spec.id


def test_the_h200s_tensor_clock_follows_from_the_sm_count_the_device_reports(builtin_specs):
    h200 = builtin(builtin_specs, "h200-sxm")
    # NVML counts 16,896 FP32 cores on an H200: / 128 per SM = 132 SMs
    assert sm_count_from_cores(16896, h200) == (132, None)
    # 989.5e12 / (132 × 4096) / 1e6 = 1830.13 MHz, the same clock as the H100 SXM's (989.4 → 1829.94)
    clock_mhz = derived_tensor_clock_mhz(h200.dense_bf16_tflop_per_s.value, 132, 4096)
    assert clock_mhz == pytest.approx(1830.13, abs=0.01)


def test_a_core_count_that_is_not_whole_sms_is_refused_rather_than_rounded(builtin_specs):
    h200 = builtin(builtin_specs, "h200-sxm")
    assert sm_count_from_cores(16900, h200) == (
        None,
        "NVML's 16900 cores are not a whole number of 128-core SMs",
    )
    b200 = builtin(builtin_specs, "b200")
    assert sm_count_from_cores(18944, b200)[0] is None  # no cores per SM for Blackwell in its spec


def test_the_derived_clock_formula_reproduces_the_h100_sxm_tensor_clock():
    # 989.4e12 / (132 x 4096) / 1e6 = 989.4e12 / 540,672e6 = 1829.94 MHz
    assert derived_tensor_clock_mhz(989.4, 132, 4096) == pytest.approx(1829.94, abs=0.01)


# ---------------------------------------------------------------------------------------------------------------------
# Matching


def test_longest_matching_text_wins():
    generic = made_up("generic-h100", ["H100"])
    nvl = made_up("h100-nvl", ["H100 NVL"])
    # "H100 NVL" (8 characters) beats "H100" (4), whatever the order of the specs.
    assert match_spec("NVIDIA H100 NVL", [generic, nvl]) is nvl
    assert match_spec("NVIDIA H100 NVL", [nvl, generic]) is nvl
    assert match_spec("NVIDIA H100 PCIe", [generic, nvl]) is generic


def test_an_exclude_match_vetoes_a_spec_even_when_it_matches_longest():
    sxm = made_up("h200-sxm", ["H200 NVL|H200"], exclude=["NVL"])
    assert match_spec("NVIDIA H200 NVL", [sxm]) is None


def test_matching_ignores_case():
    spec = made_up("h100-pcie", ["H100 PCIe"])
    assert match_spec("NVIDIA H100 PCIE", [spec]) is spec


def test_two_specs_tied_for_the_longest_match_give_no_spec_rather_than_a_guess():
    first = made_up("card-a", ["Test Card"], dense=400.0)
    second = made_up("card-b", ["Test Card"], dense=800.0)
    assert match_spec("NVIDIA Test Card", [first, second]) is None


def test_h200_nvl_is_the_h200_nvl_not_the_h200_sxm(builtin_specs):
    assert match_spec("NVIDIA H200 NVL", builtin_specs).id == "h200-nvl"
    assert match_spec("NVIDIA H200", builtin_specs).id == "h200-sxm"


def test_gh200_is_not_taken_for_an_h200(builtin_specs):
    assert match_spec("NVIDIA GH200 480GB", builtin_specs).id == "gh200"


def test_l40s_l40_and_l4_each_match_their_own_spec(builtin_specs):
    assert match_spec("NVIDIA L40S", builtin_specs).id == "l40s"
    assert match_spec("NVIDIA L40", builtin_specs).id == "l40"
    assert match_spec("NVIDIA L4", builtin_specs).id == "l4"


def test_a10g_and_a100_are_not_the_a10(builtin_specs):
    assert match_spec("NVIDIA A10", builtin_specs).id == "a10"
    # The A10G is an AWS part with other figures; no spec covers it, so it has no peak.
    assert match_spec("NVIDIA A10G", builtin_specs) is None
    assert match_spec("NVIDIA A100-SXM4-80GB", builtin_specs).id == "a100-sxm4-80gb"


@pytest.mark.parametrize(
    ("nvml_name", "spec_id"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000-blackwell-server"),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "h100-sxm"),
    ],
)
def test_real_nvml_names_match_their_spec(builtin_specs, nvml_name, spec_id):
    assert match_spec(nvml_name, builtin_specs).id == spec_id


@pytest.mark.parametrize(
    "nvml_name", ["Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090 D", "AMD Instinct MI300X", ""]
)
def test_an_unknown_name_has_no_spec(builtin_specs, nvml_name):
    assert match_spec(nvml_name, builtin_specs) is None


# ---------------------------------------------------------------------------------------------------------------------
# Peaks


def test_a_spec_without_a_dense_figure_has_no_peak_and_says_why():
    data = spec_data(
        display_name="GB10", dense_bf16_tflop_per_s={"value": None, "sources": [], "note": "FP4 only"}
    )
    peak_flop_per_s, reason = dense_peak_flop_per_s(parse_spec(data, "gb10.json"))
    assert peak_flop_per_s is None
    assert reason == "no dense BF16 figure on the datasheet for GB10"


def test_the_whole_gpu_peak_is_the_dense_figure_in_flops(builtin_specs):
    # 989.4 TFLOPS = 989.4e12 FLOP/s
    assert dense_peak_flop_per_s(builtin(builtin_specs, "h100-sxm")) == (pytest.approx(989.4e12), None)


def test_a_mig_slice_gets_the_peak_times_its_share_of_the_sms(builtin_specs):
    # 989.4e12 x 16 / 132 = 119.927e12 FLOP/s for a 16-SM slice of a 132-SM H100 SXM
    peak_flop_per_s, reason = dense_peak_flop_per_s(builtin(builtin_specs, "h100-sxm"), slice_sm_count=16)
    assert reason is None
    assert peak_flop_per_s == pytest.approx(119.927e12, rel=1e-4)


def test_a_mig_slice_of_a_card_with_no_cited_sm_count_has_no_peak(builtin_specs):
    peak_flop_per_s, reason = dense_peak_flop_per_s(builtin(builtin_specs, "h200-sxm"), slice_sm_count=16)
    assert peak_flop_per_s is None
    assert reason == "SM count of NVIDIA H200 SXM is not on its datasheet, so a MIG slice's share is unknown"


def test_a_slice_larger_than_the_gpu_is_a_bug_not_a_peak(builtin_specs):
    with pytest.raises(ValueError, match="slice_sm_count 133 exceeds the 132 SMs"):
        dense_peak_flop_per_s(builtin(builtin_specs, "h100-sxm"), slice_sm_count=133)


def test_the_rtx_4090_dense_bf16_peak_is_not_its_fp32_figure(builtin_specs):
    rtx_4090 = builtin(builtin_specs, "rtx-4090")
    assert rtx_4090.dense_bf16_tflop_per_s.value != 82.6
    # 330.4 with sparsity / 2 = 165.2 dense, BF16 with FP32 accumulate
    assert rtx_4090.dense_bf16_tflop_per_s.value == 165.2


def test_no_builtin_dense_figure_is_a_quoted_sparse_one(builtin_specs):
    checked = 0
    for spec in builtin_specs:
        dense = spec.dense_bf16_tflop_per_s
        quotes_sparsity = any(
            "sparsity" in s.quote.lower() or "sparse" in s.quote.lower() for s in dense.sources
        )
        if dense.value is None or not quotes_sparsity:
            continue
        checked += 1
        assert dense.sparse_tflop_per_s is not None, spec.id
        assert dense.value != dense.sparse_tflop_per_s, spec.id
        # dense == sparse / 2, to NVIDIA's rounding (L40S: 733 / 2 = 366.5 against the printed 362.05)
        assert dense.value == pytest.approx(dense.sparse_tflop_per_s / 2, rel=SPARSE_HALF_TOLERANCE), spec.id
    # 3 H100s + 2 H200s + 4 A100s + A10 + B200 + GB200 + L40S + L40 + L4 = 15 specs quote a sparse figure
    assert checked >= 15


def test_builtin_derived_clocks_are_consistent_with_their_figures(builtin_specs):
    derived = [s for s in builtin_specs if s.tensor_clock_mhz.derived is not None]
    assert {s.id for s in derived} >= {"h100-sxm", "h100-pcie", "a100-sxm4-80gb", "a100-pcie-40gb"}
    for spec in derived:
        exact_mhz = derived_tensor_clock_mhz(
            spec.dense_bf16_tflop_per_s.value,
            int(spec.sm_count.value),
            spec.tensor_clock_mhz.derived.flop_per_clock_per_sm,
        )
        assert abs(spec.tensor_clock_mhz.value - exact_mhz) <= 1.0, spec.id


def test_h100_sxm_tensor_clock_is_1830_not_the_nvml_maximum(builtin_specs):
    assert builtin(builtin_specs, "h100-sxm").tensor_clock_mhz.value == 1830
    # 312e12 / (108 x 2048) / 1e6 = 1410.6 MHz, the A100's boost clock
    assert builtin(builtin_specs, "a100-sxm4-40gb").tensor_clock_mhz.value == 1410
