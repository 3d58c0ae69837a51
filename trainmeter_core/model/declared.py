"""The inputs only a user knows (budget, model shape, plan, peak), from flags or a `tm.toml`; a flag beats the file.

It reads one file (tm.toml) and nothing else, and never guesses: a bad or unknown value is one line naming
the flag or the file's key and what is accepted, and an input given nowhere is simply absent.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from trainmeter_core.model import money
from trainmeter_core.model.flops import CONVENTIONS
from trainmeter_core.model.quantities import QuantityError, parse_count, parse_fraction, parse_positive_float

__all__ = [
    "DECLARED",
    "RUN_TABLE",
    "Declared",
    "DeclaredInput",
    "DeclaredInputError",
    "add_declared_arguments",
    "load_tm_toml",
    "parse_declared",
]

# Declared keys may also sit under this table; every other table belongs to another component.
RUN_TABLE = "run"


class DeclaredInputError(ValueError):
    """A declared input was refused; the message is one line naming the flag or tm.toml key."""


@dataclass(frozen=True)
class DeclaredInput:
    """One row of the table of declarable inputs."""

    flag: str
    toml_key: str
    kind: str  # count, count_or_zero, positive_float, fraction, convention, text
    unit: str
    help: str
    accepted: str  # what to type, quoted in error messages


@dataclass(frozen=True)
class Declared:
    """One declared fact: its name (the tm.toml key), parsed value, unit, and where it came from."""

    name: str
    value: int | float | str
    unit: str
    origin: str  # "--budget-tokens" or "tm.toml:budget_tokens"


_CONVENTION_NAMES = ", ".join(CONVENTIONS)


def _row(flag: str, kind: str, unit: str, help_text: str, accepted: str) -> DeclaredInput:
    # The tm.toml key is the flag without dashes, with underscores: one spelling rule, no table to drift.
    return DeclaredInput(flag, flag.removeprefix("--").replace("-", "_"), kind, unit, help_text, accepted)


DECLARED: tuple[DeclaredInput, ...] = (
    _row("--budget-tokens", "count", "tokens",
         "tokens the run is meant to see; enables progress, ETA and FLOPs required",
         "give a whole token count such as 20B or 1.5e9"),
    _row("--budget-steps", "count", "steps",
         "optimizer steps the run is meant to take",
         "give a whole number of steps such as 100k or 5000"),
    _row("--budget-flops", "count", "FLOPs",
         "training FLOPs the run is meant to spend",
         "give a whole FLOP count such as 1e21"),
    _row("--tokens-per-step", "count", "tokens",
         "tokens in one optimizer step across all ranks, if the loop does not report them",
         "give a whole token count such as 524288 or 512k"),
    _row("--flops-per-token", "positive_float", "FLOPs/token",
         "model FLOPs per token, if you have your own figure (it overrides the model shape)",
         "give a positive number such as 6.28e9"),
    _row("--convention", "convention", "convention",
         f"the FLOPs-per-token convention MFU is shown in ({_CONVENTION_NAMES}); without it, a range",
         f"give one of {_CONVENTION_NAMES}"),
    _row("--params", "count", "parameters",
         "total parameters N, each shared weight counted once",
         "give a whole parameter count such as 1.04B or 124M"),
    _row("--embedding-params", "count_or_zero", "parameters",
         "embedding parameters E used only as lookups (position tables; the token table if the head is untied)",
         "give a whole parameter count, 0 or more, such as 67.6M"),
    _row("--layers", "count", "layers",
         "transformer layers L",
         "give a whole number of layers such as 24"),
    _row("--d-model", "count", "features",
         "model width d (hidden size)",
         "give a whole width such as 2048"),
    _row("--seq-len", "count", "tokens",
         "sequence length T the model trains on",
         "give a whole number of tokens such as 1024 or 8k"),
    _row("--dp", "count", "replicas",
         "data-parallel degree",
         "give a whole number of replicas such as 8"),
    _row("--plan-mfu", "fraction", "fraction",
         "the MFU the plan assumed, shown against the measured one",
         "give a fraction above 0 and at most 1, such as 0.45 or 45%"),
    _row("--plan-hours", "positive_float", "h",
         "the wall-clock hours the plan assumed",
         "give a positive number of hours such as 72 or 1.5"),
    _row("--peak-tflops", "positive_float", "TFLOPS",
         "dense BF16 peak per device, overriding the device spec (needs --peak-source)",
         "give a positive dense TFLOPS figure such as 989"),
    _row("--peak-source", "text", "text",
         "where the --peak-tflops figure comes from (a datasheet line, a measurement)",
         "give one line of text naming the source, such as 'H100 SXM datasheet, dense BF16'"),
)  # fmt: skip

_BY_KEY: Mapping[str, DeclaredInput] = MappingProxyType({row.toml_key: row for row in DECLARED})

_PEAK_SOURCE_MAX_CHARS = 200


def add_declared_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Add every declared flag to `parser` as a string with default None (parse_declared() reads them)."""
    group = parser.add_argument_group(
        "declared inputs", "What only you know; each may also be a key in tm.toml next to the script."
    )
    for row in DECLARED:
        group.add_argument(
            row.flag,
            dest=row.toml_key,
            default=None,
            metavar=row.toml_key.upper(),
            help=f"{row.help} [{row.unit}]",
        )
    return group


def parse_declared(
    flag_values: Mapping[str, str | None],
    toml_values: Mapping[str, object],
    toml_path: str | None,
) -> dict[str, Declared]:
    """Every declared input that was given, parsed, keyed by its tm.toml key; a flag beats the file.

    `flag_values` is keyed by argparse dest (`budget_tokens`, as `vars(args)` gives) or by flag spelling
    (`--budget-tokens`); other keys are ignored. `toml_values` is the whole tm.toml document: declared keys
    at top level or under [run]; other tables are left for other components. Raises DeclaredInputError.
    """
    file_label = toml_path or "tm.toml"
    from_file = _declared_part_of_toml(toml_values, file_label)

    declared: dict[str, Declared] = {}
    for row in DECLARED:
        flag_text = flag_values.get(row.toml_key, flag_values.get(row.flag))
        if flag_text is not None:
            declared[row.toml_key] = Declared(
                row.toml_key, _parse(row, flag_text, row.flag), row.unit, row.flag
            )
        elif row.toml_key in from_file:
            label = f"{file_label}:{row.toml_key}"
            value = _parse(row, from_file[row.toml_key], label)
            declared[row.toml_key] = Declared(row.toml_key, value, row.unit, f"tm.toml:{row.toml_key}")

    _check_together(declared)
    return declared


def load_tm_toml(path: str | Path) -> dict:
    """The parsed tm.toml at `path`; a missing file, bad encoding or TOML syntax error is one line."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise DeclaredInputError(f"{path}: cannot read it ({error.strerror or error})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DeclaredInputError(
            f"{path}: not UTF-8 text (byte {error.start}); TOML files are UTF-8"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise DeclaredInputError(_toml_syntax_message(path, text, error)) from None


def _declared_part_of_toml(document: Mapping[str, object], file_label: str) -> dict[str, object]:
    """Declared keys from the top level and [run]; refuses unknown keys there and a key given twice."""
    found: dict[str, object] = {}
    for key, value in document.items():
        if isinstance(value, Mapping):
            continue  # [alerts] and other tables belong to other components
        found[key] = value
    run_table = document.get(RUN_TABLE)
    if run_table is not None:
        if not isinstance(run_table, Mapping):
            raise DeclaredInputError(f"{file_label}: '{RUN_TABLE}' must be a table ([{RUN_TABLE}])")
        for key, value in run_table.items():
            if key in found:
                raise DeclaredInputError(
                    f"{file_label}: {key} is set both at the top level and under [{RUN_TABLE}]; keep one"
                )
            found[key] = value
    for key in money.TOML_KEYS:
        found.pop(key, None)  # a price is the views' (model/money.py), never a declared fact of the run
    for key in found:
        if key not in _BY_KEY:
            raise DeclaredInputError(f"{file_label}: unknown key {key!r}{_did_you_mean(key)}")
    return found


def _did_you_mean(key: str) -> str:
    guess = key.strip().lstrip("-").replace("-", "_").lower()
    if guess in _BY_KEY:
        return f" (did you mean {guess}?)"
    import difflib

    close = difflib.get_close_matches(guess, list(_BY_KEY), n=1)
    if close:
        return f" (did you mean {close[0]}?)"
    return f"; accepted keys: {', '.join(_BY_KEY)}"


def _parse(row: DeclaredInput, raw: object, label: str) -> int | float | str:
    """One value parsed by its row's kind; any refusal becomes a DeclaredInputError naming `label`."""
    try:
        if row.kind == "count":
            return parse_count(raw, label, accepted=row.accepted)
        if row.kind == "count_or_zero":
            return parse_count(raw, label, accepted=row.accepted, allow_zero=True)
        if row.kind == "positive_float":
            return parse_positive_float(raw, label, accepted=row.accepted)
        if row.kind == "fraction":
            return parse_fraction(raw, label, accepted=row.accepted)
    except QuantityError as error:
        raise DeclaredInputError(str(error)) from None
    if row.kind == "convention":
        return _parse_convention(raw, label, row.accepted)
    if row.kind == "text":
        return _parse_text(raw, label, row.accepted)
    raise AssertionError(f"no parser for kind {row.kind!r}")  # DECLARED names a kind this module lacks


def _parse_convention(raw: object, label: str, accepted: str) -> str:
    if not isinstance(raw, str):
        raise DeclaredInputError(f"{label}: {raw!r} is not a convention name; {accepted}")
    name = raw.strip().lower()
    if name in CONVENTIONS:
        return name
    if name == "counted":
        # `counted` is measured, not chosen: it is shown beside MFU whenever a step was counted.
        raise DeclaredInputError(
            f"{label}: 'counted' is shown beside MFU, never as its convention; {accepted}"
        )
    shown = raw if len(raw) <= 40 else raw[:37] + "..."
    raise DeclaredInputError(f"{label}: unknown convention {shown!r}; {accepted}")


def _parse_text(raw: object, label: str, accepted: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise DeclaredInputError(f"{label}: {raw!r} is not a text; {accepted}")
    text = raw.strip()
    if "\n" in text or "\r" in text:
        raise DeclaredInputError(f"{label}: the text spans several lines; {accepted}")
    if len(text) > _PEAK_SOURCE_MAX_CHARS:
        raise DeclaredInputError(f"{label}: the text is over {_PEAK_SOURCE_MAX_CHARS} characters; {accepted}")
    return text


def _check_together(declared: Mapping[str, Declared]) -> None:
    """Rules across inputs: a peak always carries its source, and E is part of N."""
    peak, source = declared.get("peak_tflops"), declared.get("peak_source")
    if peak is not None and source is None:
        raise DeclaredInputError(
            f"{peak.origin} needs --peak-source (or peak_source in tm.toml): say where the figure comes from, "
            "e.g. --peak-source 'H100 SXM datasheet, dense BF16'"
        )
    if source is not None and peak is None:
        raise DeclaredInputError(
            f"{source.origin} needs --peak-tflops (or peak_tflops in tm.toml): a source without a figure says nothing"
        )
    params, embedding = declared.get("params"), declared.get("embedding_params")
    if params is not None and embedding is not None and embedding.value > params.value:  # type: ignore[operator]
        raise DeclaredInputError(
            f"{embedding.origin} ({embedding.value}) exceeds {params.origin} ({params.value}): "
            "embedding parameters are part of the total"
        )


# tomllib ends each message with where it stopped: "(at line 3, column 5)" or "(at end of document)".
_TOML_WHERE_RE = re.compile(r"\s*\(at (?:line (\d+), column \d+|end of document)\)")


def _toml_syntax_message(path: Path, text: str, error: Exception) -> str:
    """One line: the file, the line number, what tomllib says is wrong there."""
    message = (str(error).splitlines() or ["invalid TOML"])[0]
    line = getattr(error, "lineno", None)  # Python 3.14's TOMLDecodeError carries it
    where = _TOML_WHERE_RE.search(message)
    if where is not None:
        if line is None:
            line = int(where.group(1)) if where.group(1) else text.count("\n") + 1
        message = message[: where.start()] + message[where.end() :]
    at = f"line {line}" if line is not None else "an unknown line"
    return f"{path}: TOML syntax error at {at}: {message.strip() or 'invalid TOML'}"
