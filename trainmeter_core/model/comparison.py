"""Runs side by side: what differs between them (command line, environment, declared values, model shape,
parallelism, hardware, versions) and their headline numbers with differences and ratios against the first run.

Pure: it takes each run's final snapshot and ``meta.json`` as the caller read them; no I/O, no clock. FLOPs are put
under one named convention for all runs and each MFU is against its own run's peak; it never compares numbers under
different conventions silently: where conventions, peaks or device counts differ, a note says so. A number a run
cannot give is absent with its reason, never a zero.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from trainmeter_core.model import badput, comparison_communication, formulas, money, records

#: The named conventions a comparison can put every run under, in the order one is picked when none is asked for.
CONVENTIONS = ("titan", "megatron", "hf", "all_params")
#: Facts that describe the model, compared by value whatever their provenance (a declared one is "declared").
SHAPE_FACTS = (
    "params",
    "embedding_params",
    "layers",
    "d_model",
    "seq_len",
    "moe_experts",
    "tokens_per_step",
    "flop_per_token",
    "counted_flop_per_token",
)
PARALLEL_FACTS = ("world_size", "dp")
#: Environment variables of tm's own that say where tm keeps runs, not how the training runs.
_TM_ONLY_ENV = frozenset({"TM_RUNS_DIR"})
_LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass
class RunSide:
    """One run as the comparison reads it: its directory's name, state, ``meta.json`` and final snapshot."""

    name: str
    meta: dict[str, Any]
    snapshot: records.Snapshot
    state: str = "finished"


def label(index: int) -> str:
    return _LABELS[index] if index < len(_LABELS) else f"R{index + 1}"


# ----------------------------------------------------------------------------------------------------------------------
# What differs


def parse_command(command: list[str]) -> tuple[list[str], dict[str, Any]]:
    """(positional arguments, options) of a command line. ``--k=v`` and ``--k v`` are option k with value v; an option
    followed by another option (or nothing) is a bare flag (True); an option given twice keeps its values in order.
    Both runs are read alike, so a flag that takes no value but precedes an argument reads the same in each."""
    positional: list[str] = []
    options: dict[str, Any] = {}

    def put(key: str, value: Any) -> None:
        if key in options:
            before = options[key]
            options[key] = [*(before if isinstance(before, list) else [before]), value]
        else:
            options[key] = value

    i = 0
    while i < len(command):
        token = command[i]
        if token.startswith("-") and len(token) > 1 and not _is_number(token):
            if "=" in token:
                key, value = token.split("=", 1)
                put(key, value)
            elif i + 1 < len(command) and (not command[i + 1].startswith("-") or _is_number(command[i + 1])):
                put(token, command[i + 1])
                i += 1
            else:
                put(token, True)
        else:
            positional.append(token)
        i += 1
    return positional, options


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-12) or (a != a and b != b)
    return a == b


def _all_same(values: list[Any]) -> bool:
    return all(_same(values[0], v) for v in values[1:])


def _difference(category: str, name: str, values: list[Any]) -> dict[str, Any] | None:
    return None if _all_same(values) else {"category": category, "name": name, "values": values}


def _keys_in_order(maps: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(key for m in maps for key in m))


def command_differences(runs: list[RunSide]) -> list[dict[str, Any]]:
    """Each option whose value differs (or that one run lacks: null), and each positional argument that differs."""
    parsed = [parse_command([str(t) for t in run.meta.get("command") or []]) for run in runs]
    out = []
    longest = max(len(positional) for positional, _ in parsed)
    for i in range(longest):
        values = [positional[i] if i < len(positional) else None for positional, _ in parsed]
        found = _difference("command line", f"argument {i + 1}", values)
        if found:
            out.append(found)
    for key in _keys_in_order([options for _, options in parsed]):
        found = _difference("command line", key, [options.get(key) for _, options in parsed])
        if found:
            out.append(found)
    return out


def _facts(run: RunSide) -> dict[str, records.Fact]:
    return {f.name: f for key, f in run.snapshot.facts.items() if "@" not in key}


def fact_differences(runs: list[RunSide]) -> list[dict[str, Any]]:
    """Declared values, then the model's shape and the parallelism: facts compared by value (a fact one run lacks is
    null there). A fact any run declared is listed as declared."""
    tables = [_facts(run) for run in runs]
    declared = [
        name
        for name in _keys_in_order(tables)
        if any(t.get(name) is not None and t[name].provenance == "declared" for t in tables)
    ]
    out = []
    for category, names in (
        ("declared", declared),
        ("model shape", [n for n in SHAPE_FACTS if n not in declared]),
        ("parallelism", [n for n in PARALLEL_FACTS if n not in declared]),
    ):
        for name in names:
            values = [t[name].value if name in t else None for t in tables]
            found = _difference(category, name, values)
            if found:
                out.append(found)
    return out


def rig_text(snapshot: records.Snapshot) -> str:
    """The run's devices in words: "8 × H100 SXM", "1 × CPU", or that no rank reported one."""
    gpus = Counter(
        str(f.value.get("display_name") or f.value.get("name") or "GPU")
        for f in snapshot.facts.values()
        if f.name == "gpu" and isinstance(f.value, dict)
    )
    if gpus:
        return ", ".join(f"{n} × {name}" for name, n in sorted(gpus.items()))
    devices = Counter(
        str(f.value.get("type") or "device").upper()
        for f in snapshot.facts.values()
        if f.name == "device" and isinstance(f.value, dict)
    )
    if devices:
        return ", ".join(f"{n} × {kind}" for kind, n in sorted(devices.items()))
    return "no device reported"


def peak_text(snapshot: records.Snapshot) -> str:
    """Each device's dense peak as the run's MFU used it, with its kind and source; or why there was none."""
    explain = snapshot.explain.get("mfu")
    inputs = explain.inputs if explain is not None else {}
    peaks = [
        f"{_si(i.value)}FLOP/s ({i.source})" if i.source else f"{_si(i.value)}FLOP/s"
        for name, i in inputs.items()
        if name.startswith("peak_flop_per_s") and isinstance(i.value, (int, float))
    ]
    # Without one, the MFU row says why (its reason names every missing input, the peak among them).
    return "; ".join(peaks) if peaks else "none"


def environment_differences(runs: list[RunSide]) -> list[dict[str, Any]]:
    envs = [{k: v for k, v in (run.meta.get("env") or {}).items() if k not in _TM_ONLY_ENV} for run in runs]
    out = []
    for key in _keys_in_order(envs):
        found = _difference("environment", key, [env.get(key) for env in envs])
        if found:
            out.append(found)
    return out


def hardware_differences(runs: list[RunSide]) -> list[dict[str, Any]]:
    rows = (
        ("host", [run.meta.get("host") for run in runs]),
        ("devices", [rig_text(run.snapshot) for run in runs]),
        ("dense peak", [peak_text(run.snapshot) for run in runs]),
    )
    return [found for name, values in rows if (found := _difference("hardware", name, values))]


def version_differences(runs: list[RunSide]) -> list[dict[str, Any]]:
    rows = [
        ("trainmeter", [run.meta.get("tm_version") for run in runs]),
        ("python", [run.meta.get("python") for run in runs]),
        ("platform", [run.meta.get("platform") for run in runs]),
    ]
    plugins = [
        {
            str(p.get("distribution") or p.get("name")): p.get("version")
            for p in run.meta.get("plugins") or []
            if isinstance(p, dict)
        }
        for run in runs
    ]
    rows += [(f"plugin {name}", [p.get(name) for p in plugins]) for name in _keys_in_order(plugins)]
    return [found for name, values in rows if (found := _difference("versions", name, values))]


def differences(runs: list[RunSide]) -> list[dict[str, Any]]:
    """Everything that differs between the runs' setups, in the order a reader asks: what was run, then with what."""
    return [
        *command_differences(runs),
        *environment_differences(runs),
        *fact_differences(runs),
        *hardware_differences(runs),
        *version_differences(runs),
    ]


# ----------------------------------------------------------------------------------------------------------------------
# The convention every run is put under


def own_convention(snapshot: records.Snapshot) -> str | None:
    """The convention the run's engine put its FLOPs under (``declared`` for a declared FLOPs per token), or None
    where it gave a range over the conventions (none was chosen)."""
    metric = snapshot.metrics.get("flop_per_token")
    return metric.convention if metric is not None and metric.value is not None else None


def flop_per_token(snapshot: records.Snapshot, convention: str) -> tuple[float | None, str | None]:
    """(FLOPs per token under ``convention``, None) or (None, why not)."""
    metric = snapshot.metrics.get(f"flop_per_token.{convention}")
    if metric is not None and metric.value is not None:
        return metric.value, None
    overall = snapshot.metrics.get("flop_per_token")
    if overall is not None and overall.value is not None and overall.convention == convention:
        return overall.value, None  # declared with --flops-per-token under that convention
    reason = (
        metric.absent if metric is not None and metric.absent else f"no FLOPs per token under {convention}"
    )
    return None, reason


def choose_convention(runs: list[RunSide], asked: str | None = None) -> dict[str, Any]:
    """The one convention FLOPs and MFU are compared under: the one asked for, else the one every run declared, else
    the first every run can be counted under. ``{"name": None, "why": ...}`` when there is none."""
    if asked:
        return {"name": asked, "why": "chosen with --convention"}
    own = [own_convention(run.snapshot) for run in runs]
    if own[0] is not None and _all_same(own):
        why = "every run's FLOPs are under it"
        if own[0] == "declared":
            why += " (each run's own declared FLOPs per token)"
        return {"name": own[0], "why": why}
    said = ", ".join(f"{label(i)} {c or 'a range'}" for i, c in enumerate(own))
    counted = {c: [flop_per_token(run.snapshot, c)[0] is not None for run in runs] for c in CONVENTIONS}
    # max keeps the first of equals: the most-covering convention, the earliest in CONVENTIONS among them.
    best = max(CONVENTIONS, key=lambda c: sum(counted[c]))
    if not any(counted[best]):
        why = f"no run can be counted under a named convention (the runs' own: {said})"
        return {"name": None, "why": why}
    if all(counted[best]):
        return {
            "name": best,
            "why": f"the runs' FLOPs are under no common convention ({said}): {best}, the first every run can be "
            "counted under",
        }
    without = ", ".join(label(i) for i, ok in enumerate(counted[best]) if not ok)
    return {
        "name": best,
        "why": f"the runs' FLOPs are under no common convention ({said}) and no convention covers every run: "
        f"{best} covers the most; {without} cannot be counted under it",
    }


# ----------------------------------------------------------------------------------------------------------------------
# The headline numbers


def _input(snapshot: records.Snapshot, metric: str, name: str) -> float | None:
    explain = snapshot.explain.get(metric)
    found = explain.inputs.get(name) if explain is not None else None
    value = found.value if found is not None else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _metric(snapshot: records.Snapshot, key: str) -> tuple[float | None, str | None]:
    metric = snapshot.metrics.get(key)
    if metric is None:
        return None, "not computed by this run's engine"
    if metric.value is not None:
        return metric.value, None
    return None, metric.absent or "a range, not one number"


def mfu_under(
    snapshot: records.Snapshot, key: str, convention: str | None
) -> tuple[float | None, str | None]:
    """The run's MFU (``mfu`` or ``mfu_avg``) under ``convention``, against the run's own peak."""
    if convention is None:
        return None, "no convention every run can be counted under"
    metric = snapshot.metrics.get(key)
    if metric is not None and metric.value is not None and metric.convention == convention:
        return metric.value, None
    fpt, why = flop_per_token(snapshot, convention)
    if fpt is None:
        return None, why
    peak = _input(snapshot, key, "peak_total_flop_per_s")
    if key == "mfu_avg":
        tokens, window_s = _input(snapshot, key, "window_tokens"), _input(snapshot, key, "window_s")
        if peak is not None and tokens is not None and window_s:
            return formulas.mfu_window_average(fpt, tokens, window_s, peak), None
    else:
        tokens_per_s = _input(snapshot, key, "tokens_per_s")
        if peak is not None and tokens_per_s is not None:
            return formulas.mfu(fpt, tokens_per_s, peak), None
    absent = metric.absent if metric is not None and metric.absent else None
    return None, absent or "the run's MFU inputs are not in its snapshot"


def _loss(snapshot: records.Snapshot, name: str) -> tuple[float | None, str | None]:
    point = snapshot.series.get(name)
    if point is None:
        return None, f"the loop reported no {name}"
    return point.value, None


#: (key, title, unit, how a value is read from a run's snapshot given the convention)
HEADLINE = (
    ("train_loss", "final train loss", None, lambda s, c: _loss(s, "train_loss")),
    ("val_loss", "final val loss", None, lambda s, c: _loss(s, "val_loss")),
    ("steps", "steps", "steps", lambda s, c: (float(s.steps), None)),
    ("tokens", "tokens", "tokens", lambda s, c: _metric(s, "tokens")),
    ("elapsed_s", "elapsed", "s", lambda s, c: (s.elapsed_s, None if s.elapsed_s is not None else "no tick")),
    ("tokens_per_s", "tokens/s (EMA)", "tokens/s", lambda s, c: _metric(s, "tokens_per_s")),
    ("step_time_s", "step time (EMA)", "s", lambda s, c: _metric(s, "step_time_s")),
    ("flop_per_token", "FLOPs per token", "FLOP/token", lambda s, c: _fpt(s, c)),
    ("spent_flop", "FLOPs spent", "FLOP", lambda s, c: _spent(s, c)),
    ("mfu_avg", "MFU, training-window average", None, lambda s, c: mfu_under(s, "mfu_avg", c)),
    ("mfu", "MFU, latest EMA", None, lambda s, c: mfu_under(s, "mfu", c)),
    ("ofu", "OFU (counters)", None, lambda s, c: _metric(s, "ofu")),
    ("goodput", "goodput", None, lambda s, c: _metric(s, "goodput")),
    ("gpu_hours", "GPU-hours", "h", lambda s, c: _metric(s, "gpu_hours")),
    ("energy_j", "energy", "J", lambda s, c: _metric(s, "energy_j")),
)
#: Rows whose numbers are under the comparison's convention.
UNDER_CONVENTION = frozenset({"flop_per_token", "spent_flop", "mfu_avg", "mfu"})


def _fpt(snapshot: records.Snapshot, convention: str | None) -> tuple[float | None, str | None]:
    if convention is None:
        return None, "no convention every run can be counted under"
    return flop_per_token(snapshot, convention)


def _spent(snapshot: records.Snapshot, convention: str | None) -> tuple[float | None, str | None]:
    fpt, why = _fpt(snapshot, convention)
    tokens, no_tokens = _metric(snapshot, "tokens")
    if fpt is None or tokens is None:
        return None, why or no_tokens
    return fpt * tokens, None  # FLOPs spent = FLOPs per token × tokens seen, as the engine defines it


def _finite(value: float | None, why: str | None) -> tuple[float | None, str | None]:
    if value is not None and not math.isfinite(value):
        return None, f"the run's last value was {value} (not a number JSON can carry, nor one to subtract)"
    return value, why


def headline(runs: list[RunSide], convention: str | None) -> list[dict[str, Any]]:
    """One row per headline number: each run's value (or its reason), and the difference and ratio of each run
    against the first (null for the first, and where either value is absent or the first is zero)."""
    rows = []
    communication_rows = (
        *comparison_communication.rows(),
        *comparison_communication.bandwidth_rows([run.snapshot for run in runs]),
    )
    seldom = {"val_loss", "ofu", "energy_j", *(key for key, _, _, _ in communication_rows)}
    for key, title, unit, read in (*HEADLINE, *communication_rows, *badput.ROWS):
        found = [_finite(*read(run.snapshot, convention)) for run in runs]
        values = [v for v, _ in found]
        if all(v is None for v in values) and key in seldom:
            continue  # a number none of the runs has and few runs ever have: no row of n/a
        if badput.no_time_anywhere(key, values):
            continue
        base = values[0]
        row: dict[str, Any] = {
            "key": key,
            "title": title,
            "unit": unit,
            "values": values,
            "absent": [why if v is None else None for v, why in found],
            "difference": [None]
            + [v - base if v is not None and base is not None else None for v in values[1:]],
            "ratio": [None] + [v / base if v is not None and base else None for v in values[1:]],
        }
        if key in UNDER_CONVENTION and convention is not None:
            row["convention"] = convention
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------------------------------
# The whole comparison


def notes(runs: list[RunSide], convention: dict[str, Any]) -> list[str]:
    """What a reader must know before trusting a difference: conventions, peaks and device counts that differ, and
    runs that are not finished."""
    out = []
    own = [own_convention(run.snapshot) for run in runs]
    if not _all_same(own) or convention["name"] not in (None, own[0]):
        out.append(f"FLOPs and MFU are under {convention['name'] or 'no convention'}: {convention['why']}")
    elif convention["name"] is None:
        out.append(f"FLOPs and MFU are not compared: {convention['why']}")
    peaks = [peak_text(run.snapshot) for run in runs]
    if not _all_same(peaks):
        each = "; ".join(f"{label(i)} {p}" for i, p in enumerate(peaks))
        out.append(f"each MFU is against its own run's peak, and the peaks differ: {each}")
    rigs = [rig_text(run.snapshot) for run in runs]
    if not _all_same(rigs):
        out.append(
            "the runs ran on different devices: " + "; ".join(f"{label(i)} {r}" for i, r in enumerate(rigs))
        )
    straggler = comparison_communication.straggler_note(
        [label(i) for i in range(len(runs))], [r.snapshot for r in runs]
    )
    if straggler is not None:
        out.append(straggler)
    for i, run in enumerate(runs):
        if run.state == "running":
            out.append(f"{label(i)} is still running: its numbers are those of now")
        elif run.state == "lost":
            out.append(f"{label(i)} was lost (it never ended): its numbers are those of its last record")
    return out


def compare(
    runs: list[RunSide], convention: str | None = None, price: money.Price | None = None
) -> dict[str, Any]:
    """The comparison ``tm compare --json`` prints (docs/api.md): runs, differences first, the convention, the
    headline numbers against the first run (with a price, money's rows after them: ``model/money.py``), and notes."""
    if len(runs) < 2:
        raise ValueError("a comparison needs at least two runs")
    chosen = choose_convention(runs, convention)
    money_rows = money.comparison_rows([run.snapshot for run in runs], price)
    money_note = [money.words(money.overlay(runs[0].snapshot, price)) if price is None else price.words()]
    return {
        "runs": [
            {
                "label": label(i),
                "name": run.name,
                "run_name": run.meta.get("name"),
                "state": run.state,
                "start_wall": run.meta.get("start_wall"),
                "devices": rig_text(run.snapshot),
                "convention": own_convention(run.snapshot),
            }
            for i, run in enumerate(runs)
        ],
        "baseline": label(0),
        "differences": differences(runs),
        "convention": chosen,
        "headline": headline(runs, chosen["name"]) + money_rows,
        "notes": notes(runs, chosen) + money_note,
    }


def _si(value: float) -> str:
    for scale, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}"
    return f"{value:.3g} "
