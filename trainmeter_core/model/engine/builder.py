"""The snapshot builder every metric family writes into: one ``MetricValue`` and its ``Explain`` per key. Pure; it
never shows a number that is not finite, and a metric that lacks an input is absent, naming the input."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from trainmeter_core.model import records
from trainmeter_core.model.facts import number

if TYPE_CHECKING:
    from trainmeter_core.model.engine.derived import Derived
    from trainmeter_core.model.engine.state import EngineState

NO_STEP = "no training step yet"
NO_TOKENS = "tokens per step unknown: pass --tokens-per-step"
NO_BUDGET = "budget not declared: pass --budget-tokens"
EI = records.ExplainInput


class SnapshotBuilder:
    """Builds one snapshot: every metric a MetricValue with its Explain, or absent naming the missing input.

    The metric families (one module each) fill it in order; they read the engine's ``state`` and ``derived``, what
    the facts imply (the rig, FLOPs per token, ...). What a later family needs of an earlier one (tokens/s, MFU, ETA,
    elapsed time) is kept here as attributes.
    """

    def __init__(self, state: EngineState, derived: Derived, final: bool, lean: bool = False) -> None:
        self.lean = lean
        self.state = state
        self.derived = derived.refresh()
        self.final = final
        self.metrics: dict[str, records.MetricValue] = {}
        self.explain: dict[str, records.Explain] = {}
        self.tps: float | None = None
        self.tps_absent = NO_STEP
        self.mfu: tuple[float, float] | None = None  # (low, high); equal ends when a convention is chosen
        self.mfu_avg: tuple[float, float] | None = None  # the same over the training window
        # What the counters show (the latest sample's while the run lives, the training window's at its end), and
        # which: the gap and the arithmetic intensity pair them with the MFU of the same window.
        self.dram_active: float | None = None
        self.ofu: float | None = None
        self.counters_window = False
        self.eta_s: float | None = None
        self.elapsed_s: float | None = None

    def put(
        self,
        key: str,
        formula: str,
        *,
        absent: str | None = None,
        inputs: dict[str, records.ExplainInput] | None = None,
        note: str | None = None,
        **fields: Any,
    ) -> None:
        if absent is None and not finite(fields.get("value"), fields.get("low"), fields.get("high")):
            # An input far outside its range (a count of 1e300) must not show as inf or NaN.
            absent = f"not a finite number: an input is out of range ({formula})"
        if absent is not None:
            fields = {k: v for k, v in fields.items() if k in ("unit", "convention", "label")}
            fields["absent"] = absent
        self.metrics[key] = records.MetricValue(**fields)
        if not self.lean:
            self.explain[key] = records.Explain(formula=formula, inputs=inputs or {}, note=note)

    def fpt_ends(self) -> tuple[float, float] | None:
        """FLOPs per token: (value, value) under a convention, (low, high) over the conventions, or None."""
        flops = self.derived.flops
        if flops.value is not None:
            return flops.value, flops.value
        if flops.low is not None and flops.high is not None:
            return flops.low, flops.high
        return None

    def put_scaled(self, key: str, formula: str, factor: float, unit: str, **extra: Any) -> None:
        """FLOPs per token × ``factor``: one value under a convention, else a range over the conventions."""
        ends = self.fpt_ends()
        flops = self.derived.flops
        conv = flops.convention
        if ends is None:
            self.put(key, formula, absent=flops.absent, unit=unit, **extra)
        elif conv is not None:
            self.put(key, formula, value=ends[0] * factor, unit=unit, convention=conv, **extra)
        else:
            note = "no convention chosen (pass --convention): the range over the conventions"
            self.put(key, formula, low=ends[0] * factor, high=ends[1] * factor, unit=unit, note=note, **extra)


def finite(*values: float | None) -> bool:
    for value in values:
        if value is not None and not -math.inf < value < math.inf:
            return False
    return True


def positive(value: Any) -> float | None:
    result = number(value)
    return result if result is not None and result > 0 else None


def fact_source(fact: records.Fact | None) -> str | None:
    return None if fact is None else f"{fact.provenance} ({fact.origin})"


def join_notes(notes: list[str]) -> str | None:
    return "; ".join(notes) if notes else None
