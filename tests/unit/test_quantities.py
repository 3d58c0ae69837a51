"""Typed quantities: exact counts with suffixes, positive floats, fractions, and one-line refusals."""

import pytest

from trainmeter_core.model.quantities import QuantityError, parse_count, parse_fraction, parse_positive_float

TOKENS_HINT = "give a whole token count such as 20B or 1.5e9"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("20B", 20 * 10**9),
        ("1.5e9", 1_500_000_000),
        ("300M", 300 * 10**6),
        ("2k", 2_000),
        ("2K", 2_000),
        ("1T", 10**12),
        ("7_000", 7_000),
        ("20G", 20 * 10**9),
        ("124m", 124 * 10**6),  # m is mega, never milli
        ("1.04B", 1_040_000_000),
        ("  20B  ", 20 * 10**9),
        ("20 B", 20 * 10**9),
        ("+5", 5),
        ("5.", 5),
        ("2.5e3", 2_500),
        ("0.5k", 500),
        ("12345678901234567890123", 12_345_678_901_234_567_890_123),  # past a float's 53 bits, still exact
    ],
)
def test_counts_are_read_exactly(text, expected):
    result = parse_count(text, "--budget-tokens")
    assert type(result) is int
    assert result == expected


def test_20b_is_exactly_twenty_billion_not_a_float_approximation():
    assert parse_count("20B", "--budget-tokens") == 20_000_000_000
    # 1.1e9 as a float is 1100000000.0000002384...; decimal arithmetic keeps the typed value
    assert parse_count("1.1B", "--budget-tokens") == 1_100_000_000


def test_numbers_from_tm_toml_are_accepted_as_ints_and_floats():
    assert parse_count(20_000_000_000, "tm.toml:budget_tokens") == 20_000_000_000
    # repr(1.5e9) is '1500000000.0', read exactly
    assert parse_count(1.5e9, "tm.toml:budget_tokens") == 1_500_000_000


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("1e400", "'1e400' is not a finite number"),
        ("nan", "'nan' is not a finite number"),
        ("NaN", "'NaN' is not a finite number"),
        ("inf", "'inf' is not a finite number"),
        ("-Infinity", "'-Infinity' is not a finite number"),
        ("-5", "'-5' is negative"),
        ("0", "'0' is zero"),
        ("5e-3", "'5e-3' is not a whole number"),
        ("2.5", "'2.5' is not a whole number"),
        ("", "'' is empty"),
        ("twenty", "'twenty' is not a number"),
        ("1,000", "'1,000' is not a number"),
        ("0x10", "'0x10' is not a number"),
        ("20BB", "'20BB' is not a number"),
        ("1__000", "'1__000' is not a number"),
        ("45%", "'45%' is a percentage"),
        ("١٢", "is not a number"),  # other scripts' digits are not read as 12
    ],
)
def test_bad_counts_are_refused_with_one_line_naming_the_flag(text, problem):
    with pytest.raises(QuantityError) as caught:
        parse_count(text, "--budget-tokens", accepted=TOKENS_HINT)
    message = str(caught.value)
    assert message.startswith("--budget-tokens: ")
    assert problem in message
    assert message.endswith(TOKENS_HINT)
    assert "\n" not in message


def test_the_brief_example_message_is_word_for_word():
    with pytest.raises(QuantityError) as caught:
        parse_count("1e400", "--budget-tokens", accepted=TOKENS_HINT)
    assert str(caught.value) == (
        "--budget-tokens: '1e400' is not a finite number; give a whole token count such as 20B or 1.5e9"
    )


def test_quantity_error_is_a_value_error_that_knows_its_flag():
    with pytest.raises(ValueError) as caught:
        parse_count("2.5", "--layers")
    assert isinstance(caught.value, QuantityError)
    assert caught.value.flag == "--layers"
    assert caught.value.text == "2.5"


def test_a_newline_in_the_text_cannot_break_the_one_line_message():
    with pytest.raises(QuantityError) as caught:
        parse_count("20\nB", "--budget-tokens")
    assert "\n" not in str(caught.value)
    assert "\\n" in str(caught.value)


def test_zero_is_accepted_only_where_it_is_a_real_answer():
    assert parse_count("0", "--embedding-params", allow_zero=True) == 0
    with pytest.raises(QuantityError, match="is negative"):
        parse_count("-1", "--embedding-params", allow_zero=True)


@pytest.mark.parametrize("value", [True, None, [20], float("nan"), float("inf")])
def test_values_that_are_not_numbers_or_not_finite_are_refused(value):
    with pytest.raises(QuantityError, match="--budget-tokens: "):
        parse_count(value, "--budget-tokens")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("72", 72.0), ("989.4", 989.4), ("1.5e3", 1500.0), ("2k", 2000.0), ("0.25", 0.25), (36, 36.0)],
)
def test_positive_floats_are_read(text, expected):
    assert parse_positive_float(text, "--plan-hours") == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("1e400", "is not a finite number"),
        ("inf", "is not a finite number"),
        ("nan", "is not a finite number"),
        ("-3", "is negative"),
        ("0", "is zero"),
        ("0.0", "is zero"),
        ("1e-400", "is too small to represent"),
        ("50%", "is a percentage"),
    ],
)
def test_bad_positive_floats_are_refused(text, problem):
    with pytest.raises(QuantityError) as caught:
        parse_positive_float(text, "--plan-hours")
    assert str(caught.value).startswith(f"--plan-hours: '{text}' {problem}")


@pytest.mark.parametrize(
    ("text", "expected"), [("0.45", 0.45), ("45%", 0.45), ("1", 1.0), ("100%", 1.0), ("4.5%", 0.045)]
)
def test_fractions_accept_a_decimal_or_a_percentage(text, expected):
    assert parse_fraction(text, "--plan-mfu") == pytest.approx(expected, rel=0, abs=1e-15)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("3", "'3' is above 1 (100%)"),  # --plan-mfu 3 is neither 3% nor 300%: refused
        ("150%", "'150%' is above 1 (100%)"),
        ("0", "'0' is zero"),
        ("-0.1", "'-0.1' is negative"),
        ("nan", "'nan' is not a finite number"),
        ("2k", "has a multiplier suffix 'k'"),
    ],
)
def test_bad_fractions_are_refused(text, problem):
    with pytest.raises(QuantityError) as caught:
        parse_fraction(text, "--plan-mfu")
    message = str(caught.value)
    assert message.startswith("--plan-mfu: ")
    assert problem in message
    assert message.endswith("give a fraction above 0 and at most 1, such as 0.45 or 45%")
