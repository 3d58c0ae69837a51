"""The agent's one rule of a number (trainmeter_agent/_real_number.py), which emit() and the tracker taps share: what
it keeps, as which float, and what it refuses with which words."""

from __future__ import annotations

import enum
import math
from decimal import Decimal

import numpy
import pytest

from trainmeter_agent._real_number import ACCEPTED, NotANumber, real_number


class Level(enum.IntEnum):
    HIGH = 2


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2.5, 2.5),
        (3, 3.0),
        (True, 1.0),  # a flag counts as 1 or 0
        (False, 0.0),
        (math.inf, math.inf),  # the run counts infinities and NaN as non-finite values: they are kept
        (-math.inf, -math.inf),
        (Level.HIGH, 2.0),  # an int subclass
        (numpy.float64(0.25), 0.25),  # a float subclass
        (numpy.int64(7), 7.0),
        (numpy.bool_(True), 1.0),
        (numpy.array(1.5), 1.5),  # a 0-dim array
        (numpy.array([4.0]), 4.0),  # one element: accepted, as before the rule was shared
    ],
)
def test_a_real_number_is_kept_as_its_float(value, expected):
    number = real_number(value)
    assert type(number) is float and number == expected


def test_nan_is_kept():
    assert math.isnan(real_number(math.nan))
    assert math.isnan(real_number(numpy.float32("nan")))


@pytest.mark.parametrize(
    ("value", "got"),
    [
        (1j, "complex"),
        (numpy.complex128(1j), "complex128"),
        (10**400, "an int too large for a float"),  # float() would raise OverflowError
        ("3.0", "str"),
        (None, "NoneType"),
        (Decimal("1.5"), "Decimal"),
        ([1.0], "list"),
        (numpy.array([1.0, 2.0]), "a numpy array of shape (2,)"),
    ],
)
def test_anything_else_is_refused_saying_what_it_got(value, got):
    with pytest.raises(NotANumber) as refused:
        real_number(value)
    assert refused.value.got == got


def test_a_plain_refusal_says_what_is_accepted():
    with pytest.raises(NotANumber) as refused:
        real_number(1j)
    assert refused.value.advice == ACCEPTED
    assert "real number" in ACCEPTED and "0-dim CPU tensor" in ACCEPTED


def test_a_0_dim_cpu_tensor_of_a_real_dtype_is_kept(torch):
    assert real_number(torch.tensor(2.5)) == 2.5
    assert real_number(torch.tensor(3)) == 3.0  # integer dtype
    assert real_number(torch.tensor(True)) == 1.0  # bool dtype
    assert real_number(torch.tensor(0.5, dtype=torch.bfloat16)) == 0.5
    assert math.isnan(real_number(torch.tensor(float("nan"))))


def test_a_complex_a_shaped_or_an_accelerator_tensor_is_refused_and_never_read(torch):
    with pytest.raises(NotANumber) as refused:
        real_number(torch.tensor(1j))
    assert refused.value.got == "a complex tensor" and refused.value.advice == ACCEPTED
    with pytest.raises(NotANumber) as refused:
        real_number(torch.ones(2))
    assert refused.value.got == "a tensor of shape (2,)"
    # "meta" stands in for an accelerator: reading the value (.item()) would fail, as it would synchronize a GPU.
    with pytest.raises(NotANumber) as refused:
        real_number(torch.tensor(1j, device="meta"))
    assert refused.value.got == "a tensor on meta"
    assert refused.value.advice.format(key="loss") == "pass loss=value.item()"
