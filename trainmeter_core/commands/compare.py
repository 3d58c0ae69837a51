"""``tm compare A B [C ...]``: runs side by side. What differs between them comes first, then their headline numbers
with differences and ratios against the first run, FLOPs and MFU under one named convention; ``--json`` for scripts.
With the dashboard installed, ``-o FILE`` writes the comparison with the runs' curves overlaid as one HTML file, and
``tm view A B`` serves it.

It only reads the run directories. Bad input (fewer than two runs, a run that is not there, the same run twice, a log
with nothing usable) is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from trainmeter_core.commands.plugin_commands import plugin_command
from trainmeter_core.commands.price_options import add_price_arguments, price_from
from trainmeter_core.commands.stdout_lines import Output
from trainmeter_core.commands.usage import parser_for
from trainmeter_core.errors import UsageError

DESCRIPTION = (
    "Runs side by side: what differs between them, then their headline numbers with differences and ratios "
    "(FLOPs and MFU under one named convention, each MFU against its own run's peak)."
)
_FRACTIONS = frozenset({"mfu", "mfu_avg", "ofu", "goodput"})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "runs", nargs="*", metavar="RUN", help="two runs or more: directories, names or unique prefixes"
    )
    p.add_argument("--json", action="store_true", help="print the comparison as JSON (docs/api.md)")
    p.add_argument(
        "--convention",
        choices=("titan", "megatron", "hf", "all_params"),
        help="the FLOPs convention for every run (default: the one every run's FLOPs are under, else the one most "
        "runs can be counted under)",
    )
    p.add_argument("--runs-dir", help="where runs are (default: TM_RUNS_DIR, else ./.trainmeter/runs)")
    add_price_arguments(p)


def resolve_runs(refs: list[str], runs_dir: str | None) -> list[Path]:
    """The run directories, or a UsageError naming what is wrong with the references."""
    from trainmeter_core.runlog import rundir

    if len(refs) < 2:
        given = "no run" if not refs else f"one run ({refs[0]})"
        raise UsageError(
            f"tm compare needs two runs or more, got {given}: tm compare A B [C ...] (tm runs lists them)"
        )
    base = rundir.runs_dir(runs_dir) if runs_dir else None
    paths: list[Path] = []
    for ref in refs:
        try:
            path = rundir.resolve_run(ref, base)
        except rundir.RunDirError as exc:
            raise UsageError(str(exc)) from None
        if path.resolve() in [p.resolve() for p in paths]:
            raise UsageError(f"{ref!r} is {path.name}, already in the comparison: give two different runs")
        paths.append(path)
    return paths


def run_state(run_dir: Path) -> str:
    """finished, running or lost, as ``tm runs`` says it (without the exit status)."""
    from trainmeter_core.runlog import rundir

    return rundir.run_info(run_dir).state.split(" ")[0]


def unusable(run_dir: Path, stats: dict) -> UsageError:
    """The one line for a run whose log gives the engine nothing (a corrupt or empty log)."""
    reasons = ", ".join(f"{n} {r}" for r, n in sorted((stats.get("reasons") or {}).items()))
    lines = f": {stats['skipped']} unreadable lines ({reasons})" if stats.get("skipped") else ""
    return UsageError(f"{run_dir.name}'s log has no record the engine can use{lines}: it cannot be compared")


def sides(paths: list[Path]) -> list:
    """Each run's final snapshot (replayed from its checkpoint and log) with its meta.json and state."""
    from trainmeter_core.model.comparison import RunSide
    from trainmeter_core.runlog import replay, rundir

    out = []
    for path in paths:
        stats: dict = {}
        snapshot = replay.final_snapshot(path, stats)
        if snapshot is None:
            raise unusable(path, stats)
        if stats.get("skipped"):
            print(f"tm: skipped {stats['skipped']} unreadable lines of {path.name}'s log", file=sys.stderr)
        out.append(RunSide(path.name, rundir.read_json(path / "meta.json") or {}, snapshot, run_state(path)))
    return out


def cmd_compare(argv: list[str]) -> int:
    command = plugin_command("compare")
    parser = parser_for("compare", DESCRIPTION)
    add_arguments(parser)
    if command is not None:
        command.add_arguments(parser)  # the dashboard's -o FILE
    args = parser.parse_args(argv)
    price = price_from(args)
    paths = resolve_runs(args.runs, args.runs_dir)
    if getattr(args, "output", None):
        return int(command.run(args) or 0)  # type: ignore[union-attr]
    from trainmeter_core.model.comparison import compare

    comparison = compare(sides(paths), args.convention, price)
    out = Output()
    if args.json:
        out.line(json.dumps(comparison, allow_nan=False, default=_no_nan))
    else:
        for line in text_lines(comparison):
            out.line(line)
    return 0


def _no_nan(value: Any) -> Any:
    raise TypeError(f"not JSON: {value!r}")


# ----------------------------------------------------------------------------------------------------------------------
# Text


_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_SI_UNITS = {
    "tokens": "",
    "steps": "",
    "tokens/s": " tok/s",
    "FLOP": " FLOP",
    "FLOP/token": " FLOP",
    "J": " J",
    "B/s": " B/s",
}


def si_text(value: float, suffix: str = "") -> str:
    """Three significant digits with an SI prefix: 4.93M, 855M FLOP, 1M (never 1e+03k: rounded first)."""
    rounded = float(f"{value:.3g}")
    for scale, prefix in _PREFIXES:
        if abs(rounded) >= scale:
            return f"{rounded / scale:g}{prefix}{suffix}"
    return f"{rounded:g}{suffix}"


def duration_text(seconds: float) -> str:
    """As the dashboard says a duration: 42.2 ms, 26.9 s, 12m 05s, 3h 20m, 7d 0h."""
    if abs(seconds) < 1:
        return f"{float(f'{seconds * 1000:.3g}'):g} ms"
    if abs(seconds) < 60:
        return f"{float(f'{seconds:.3g}'):g} s"
    total = round(abs(seconds))
    days, hours, minutes, secs = total // 86400, total % 86400 // 3600, total % 3600 // 60, total % 60
    text = f"{days}d {hours}h" if days else f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"
    return ("-" if seconds < 0 else "") + text


def number_text(value: float | None, unit: str | None, key: str = "") -> str:
    """A number as a table shows it: three significant digits, in its unit; a fraction in percent."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if key in _FRACTIONS:
        return f"{float(f'{value * 100:.3g}'):g}%"
    if unit == "s":
        return duration_text(value)
    if unit in _SI_UNITS:
        if unit in ("steps", "tokens") and float(value).is_integer() and abs(value) < 1e4:
            return f"{int(value):,}"
        return si_text(value, _SI_UNITS[unit])
    return f"{float(f'{value:.4g}'):g}" + (f" {unit}" if unit else "")


def difference_text(value: float | None, unit: str | None, key: str) -> str:
    if value is None:
        return ""
    if key in _FRACTIONS:
        return f"{float(f'{value * 100:.3g}'):+g} pp"  # percentage points: a difference of two percentages
    text = number_text(abs(value), unit, key)
    return ("-" if value < 0 else "+") + text


def _value_text(value: Any, width: int = 48) -> str:
    """A differing value for a terminal: whole when short, else cut with "…" (``--json`` gives it whole)."""
    if value is None:
        return "(not given)"
    if value is True:
        return "(given)"
    text = " ".join(_value_text(v, width) for v in value) if isinstance(value, list) else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def text_lines(comparison: dict[str, Any]) -> list[str]:
    """The comparison for a terminal: the runs, what differs, the headline numbers, the notes."""
    runs = comparison["runs"]
    labels = [r["label"] for r in runs]
    base = comparison["baseline"]
    lines = _table([[r["label"], r["name"], r["state"], r["devices"]] for r in runs], indent="")
    lines.append("")
    diffs = comparison["differences"]
    if diffs:
        lines.append("What differs")
        lines += _table([[d["category"], d["name"], *map(_value_text, d["values"])] for d in diffs])
    else:
        lines.append(
            "What differs: nothing in the command lines, declared values, model shape, hardware or versions"
        )
    lines.append("")
    convention = comparison["convention"]
    under = (
        f"FLOPs and MFU under {convention['name']}" if convention["name"] else "FLOPs and MFU not compared"
    )
    lines.append(f"Headline numbers against {base} ({under})")
    header = ["", *labels]
    for label in labels[1:]:
        header += [f"{label} − {base}", f"{label} / {base}"]
    rows = [header]
    for row in comparison["headline"]:
        cells = [row["title"]]
        cells += [number_text(v, row["unit"], row["key"]) for v in row["values"]]
        for i in range(1, len(labels)):
            ratio = row["ratio"][i]
            cells += [
                difference_text(row["difference"][i], row["unit"], row["key"]),
                f"×{si_text(ratio)}" if ratio else "",
            ]
        rows.append(cells)
    lines += _table(rows)
    # Each reason once, with the runs and rows it holds for: two CPU runs without a peak share one line.
    absent: dict[str, tuple[dict, dict]] = {}
    for row in comparison["headline"]:
        for i, why in enumerate(row["absent"]):
            if why:
                titles, runs_of = absent.setdefault(why, ({}, {}))
                titles[row["title"]] = runs_of[labels[i]] = True
    notes = comparison["notes"] + [
        f"{'; '.join(titles)} ({', '.join(runs_of)}): n/a, {why}" for why, (titles, runs_of) in absent.items()
    ]
    if notes:
        lines.append("")
        lines.append("Notes")
        lines += [f"  - {n}" for n in notes]
    return lines
