"""The one rule of what counts as a number in the agent: ``emit()`` and the tracker taps both read their values through
``real_number``, so a value is kept or refused the same way whichever of them it came through.

It never reads an accelerator tensor (that would synchronize the device) and never imports torch or numpy.
"""

from __future__ import annotations

import sys

#: What a refused value should have been, for the line ``emit()`` says.
ACCEPTED = "pass a real number: an int, float, bool or 0-dim CPU tensor"


class NotANumber(ValueError):
    """A value ``real_number`` refuses: ``got`` says what it was, ``advice`` what to pass instead (``{key}`` stands
    for the name it was passed under)."""

    def __init__(self, got: str, advice: str = ACCEPTED) -> None:
        super().__init__(f"got {got}")
        self.got = got
        self.advice = advice


def real_number(value: object) -> float:
    """The float a value stands for, or ``NotANumber`` for a value that is not one real number.

    Accepted: ``int``, ``float`` and ``bool`` (1.0 and 0.0) and their subclasses (``numpy.float64``, an ``IntEnum``);
    NaN and the infinities (the run counts them as non-finite values); a 0-dim CPU tensor of a real dtype, integer or
    bool included; a numpy scalar or one-element array of a real dtype. Refused: a tensor on another device (never
    read: ``.item()`` is the loop's choice to synchronize), a tensor of several values, a complex tensor, a complex
    number (Python's or numpy's), an int too large for a float, a numpy array of several values, anything else
    (strings, ``None``, ``Decimal``).
    """
    kind = type(value)
    if kind is float:
        return value
    if kind is int or kind is bool:
        return _from_int(value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        device = value.device.type
        if device != "cpu":
            raise NotANumber(f"a tensor on {device}", "pass {key}=value.item()")
        if value.dim() != 0:
            raise NotANumber(f"a tensor of shape {tuple(value.shape)}", "pass one number")
        if value.is_complex():
            raise NotANumber("a complex tensor")
        return _from_int(value.item())
    if isinstance(value, float):  # subclasses: numpy.float64, ...
        return float(value)
    if isinstance(value, int):  # subclasses: IntEnum, ...
        return _from_int(value)
    if kind.__module__ == "numpy" and hasattr(value, "item"):
        if getattr(value, "size", 1) != 1:
            raise NotANumber(f"a numpy array of shape {value.shape}", "pass one number")
        item = value.item()
        if type(item) in (int, float, bool):
            return _from_int(item)
    raise NotANumber(kind.__name__)


def _from_int(value: int | float | bool) -> float:
    """``float(value)``, refusing an int beyond a float's range (``float()`` would raise OverflowError)."""
    try:
        return float(value)
    except OverflowError:
        raise NotANumber("an int too large for a float") from None
