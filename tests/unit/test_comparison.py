"""The comparison of runs (``trainmeter_core.model.comparison``): what differs, the one convention, each MFU against
its own peak, the headline numbers with differences and ratios, the notes. Snapshots are built by hand here; the
command and the dashboard's page are in test_compare.py and test_compare_browser.py."""

from __future__ import annotations

import pytest

from trainmeter_core.model import records
from trainmeter_core.model.comparison import (
    RunSide,
    choose_convention,
    command_differences,
    compare,
    differences,
    mfu_under,
    parse_command,
)

EI = records.ExplainInput


def fact(name: str, value, provenance: str = "detected", **kw) -> records.Fact:
    return records.Fact(name=name, value=value, provenance=provenance, origin=f"test:{name}", **kw)


def side(
    command=("train.py",),
    facts=(),
    metrics=None,
    explain=None,
    meta=None,
    name="run",
    state="finished",
    **snap,
) -> RunSide:
    table = {}
    for f in facts:
        key = (
            f"{f.name}@{f.device}"
            if f.device
            else f"{f.name}@rank{f.rank or 0}"
            if f.name == "device"
            else f.name
        )
        table[key] = f
    snapshot = records.Snapshot(tick=1, facts=table, metrics=metrics or {}, explain=explain or {}, **snap)
    return RunSide(name, {"command": list(command), **(meta or {})}, snapshot, state)


# ----------------------------------------------------------------------------------------------------------------------
# What differs


def test_a_command_line_is_read_as_arguments_and_options_with_their_values():
    positional, options = parse_command(
        [
            "train.py",
            "--lr",
            "1e-3",
            "--batch=8",
            "--compile",
            "--tag",
            "a",
            "--tag",
            "b",
            "-n",
            "-5",
            "data.bin",
        ]
    )
    assert positional == ["train.py", "data.bin"]
    # --compile is followed by another option: a bare flag; -5 is a number, so it is -n's value; a repeated option
    # keeps its values in order.
    assert options == {"--lr": "1e-3", "--batch": "8", "--compile": True, "--tag": ["a", "b"], "-n": "-5"}


def test_the_same_flag_given_two_ways_differs_only_by_its_value():
    runs = [
        side(["train.py", "--lr", "1e-3", "--steps", "40"]),
        side(["train.py", "--steps=40", "--lr=3e-3"]),
    ]
    assert command_differences(runs) == [
        {"category": "command line", "name": "--lr", "values": ["1e-3", "3e-3"]}
    ]


def test_a_flag_one_run_lacks_and_an_argument_that_changed_are_differences():
    runs = [side(["a.py", "--fast"]), side(["b.py"]), side(["a.py", "--fast"])]
    assert command_differences(runs) == [
        {"category": "command line", "name": "argument 1", "values": ["a.py", "b.py", "a.py"]},
        {"category": "command line", "name": "--fast", "values": [True, None, True]},
    ]


def test_declared_values_and_the_models_shape_are_compared_by_value_whatever_their_provenance():
    a = side(facts=[fact("budget_tokens", 1e9, "declared"), fact("params", 1000), fact("layers", 2)])
    # B declares the same parameter count it would have detected, and has a deeper model.
    b = side(
        facts=[fact("budget_tokens", 2e9, "declared"), fact("params", 1000, "declared"), fact("layers", 4)]
    )
    assert differences([a, b]) == [
        {"category": "declared", "name": "budget_tokens", "values": [1e9, 2e9]},
        {"category": "model shape", "name": "layers", "values": [2, 4]},
    ]


def test_hardware_and_versions_that_differ_are_listed_after_the_setup():
    gpu = {"index": 0, "display_name": "H100 SXM"}
    a = side(
        facts=[fact("gpu", gpu, device="n/gpu0")],
        meta={"host": "n1", "tm_version": "0.1.0", "python": "3.11"},
    )
    b = side(
        facts=[fact("gpu", gpu, device="n/gpu0"), fact("gpu", {**gpu, "index": 1}, device="n/gpu1")],
        meta={"host": "n2", "tm_version": "0.1.0", "python": "3.12", "env": {"CUDA_VISIBLE_DEVICES": "0,1"}},
    )
    assert differences([a, b]) == [
        {"category": "environment", "name": "CUDA_VISIBLE_DEVICES", "values": [None, "0,1"]},
        {"category": "hardware", "name": "host", "values": ["n1", "n2"]},
        {"category": "hardware", "name": "devices", "values": ["1 × H100 SXM", "2 × H100 SXM"]},
        {"category": "versions", "name": "python", "values": ["3.11", "3.12"]},
    ]


def test_where_tm_kept_the_runs_is_no_difference():
    a = side(meta={"env": {"TM_RUNS_DIR": "/a"}})
    b = side(meta={"env": {"TM_RUNS_DIR": "/b"}})
    assert differences([a, b]) == []


# ----------------------------------------------------------------------------------------------------------------------
# One convention, each run's own peak


def fpt(**values) -> dict[str, records.MetricValue]:
    return {f"flop_per_token.{c}": records.MetricValue(value=v, unit="FLOP/token") for c, v in values.items()}


def own(convention: str, value: float) -> dict[str, records.MetricValue]:
    """The FLOPs per token the run's engine settled on, under its convention."""
    return {"flop_per_token": records.MetricValue(value=value, unit="FLOP/token", convention=convention)}


def test_the_convention_is_the_one_asked_for_else_the_one_every_runs_flops_are_under_else_the_first_all_can_use():
    both = [side(metrics={**own("titan", 6.0), **fpt(titan=6.0, hf=5.0)}) for _ in range(2)]
    assert choose_convention(both, "hf") == {"name": "hf", "why": "chosen with --convention"}
    assert choose_convention(both) == {"name": "titan", "why": "every run's FLOPs are under it"}
    declared = [side(metrics=own("declared", 6.0)), side(metrics=own("declared", 7.0))]
    assert choose_convention(declared)["why"] == (
        "every run's FLOPs are under it (each run's own declared FLOPs per token)"
    )
    # A's FLOPs are under titan, B's a range (no convention chosen); B has no titan figure (no sequence length), only
    # megatron and hf: megatron is the first of titan, megatron, hf, all_params that both can be counted under.
    mixed = [
        side(metrics={**own("titan", 6.0), **fpt(titan=6.0, megatron=5.5)}),
        side(metrics=fpt(megatron=5.5, hf=5.0)),
    ]
    chosen = choose_convention(mixed)
    assert chosen["name"] == "megatron" and "(A titan, B a range)" in chosen["why"]
    # No convention covers both: titan covers A alone and hf B alone; titan comes first.
    apart = choose_convention([side(metrics=fpt(titan=6.0)), side(metrics=fpt(hf=5.0))])
    assert apart["name"] == "titan" and apart["why"].endswith(
        "titan covers the most; B cannot be counted under it"
    )
    assert choose_convention([side(), side()])["name"] is None


def test_mfu_is_put_under_the_comparisons_convention_against_the_runs_own_peak():
    explain = {
        "mfu_avg": records.Explain(
            formula="...",
            inputs={
                "window_tokens": EI(value=1e6),
                "window_s": EI(value=10.0),
                "peak_total_flop_per_s": EI(value=1e15),
            },
        ),
        "mfu": records.Explain(
            formula="...", inputs={"tokens_per_s": EI(value=2e5), "peak_total_flop_per_s": EI(value=1e15)}
        ),
    }
    metrics = {
        **fpt(titan=6e8, megatron=5e8),
        "mfu_avg": records.MetricValue(value=0.06, convention="titan"),
        "mfu": records.MetricValue(value=0.12, convention="titan"),
    }
    run = side(metrics=metrics, explain=explain)
    assert mfu_under(run.snapshot, "mfu_avg", "titan") == (0.06, None)  # the run's own number, as it is
    # 5e8 FLOP/token × 1e6 tokens / (1e15 FLOP/s × 10 s) = 5e14 / 1e16 = 0.05
    assert mfu_under(run.snapshot, "mfu_avg", "megatron") == (pytest.approx(0.05), None)
    # 5e8 FLOP/token × 2e5 tokens/s / 1e15 FLOP/s = 1e14 / 1e15 = 0.1
    assert mfu_under(run.snapshot, "mfu", "megatron") == (pytest.approx(0.1), None)
    no_peak = side(
        metrics={**fpt(titan=6e8), "mfu_avg": records.MetricValue(absent="no peak for a cpu device")}
    )
    assert mfu_under(no_peak.snapshot, "mfu_avg", "titan") == (None, "no peak for a cpu device")
    assert mfu_under(run.snapshot, "mfu_avg", "hf") == (None, "no FLOPs per token under hf")


def test_the_headline_gives_each_runs_number_and_its_difference_and_ratio_against_the_first():
    a = side(metrics={"tokens": records.MetricValue(value=1000.0, unit="tokens"), **fpt(titan=6.0)}, steps=10)
    b = side(metrics={"tokens": records.MetricValue(value=1500.0, unit="tokens"), **fpt(titan=6.0)}, steps=15)
    c = side(metrics={"tokens": records.MetricValue(absent="tokens per step unknown")}, steps=0)
    rows = {row["key"]: row for row in compare([a, b, c])["headline"]}
    assert rows["tokens"]["values"] == [1000.0, 1500.0, None]
    assert rows["tokens"]["difference"] == [None, 500.0, None]  # 1500 − 1000
    assert rows["tokens"]["ratio"] == [None, 1.5, None]  # 1500 / 1000
    assert rows["tokens"]["absent"] == [None, None, "tokens per step unknown"]
    # FLOPs spent = FLOPs per token × tokens, under titan: 6 × 1000 = 6000 and 6 × 1500 = 9000
    assert (
        rows["spent_flop"]["values"] == [6000.0, 9000.0, None] and rows["spent_flop"]["convention"] == "titan"
    )
    assert rows["steps"]["ratio"] == [None, 1.5, 0.0]
    assert rows["train_loss"]["absent"] == ["the loop reported no train_loss"] * 3
    assert "val_loss" not in rows  # no run had one: no row of n/a


def test_a_loss_that_ended_as_nan_is_absent_with_its_reason_not_a_number_json_cannot_carry():
    nan = records.SeriesPoint(canonical="train_loss", raw_key="loss", value=float("nan"))
    rows = {r["key"]: r for r in compare([side(series={"train_loss": nan}), side()])["headline"]}
    assert rows["train_loss"]["values"] == [None, None]
    assert rows["train_loss"]["absent"][0].startswith("the run's last value was nan")


def test_notes_say_where_conventions_peaks_and_devices_differ_and_which_run_is_not_finished():
    peak = records.Explain(
        formula="...", inputs={"peak_flop_per_s_per_device": EI(value=989e12, source="H100, datasheet")}
    )
    measured = records.Explain(
        formula="...", inputs={"peak_flop_per_s_per_device": EI(value=799e12, source="H200, measured")}
    )
    a = side(metrics={**own("titan", 6.0), **fpt(titan=6.0)}, explain={"mfu": peak})
    b = side(metrics=fpt(titan=6.0), explain={"mfu": measured}, state="running")
    notes = compare([a, b])["notes"]
    assert notes[0].startswith(
        "FLOPs and MFU are under titan: the runs' FLOPs are under no common convention (A titan, B a range)"
    )
    assert notes[1] == (
        "each MFU is against its own run's peak, and the peaks differ: "
        "A 989 TFLOP/s (H100, datasheet); B 799 TFLOP/s (H200, measured)"
    )
    assert notes[2] == "B is still running: its numbers are those of now"


def test_a_comparison_needs_two_runs():
    with pytest.raises(ValueError, match="at least two runs"):
        compare([side()])
