"""Declared inputs from flags and tm.toml: parsing, precedence, cross-checks and one-line refusals."""

import argparse

import pytest

from trainmeter_core.model.declared import (
    DECLARED,
    Declared,
    DeclaredInputError,
    add_declared_arguments,
    load_tm_toml,
    parse_declared,
)


def _flags(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    add_declared_arguments(parser)
    return vars(parser.parse_args(list(argv)))


def _refusal(flag_values=None, toml_values=None, toml_path=None) -> str:
    with pytest.raises(DeclaredInputError) as caught:
        parse_declared(flag_values or {}, toml_values or {}, toml_path)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_declared_table_covers_every_flag_in_the_spec():
    spec_flags = (
        "--budget-tokens --budget-steps --budget-flops --tokens-per-step --flops-per-token --convention --params "
        "--embedding-params --layers --d-model --seq-len --dp --plan-mfu --plan-hours --peak-tflops --peak-source"
    ).split()
    assert [row.flag for row in DECLARED] == spec_flags
    for row in DECLARED:
        assert row.toml_key == row.flag[2:].replace("-", "_")
        assert row.unit and row.help and row.accepted


def test_flags_are_added_as_strings_defaulting_to_none():
    values = _flags("--budget-tokens", "20B")
    assert values["budget_tokens"] == "20B"
    assert values["layers"] is None
    assert len([key for key in values if values[key] is None]) == len(DECLARED) - 1


def test_20b_is_exactly_twenty_billion_with_its_unit_and_origin():
    declared = parse_declared(_flags("--budget-tokens", "20B"), {}, None)
    assert declared == {
        "budget_tokens": Declared("budget_tokens", 20_000_000_000, "tokens", "--budget-tokens")
    }
    assert type(declared["budget_tokens"].value) is int


def test_an_input_given_nowhere_is_absent_not_zero():
    assert parse_declared(_flags(), {}, None) == {}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ("--budget-tokens", "1e400"),
            "--budget-tokens: '1e400' is not a finite number; give a whole token count such as 20B or 1.5e9",
        ),
        (
            ("--budget-tokens", "nan"),
            "--budget-tokens: 'nan' is not a finite number; give a whole token count such as 20B or 1.5e9",
        ),
        (
            ("--budget-tokens", "-5"),
            "--budget-tokens: '-5' is negative; give a whole token count such as 20B or 1.5e9",
        ),
        (
            ("--budget-tokens", "5e-3"),
            "--budget-tokens: '5e-3' is not a whole number; give a whole token count such as 20B or 1.5e9",
        ),
        (
            ("--layers", "2.5"),
            "--layers: '2.5' is not a whole number; give a whole number of layers such as 24",
        ),
        (
            ("--convention", "palm"),
            "--convention: unknown convention 'palm'; give one of titan, megatron, hf, all_params",
        ),
        (
            ("--plan-mfu", "3"),
            "--plan-mfu: '3' is above 1 (100%); give a fraction above 0 and at most 1, such as 0.45 or 45%",
        ),
    ],
)
def test_every_bad_value_in_the_issue_gets_one_clear_line_naming_the_flag(argv, message):
    assert _refusal(_flags(*argv)) == message


def test_counted_is_refused_as_a_convention_with_why():
    assert "shown beside MFU, never as its convention" in _refusal(_flags("--convention", "counted"))


def test_every_kind_of_value_parses_to_its_type():
    declared = parse_declared(
        _flags(
            "--convention",
            "Megatron",
            "--plan-mfu",
            "45%",
            "--plan-hours",
            "72",
            "--flops-per-token",
            "6.28e9",
            "--embedding-params",
            "0",
            "--peak-tflops",
            "989",
            "--peak-source",
            "  H100 SXM datasheet, dense BF16 ",
        ),
        {},
        None,
    )
    assert declared["convention"].value == "megatron"
    assert declared["plan_mfu"].value == pytest.approx(0.45, rel=0, abs=1e-15)
    assert declared["plan_hours"].value == 72.0
    assert declared["flops_per_token"].value == 6.28e9
    assert declared["embedding_params"].value == 0  # a RoPE model with a tied head has no lookup-only table
    assert declared["peak_tflops"] == Declared("peak_tflops", 989.0, "TFLOPS", "--peak-tflops")
    assert declared["peak_source"].value == "H100 SXM datasheet, dense BF16"


def test_flag_spellings_are_accepted_as_keys_too():
    declared = parse_declared({"--layers": "18", "name": "my-run", "gpus": "0,1"}, {}, None)
    assert declared == {"layers": Declared("layers", 18, "layers", "--layers")}


def test_peak_tflops_without_peak_source_is_refused():
    message = _refusal(_flags("--peak-tflops", "989"))
    assert message.startswith("--peak-tflops needs --peak-source")


def test_peak_source_without_peak_tflops_is_refused():
    assert _refusal(_flags("--peak-source", "datasheet")).startswith("--peak-source needs --peak-tflops")


def test_a_peak_source_over_several_lines_is_refused():
    assert "spans several lines" in _refusal(_flags("--peak-tflops", "989", "--peak-source", "a\nb"))


def test_embedding_params_above_params_is_refused():
    message = _refusal(_flags("--params", "100M", "--embedding-params", "200M"))
    assert message == (
        "--embedding-params (200000000) exceeds --params (100000000): embedding parameters are part of the total"
    )


def test_a_flag_beats_tm_toml():
    declared = parse_declared(
        _flags("--budget-tokens", "20B"), {"budget_tokens": "1T", "layers": 18}, "tm.toml"
    )
    assert declared["budget_tokens"] == Declared("budget_tokens", 20_000_000_000, "tokens", "--budget-tokens")
    assert declared["layers"] == Declared("layers", 18, "layers", "tm.toml:layers")


def test_a_flag_beats_a_bad_value_in_tm_toml():
    # The file's value is never read when the flag gives one, so a stale bad value there does not block a run.
    declared = parse_declared(_flags("--layers", "18"), {"layers": 2.5}, "tm.toml")
    assert declared["layers"].value == 18


def test_tm_toml_keys_live_at_top_level_or_under_run_and_other_tables_pass_through():
    document = {
        "budget_tokens": "20B",
        "run": {"d_model": 2048, "plan_mfu": 0.4, "seq_len": 1.024e3},
        "alerts": {"budget_tokens": "not ours", "webhook": "https://example.invalid"},
    }
    declared = parse_declared(_flags(), document, "/work/run/tm.toml")
    assert {name: item.value for name, item in declared.items()} == {
        "budget_tokens": 20_000_000_000,
        "d_model": 2048,
        "seq_len": 1024,  # a TOML float that is whole is a count
        "plan_mfu": 0.4,
    }
    assert declared["d_model"].origin == "tm.toml:d_model"
    assert document["alerts"] == {"budget_tokens": "not ours", "webhook": "https://example.invalid"}


def test_a_bad_value_in_tm_toml_names_the_file_and_key():
    message = _refusal(toml_values={"run": {"budget_tokens": "1e400"}}, toml_path="/work/run/tm.toml")
    assert message == (
        "/work/run/tm.toml:budget_tokens: '1e400' is not a finite number; "
        "give a whole token count such as 20B or 1.5e9"
    )


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"budget-tokens": "20B"}, "tm.toml: unknown key 'budget-tokens' (did you mean budget_tokens?)"),
        ({"run": {"layer": 18}}, "tm.toml: unknown key 'layer' (did you mean layers?)"),
        ({"colour": "blue"}, "tm.toml: unknown key 'colour'; accepted keys: budget_tokens,"),
        (
            {"layers": 18, "run": {"layers": 20}},
            "layers is set both at the top level and under [run]; keep one",
        ),
        ({"run": 5}, "tm.toml: 'run' must be a table ([run])"),
        ({"layers": True}, "tm.toml:layers: True is not a number"),
        ({"layers": [18]}, "tm.toml:layers: [18] is not a number"),
        ({"convention": 3}, "tm.toml:convention: 3 is not a convention name"),
        ({"plan_mfu": 3}, "tm.toml:plan_mfu: 3 is above 1 (100%)"),
    ],
)
def test_unknown_keys_and_bad_values_in_the_declared_part_of_tm_toml_are_refused(document, expected):
    assert expected in _refusal(toml_values=document)


def test_load_tm_toml_reads_the_file(tmp_path):
    path = tmp_path / "tm.toml"
    path.write_text(
        'budget_tokens = "20B"\n\n[run]\nlayers = 18\n\n[alerts]\nhung_after_s = 600\n', encoding="utf-8"
    )
    document = load_tm_toml(path)
    assert document == {"budget_tokens": "20B", "run": {"layers": 18}, "alerts": {"hung_after_s": 600}}
    assert parse_declared({}, document, str(path))["layers"].value == 18


def test_a_toml_syntax_error_is_one_line_naming_the_file_and_line(tmp_path):
    path = tmp_path / "tm.toml"
    path.write_text('budget_tokens = "20B"\nlayers = \nd_model = 2048\n', encoding="utf-8")
    with pytest.raises(DeclaredInputError) as caught:
        load_tm_toml(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: TOML syntax error at line 2: ")
    assert "\n" not in message


def test_an_unterminated_table_reports_its_line(tmp_path):
    path = tmp_path / "tm.toml"
    path.write_text("layers = 18\n[run\n", encoding="utf-8")
    with pytest.raises(DeclaredInputError, match=r"TOML syntax error at line 2: "):
        load_tm_toml(path)


def test_a_missing_or_undecodable_tm_toml_is_one_line(tmp_path):
    with pytest.raises(DeclaredInputError, match=r"tm\.toml: cannot read it"):
        load_tm_toml(tmp_path / "tm.toml")
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'peak_source = "caf\xe9"\n')
    with pytest.raises(DeclaredInputError, match=r"not UTF-8 text"):
        load_tm_toml(path)
