"""Numbers a person types (`20B`, `1.5e9`, `300M`, `7_000`, `45%`) turned into exact counts and checked floats.

Pure: no I/O, no clock. It must never guess: a value it cannot read exactly is refused with one line
that names the flag and says what is accepted, never rounded, clamped or replaced by a default.
"""

from __future__ import annotations

import decimal
import math
import re

__all__ = [
    "SUFFIX_MULTIPLIERS",
    "QuantityError",
    "parse_count",
    "parse_fraction",
    "parse_positive_float",
]

# Suffixes are read case-insensitively. `m` is mega, never milli: nobody declares a milli-token budget,
# and people write "124m" for a 124-million-parameter model.
SUFFIX_MULTIPLIERS: dict[str, int] = {
    "k": 10**3,
    "m": 10**6,
    "b": 10**9,
    "g": 10**9,
    "t": 10**12,
}

_COUNT_ACCEPTED = "give a whole positive count such as 20B, 1.5e9 or 300M"
_FLOAT_ACCEPTED = "give a positive number such as 72, 1.5e3 or 2k"
_FRACTION_ACCEPTED = "give a fraction above 0 and at most 1, such as 0.45 or 45%"

# Longer than any honest quantity; it also bounds the decimal precision needed below.
_MAX_TEXT_CHARS = 64

# One optional sign, digits with single underscores between them (as in Python literals), an optional
# fraction, an optional exponent, then at most one suffix (a multiplier or a percent sign).
_NUMBER_RE = re.compile(
    r"""
    (?P<sign>[+-])?
    (?P<mantissa>
        (?:\d(?:_?\d)*)(?:\.(?:\d(?:_?\d)*)?)?
      | \.\d(?:_?\d)*
    )
    (?P<exponent>[eE][+-]?\d+)?
    [ \t]*
    (?P<suffix>[kKmMbBgGtT%])?
    """,
    # ASCII only: \d would otherwise admit other scripts' digits, which nobody means to type here.
    re.VERBOSE | re.ASCII,
)
_NOT_FINITE_RE = re.compile(r"[+-]?(nan|inf|infinity)", re.IGNORECASE)


class QuantityError(ValueError):
    """A typed quantity was refused; the message is one line naming the flag and what is accepted."""

    def __init__(self, flag: str, text: object, problem: str, accepted: str) -> None:
        self.flag = flag
        self.text = text
        super().__init__(f"{flag}: {_shown(text)} {problem}; {accepted}")


def parse_count(text: object, flag: str, *, accepted: str | None = None, allow_zero: bool = False) -> int:
    """A whole, positive, finite count, exact: `20B` is 20 * 10**9 and `1.5e9` is 1_500_000_000.

    `accepted` replaces the generic hint in error messages ("give a whole token count such as 20B").
    `allow_zero` admits 0 for counts where none is a real answer (embedding parameters of a RoPE model).
    """
    hint = accepted or _COUNT_ACCEPTED
    value = _read_decimal(text, flag, hint, allow_percent=False)
    _refuse_sign(value, text, flag, hint, allow_zero=allow_zero)
    if value != value.to_integral_value():
        raise QuantityError(flag, text, "is not a whole number", hint)
    return int(value)


def parse_positive_float(text: object, flag: str, *, accepted: str | None = None) -> float:
    """A finite number above zero (`72`, `989.4`, `1.5e3`, `2k`), as a float."""
    hint = accepted or _FLOAT_ACCEPTED
    value = _read_decimal(text, flag, hint, allow_percent=False)
    _refuse_sign(value, text, flag, hint, allow_zero=False)
    number = float(value)
    if number == 0.0:
        # A positive value this small underflows to 0.0 as a float; saying "is zero" would be false.
        raise QuantityError(flag, text, "is too small to represent", hint)
    return number


def parse_fraction(text: object, flag: str, *, accepted: str | None = None) -> float:
    """A fraction in (0, 1]: `0.45` or `45%`. `3` is refused rather than read as 3% or 300%."""
    hint = accepted or _FRACTION_ACCEPTED
    value = _read_decimal(text, flag, hint, allow_percent=True)
    _refuse_sign(value, text, flag, hint, allow_zero=False)
    if value > 1:
        raise QuantityError(flag, text, "is above 1 (100%)", hint)
    fraction = float(value)
    if fraction == 0.0:
        raise QuantityError(flag, text, "is too small to represent", hint)
    return fraction


def _read_decimal(text: object, flag: str, hint: str, *, allow_percent: bool) -> decimal.Decimal:
    """The exact decimal value of `text` with its suffix applied; refuses what is not a finite number."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise QuantityError(flag, text, "is not a number", hint)
    if isinstance(text, float) and not math.isfinite(text):
        raise QuantityError(flag, text, "is not a finite number", hint)
    # repr() of a float is the shortest text that reads back to the same float, so 1.5e9 stays exact.
    raw = repr(text) if isinstance(text, float) else str(text)
    stripped = raw.strip()
    if not stripped:
        raise QuantityError(flag, text, "is empty", hint)
    if len(stripped) > _MAX_TEXT_CHARS:
        raise QuantityError(flag, text, "is too long to be a number", hint)
    if _NOT_FINITE_RE.fullmatch(stripped):
        raise QuantityError(flag, text, "is not a finite number", hint)
    match = _NUMBER_RE.fullmatch(stripped)
    if match is None:
        raise QuantityError(flag, text, "is not a number", hint)
    suffix = (match["suffix"] or "").lower()
    if suffix == "%" and not allow_percent:
        raise QuantityError(flag, text, "is a percentage, which this input does not take", hint)
    if suffix not in ("", "%") and allow_percent:
        raise QuantityError(flag, text, f"has a multiplier suffix {match['suffix']!r}", hint)

    digits = (match["sign"] or "") + match["mantissa"].replace("_", "") + (match["exponent"] or "")
    with decimal.localcontext() as context:
        # Enough precision that no typed number is ever rounded, and an exponent range wide enough that
        # `1e-999999999` is read as tiny rather than silently flushed to zero.
        context.prec = _MAX_TEXT_CHARS + 20
        context.Emax = decimal.MAX_EMAX
        context.Emin = decimal.MIN_EMIN
        context.traps[decimal.Inexact] = True
        try:
            value = decimal.Decimal(digits)
            if suffix == "%":
                value = value / 100
            elif suffix:
                value = value * SUFFIX_MULTIPLIERS[suffix]
        except decimal.DecimalException:
            raise QuantityError(flag, text, "is not a finite number", hint) from None
    # A value a float cannot hold (1e400) is no honest quantity, and would turn into inf downstream.
    if not math.isfinite(float(value)):
        raise QuantityError(flag, text, "is not a finite number", hint)
    return value


def _refuse_sign(value: decimal.Decimal, text: object, flag: str, hint: str, *, allow_zero: bool) -> None:
    if value < 0:
        raise QuantityError(flag, text, "is negative", hint)
    if value == 0 and not allow_zero:
        raise QuantityError(flag, text, "is zero", hint)


def _shown(text: object) -> str:
    """The user's value quoted on one line (repr escapes newlines), cut short if it is long."""
    if isinstance(text, str):
        shown = repr(text.strip() if text.strip() else text)
    else:
        shown = repr(text)
    return shown if len(shown) <= 40 else shown[:37] + "...'"
