"""Facts with provenance, and what they say about the run: its devices and their peaks, its FLOPs per token.

Pure: no I/O, no clock, no globals. Precedence is declared > emitted > detected > assumed; a losing value is kept and
warned about, never dropped. It must never score a run against a device no rank reported, nor use a sparse figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from trainmeter_core.model.flops import CONVENTIONS, flop_per_token_absent_reasons, flop_per_token_all
from trainmeter_core.model.records import ExplainInput, Fact

__all__ = [
    "NO_RANK_DEVICE",
    "PRECEDENCE",
    "RENAMED_FACTS",
    "RENAMED_VALUE_KEYS",
    "FactTable",
    "ModelFlops",
    "fact_key",
    "format_number",
    "model_flops",
    "number",
    "peak_variant",
    "upgrade_fact",
    "whole",
]

#: Higher wins. A user's word beats the code's, which beats what tm sees, which beats a fallback.
PRECEDENCE: Mapping[str, int] = {"declared": 3, "emitted": 2, "detected": 1, "assumed": 0}
#: Why MFU is absent when no rank said which device it computes on (SPEC.md, "Facts and provenance").
NO_RANK_DEVICE = "no rank reported its device: pass --gpus"
#: Schema 1 named FLOP/s and FLOP counts alike ``flops``; schema 2 says ``_flop`` for a count and ``_flop_per_s`` for
#: a rate. Facts from logs written before are read under their new names (docs/bus.md has the whole table).
RENAMED_FACTS: Mapping[str, str] = {
    "flops_per_token": "flop_per_token",
    "counted_flops_per_token": "counted_flop_per_token",
    "budget_flops": "budget_flop",
}
RENAMED_VALUE_KEYS: Mapping[str, Mapping[str, str]] = {
    "gpu": {"dense_bf16_flops": "dense_bf16_flop_per_s"},
    "peak": {"flops": "flop_per_s"},
}
# Facts that exist once per rank though they carry no device field: the header rank scopes them.
_PER_RANK = frozenset({"device", "collective.stall"})  # collective.stall: trainmeter_agent/_collectives.py
# No honest count reaches 2**63; a larger one (1e300 from a broken emitter) is refused rather than overflowing.
_MAX_COUNT = 2**63
# The shape facts and the flops.py argument each one feeds.
_SHAPE_FACTS = (
    ("params", "n_params"),
    ("embedding_params", "embedding_params"),
    ("layers", "layers"),
    ("d_model", "d_model"),
    ("seq_len", "seq_len"),
)


def fact_key(fact: Fact) -> str:
    """Where a fact competes: its name, or ``name@scope`` for a per-device (``device`` field) or per-rank fact.

    A measured peak belongs to the dtype and thread count it was measured with: ``peak@vm/cpu, float32, 1 thread``
    competes with neither the 2-thread peak of the same CPU nor its float64 one."""
    if fact.device:
        variant = peak_variant(fact.value) if fact.name == "peak" else ""
        return f"{fact.name}@{fact.device}{variant}"
    if fact.name in _PER_RANK:
        return f"{fact.name}@rank{fact.rank or 0}"
    return fact.name


def peak_variant(value: Any) -> str:
    """``, float32, 1 thread`` for a peak fact that says what it was measured with; empty for one that does not."""
    if not isinstance(value, Mapping):
        return ""
    parts = []
    if isinstance(value.get("dtype"), str):
        parts.append(value["dtype"])
    threads = whole(value.get("threads"))
    if threads is not None:
        parts.append(f"{threads} thread{'s' if threads != 1 else ''}")
    return "".join(f", {p}" for p in parts)


def number(value: Any) -> float | None:
    """A fact's value as a finite float, or None when it is not a number (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    result = float(value)
    return result if math.isfinite(result) else None


def format_number(value: Any) -> str:
    """A number as a person writes it in a warning: 1.2e9, 0.45, 8; anything else as short text."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, Mapping) and number(value.get("flops")) is not None:
            return format_number(value["flops"]) + " FLOP/s"
        text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
        return text if len(text) <= 60 else text[:57] + "..."
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        mantissa, exponent = f"{value:.4g}".split("e") if "e" in f"{value:.4g}" else (f"{value:.4g}", "0")
        return f"{mantissa}e{int(exponent)}"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def upgrade_fact(fact: Fact) -> Fact:
    """A fact under its schema-2 name and value keys (itself when it already has them)."""
    name = RENAMED_FACTS.get(fact.name, fact.name)
    keys = RENAMED_VALUE_KEYS.get(name)
    value = fact.value
    if keys and isinstance(value, Mapping) and any(old in value for old in keys):
        value = {keys.get(k, k): v for k, v in value.items()}
    if name == fact.name and value is fact.value:
        return fact
    return msgspec.structs.replace(fact, name=name, value=value)


class FactTable(msgspec.Struct, kw_only=True):
    """Every fact by ``fact_key``: the winner, and the latest value of each losing provenance.

    A msgspec Struct, so the engine's checkpoint carries it as it is. ``version`` grows with every change, so a
    reader can cache what it derives from the table.
    """

    winners: dict[str, Fact] = {}
    losers: dict[str, dict[str, Fact]] = {}
    version: int = 0

    def add(self, fact: Fact) -> None:
        """Take one fact: it wins over a lower provenance, replaces the same one, and is kept when it loses."""
        fact = upgrade_fact(fact)
        key = fact_key(fact)
        current = self.winners.get(key)
        self.version += 1
        rank = PRECEDENCE.get(fact.provenance, -1)
        if current is None:
            self.winners[key] = fact
            return
        current_rank = PRECEDENCE.get(current.provenance, -1)
        if rank >= current_rank:
            self.winners[key] = fact
            if rank > current_rank:
                self.losers.setdefault(key, {})[current.provenance] = current
            return
        self.losers.setdefault(key, {})[fact.provenance] = fact

    def get(self, key: str) -> Fact | None:
        """The winning fact under ``key`` (a name, or ``name@scope``)."""
        return self.winners.get(key)

    def value(self, key: str) -> Any:
        fact = self.winners.get(key)
        return None if fact is None else fact.value

    def scoped(self, name: str) -> list[Fact]:
        """The winning facts of a per-device or per-rank name, ordered by their key."""
        prefix = name + "@"
        return [self.winners[k] for k in sorted(self.winners) if k.startswith(prefix)]

    def warnings(self) -> list[str]:
        """One line per disagreement (the winner and each losing value), then every winner's own warning."""
        lines: list[str] = []
        for key in sorted(self.winners):
            winner = self.winners[key]
            label = key.replace("@", " on ", 1)
            losing = self.losers.get(key, {})
            for provenance in sorted(losing, key=lambda p: -PRECEDENCE.get(p, -1)):
                loser = losing[provenance]
                if loser.value != winner.value:
                    lines.append(
                        f"{label} {winner.provenance} {format_number(winner.value)} but {provenance} "
                        f"{format_number(loser.value)}: using the {winner.provenance} value"
                    )
            if winner.warning:
                lines.append(f"{label}: {winner.warning}")
        return lines


# ----------------------------------------------------------------------------------------------------------------------
# FLOPs per token from the facts


class ModelFlops(msgspec.Struct, frozen=True):
    """FLOPs per token as the facts give it: one value under ``convention``, or a range over the four.

    ``convention`` is the chosen one, the provenance of a declared figure ("declared"), the only one the inputs allow
    (with ``note`` naming the others and what each lacks), or None for a range over two or more.
    """

    value: float | None = None
    low: float | None = None
    high: float | None = None
    convention: str | None = None
    absent: str | None = None
    per_convention: Mapping[str, int | None] = msgspec.field(default_factory=dict)
    reasons: Mapping[str, str] = msgspec.field(default_factory=dict)
    inputs: Mapping[str, ExplainInput] = msgspec.field(default_factory=dict)
    note: str | None = None

    @property
    def known(self) -> bool:
        return self.value is not None or self.low is not None


def model_flops(facts: FactTable) -> ModelFlops:
    """FLOPs per token: a declared figure, else the chosen convention, else a range over the computable ones (one
    value under its convention where only one can be computed)."""
    shape: dict[str, int | None] = {}
    inputs: dict[str, ExplainInput] = {}
    for fact_name, argument in _SHAPE_FACTS:
        fact = facts.get(fact_name)
        count = whole(fact.value) if fact is not None else None
        # A value that is not a whole count goes through as it is, so flops.py names the flag and the problem.
        shape[argument] = count if count is not None or fact is None else fact.value
        if fact is not None:
            inputs[fact_name] = ExplainInput(value=fact.value, unit=fact.unit, source=_source(fact))
    per_convention = flop_per_token_all(shape)
    reasons = flop_per_token_absent_reasons(shape)
    declared = facts.get("flop_per_token")
    chosen = facts.get("convention")
    chosen_value = chosen.value if chosen is not None else None
    chosen_name = chosen_value if isinstance(chosen_value, str) and chosen_value in CONVENTIONS else None
    note = None
    if chosen is not None and chosen_name is None:
        note = f"convention {chosen.value!r} is not one of {', '.join(CONVENTIONS)}: ignored"
    declared_value = number(declared.value) if declared is not None else None
    if declared_value is not None and declared_value > 0:
        inputs = {
            "flop_per_token": ExplainInput(value=declared_value, unit="FLOP/token", source=_source(declared))
        }
        if chosen_name is not None:
            note = f"a declared figure is used; the chosen convention {chosen_name} is shown beside it"
        return ModelFlops(
            value=declared_value,
            convention=declared.provenance,
            per_convention=per_convention,
            reasons=reasons,
            inputs=inputs,
            note=note,
        )
    if chosen_name is not None:
        inputs["convention"] = ExplainInput(value=chosen_name, source=_source(chosen))
        chosen_value = per_convention[chosen_name]
        return ModelFlops(
            value=None if chosen_value is None else float(chosen_value),
            convention=chosen_name,
            absent=None
            if chosen_value is not None
            else f"{reasons[chosen_name]} (or pass --flops-per-token)",
            per_convention=per_convention,
            reasons=reasons,
            inputs=inputs,
            note=note,
        )
    known = [float(v) for v in per_convention.values() if v is not None]
    if not known:
        phrases: list[str] = []
        for reason in reasons.values():
            phrases.extend(p for p in reason.split("; ") if p not in phrases)
        absent = "; ".join(phrases) + " (or pass --flops-per-token)"
        return ModelFlops(
            absent=absent, per_convention=per_convention, reasons=reasons, inputs=inputs, note=note
        )
    if len(known) == 1:
        # A range whose ends are one value is one number: under the one convention the inputs allow, the others named
        # with what each lacks, so that nobody reads it as the conventions agreeing.
        (only,) = [name for name, value in per_convention.items() if value is not None]
        missing = "; ".join(f"{name}: {reasons[name]}" for name in per_convention if name in reasons)
        said = f"only {only} could be computed (no convention chosen); the others lack an input: {missing}"
        return ModelFlops(
            value=known[0],
            convention=only,
            per_convention=per_convention,
            reasons=reasons,
            inputs=inputs,
            note=(note + "; " if note else "") + said,
        )
    if len(known) < len(per_convention):
        missing = ", ".join(sorted(reasons))
        note = (note + "; " if note else "") + f"the range leaves out {missing}, whose inputs are unknown"
    return ModelFlops(
        low=min(known),
        high=max(known),
        per_convention=per_convention,
        reasons=reasons,
        inputs=inputs,
        note=note,
    )


def whole(value: Any) -> int | None:
    # Counts may arrive as floats (1.2e9 through JSON); only a whole number is a count.
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and abs(value) < _MAX_COUNT:
        return value
    if isinstance(value, float) and abs(value) < _MAX_COUNT and value.is_integer():
        return int(value)
    return None


def _source(fact: Fact) -> str:
    return f"{fact.provenance} ({fact.origin})"
