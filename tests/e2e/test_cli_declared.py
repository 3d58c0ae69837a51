"""What only the user knows: bad values are one line naming the flag, exit 2; good ones become declared facts."""

from __future__ import annotations

import json
import sys

import pytest
from tm_runs import log_records, only_run, run_tm

BAD = [
    (["--budget-tokens", "1e400"], "--budget-tokens"),
    (["--budget-tokens", "nan"], "--budget-tokens"),
    (["--budget-tokens", "-5"], "--budget-tokens"),
    (["--budget-tokens", "5e-3"], "--budget-tokens"),
    (["--layers", "2.5"], "--layers"),
    (["--convention", "chinchilla"], "--convention"),
    (["--plan-mfu", "3"], "--plan-mfu"),
    (["--peak-tflops", "100"], "--peak-source"),
]


@pytest.mark.parametrize(("args", "flag"), BAD)
def test_a_bad_declared_value_is_one_line_naming_the_flag_and_exit_2(tm_env, tmp_path, args, flag):
    result = run_tm([*args, "--", sys.executable, "-c", "raise SystemExit('must not run')"], tm_env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()  # nothing started


def test_declared_values_become_facts_and_a_flag_beats_tm_toml(tm_env, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    (tmp_path / "tm.toml").write_text('budget_tokens = "1B"\nlayers = 12\n[alerts.hung]\nfloor_s = 60\n')
    result = run_tm(
        ["--budget-tokens", "20B", "--peak-tflops", "1.5", "--peak-source", "vendor sheet", str(script)],
        tm_env,
    )
    assert result.returncode == 0, result.stderr
    facts = {r["name"]: r for r in log_records(only_run(tmp_path / "runs")) if r["kind"] == "fact"}
    assert (
        facts["budget_tokens"]["value"] == 20_000_000_000
        and facts["budget_tokens"]["origin"] == "--budget-tokens"
    )
    assert facts["layers"]["value"] == 12 and facts["layers"]["origin"] == "tm.toml:layers"
    assert facts["peak"]["value"] == {
        "flop_per_s": 1.5e12,
        "label": "declared",
        "source": "vendor sheet",
        "device_type": None,
    }
    assert all(f["provenance"] == "declared" for f in facts.values())


def test_tm_peak_measures_stores_and_a_run_records_it_as_a_measured_fact(tm_env, tmp_path):
    env = dict(tm_env, TM_PEAKS_FILE=str(tmp_path / "peaks.json"))
    result = run_tm(["peak", "--device", "cpu", "--threads", "1", "--size", "128", "--seconds", "0.2"], env)
    assert result.returncode == 0, result.stderr
    (entry,) = json.loads((tmp_path / "peaks.json").read_text())
    assert entry["device_type"] == "cpu" and entry["flop_per_s"] > 0 and entry["threads"] == 1
    assert run_tm(["--", sys.executable, "-c", "pass"], env).returncode == 0
    (peak,) = [
        r for r in log_records(only_run(tmp_path / "runs")) if r["kind"] == "fact" and r["name"] == "peak"
    ]
    assert peak["value"]["label"] == "measured" and peak["value"]["flop_per_s"] == entry["flop_per_s"]


def test_tm_peak_refuses_to_run_inside_a_run(tm_env, tmp_path):
    env = dict(tm_env, TM_PEAKS_FILE=str(tmp_path / "peaks.json"))
    result = run_tm(["--", "tm", "peak", "--seconds", "0.1"], env)
    assert result.returncode == 2
    assert "outside a run" in result.stderr
    assert not (tmp_path / "peaks.json").exists()
