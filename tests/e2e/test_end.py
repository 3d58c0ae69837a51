"""The summary line at the end of a run: ranges read as ranges (same precision, an en dash, one value when the
conventions agree), and its "see it again" command works exactly as printed, wherever the runs went.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from deadline import wait_for
from tm_runs import BIN, TM, run_tm

from trainmeter_core.model import records
from trainmeter_core.run.summary import format_range, summary_line, tm_command, view_command

SUMMARY = {
    "exit_status": 0,
    "elapsed_s": 12.34,
    "steps": 40,
    "skipped_steps": 0,
    "bus": {"dropped_total": 0},
}


def snapshot_with(**metrics: records.MetricValue) -> records.Snapshot:
    return records.Snapshot(tick=1, final=True, steps=40, metrics=metrics)


def test_both_ends_of_a_range_have_the_same_precision():
    # 3 significant digits of the larger end (6.0123 -> 2 decimals), so 5 shows as 5.00, not 5.
    assert format_range(5.0, 6.0123) == ("5.00", "6.01")
    # 11.1 needs 1 decimal for 3 digits: both ends get 1.
    assert format_range(9.2345, 11.1) == ("9.2", "11.1")
    # Past 1e4, both in the same exponent form with 3 significant digits.
    assert format_range(1.8801e10, 2.2612e10) == ("1.88e+10", "2.26e+10")


def test_a_range_whose_ends_read_the_same_collapses_to_one_value():
    assert format_range(8.671, 8.674) == ("8.67",)
    assert format_range(1.3101e10, 1.3102e10) == ("1.31e+10",)


def test_the_summary_line_shows_ranges_with_an_en_dash_and_one_value_when_the_conventions_agree(tmp_path):
    snapshot = snapshot_with(
        # 0.05 and 0.060123 as percents: 5.00 and 6.01
        mfu_avg=records.MetricValue(low=0.05, high=0.060123, label="measured"),
        # an MLP has no attention term: the four conventions give one number
        spent_flop=records.MetricValue(low=1.3101e10, high=1.3102e10, unit="FLOP"),
    )
    line = summary_line(tmp_path / "runs" / "r1", SUMMARY, snapshot)
    assert "MFU 5.00\u20136.01% (measured, range over conventions)" in line
    assert "FLOPs 1.31e+10 FLOP (the conventions agree)" in line
    assert "5-6" not in line and "e+10-" not in line


def test_an_mfu_range_that_collapses_keeps_its_peak_label(tmp_path):
    snapshot = snapshot_with(mfu_avg=records.MetricValue(low=0.08671, high=0.08672, label="measured"))
    assert "MFU 8.67% (measured, the conventions agree)" in summary_line(tmp_path / "r", SUMMARY, snapshot)


def test_see_it_again_names_the_run_when_it_is_where_tm_looks_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TM_RUNS_DIR", raising=False)
    run_dir = tmp_path / ".trainmeter" / "runs" / "20260101T000000Z-host-train"
    assert view_command(run_dir) == "tm view 20260101T000000Z-host-train"
    # TM_RUNS_DIR in the environment is where a later `tm view` looks too.
    monkeypatch.setenv("TM_RUNS_DIR", str(tmp_path / "elsewhere"))
    assert view_command(tmp_path / "elsewhere" / "r") == "tm view r"


def test_see_it_again_gives_the_path_when_the_runs_went_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TM_RUNS_DIR", raising=False)
    assert view_command(tmp_path / "my runs" / "r1") == "tm view 'my runs/r1'"
    assert view_command(Path("/srv/runs/r1")) == "tm view /srv/runs/r1"


@pytest.mark.xdist_group("heavy")
def test_after_runs_dir_the_printed_see_it_again_command_works_as_printed(tm_env, tmp_path):
    env = dict(tm_env)
    env.pop("TM_RUNS_DIR")
    elsewhere = tmp_path / "elsewhere"
    cwd = tmp_path / "here"
    cwd.mkdir()
    result = run_tm(
        ["--runs-dir", str(elsewhere), "--no-web", "--", sys.executable, "-c", "pass"], env, cwd=cwd
    )
    assert result.returncode == 0, result.stderr
    printed = result.stderr.rsplit("see it again: ", 1)[1].strip()
    argv = shlex.split(printed)
    assert argv[:2] == ["tm", "view"]
    # Run it as printed, from where the user was: the dashboard comes up for that run.
    view = subprocess.Popen(
        [TM, *argv[1:]], env=env, cwd=cwd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    try:
        lines: list[str] = []
        wait_for(lambda: "viewing" in (lines.append(view.stderr.readline()) or lines[-1]), 60, "tm view")
        (run_dir,) = elsewhere.iterdir()
        assert f"tm: viewing {run_dir.name}" in "".join(lines)
    finally:
        view.send_signal(signal.SIGINT)
        view.wait(30)
    assert view.returncode == 0


def test_see_it_again_calls_tm_by_its_path_where_the_shells_path_finds_no_tm_or_another(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TM_RUNS_DIR", raising=False)
    venv_tm = tmp_path / ".venv" / "bin" / "tm"
    venv_tm.parent.mkdir(parents=True)
    venv_tm.write_text("#!/bin/sh\n")
    venv_tm.chmod(0o755)
    other = tmp_path / "other"
    other.mkdir()
    (other / "tm").write_text("#!/bin/sh\n")
    (other / "tm").chmod(0o755)
    run_dir = tmp_path / ".trainmeter" / "runs" / "r1"
    # The shell's PATH finds this tm (an activated .venv): plain tm.
    assert view_command(run_dir, {"PATH": f"{venv_tm.parent}:/usr/bin:/bin"}, str(venv_tm)) == "tm view r1"
    # No tm on PATH, or another program of the name: this one's path, relative to where the user is.
    assert view_command(run_dir, {"PATH": "/usr/bin:/bin"}, str(venv_tm)) == ".venv/bin/tm view r1"
    assert view_command(run_dir, {"PATH": f"{other}:/usr/bin:/bin"}, ".venv/bin/tm") == ".venv/bin/tm view r1"
    assert tm_command({"PATH": "/usr/bin:/bin"}, str(venv_tm)) == ".venv/bin/tm"
    monkeypatch.chdir(other)
    assert tm_command({"PATH": "/usr/bin:/bin"}, str(venv_tm)) == str(venv_tm)  # not under the working folder
    assert tm_command({"PATH": "/usr/bin:/bin"}, "tm") == "./tm"  # this folder's own tm
    # Not started as a tm script (python -m, a test): tm.
    assert tm_command({"PATH": "/usr/bin:/bin"}, "/usr/lib/python3/cli.py") == "tm"


@pytest.mark.xdist_group("heavy")
def test_a_tm_started_by_its_path_prints_a_see_it_again_that_a_fresh_shell_runs_as_printed(tm_env, tmp_path):
    """Issue 41, point 10: the demo runs .venv/bin/tm from a shell that never activated .venv; `tm view` printed there
    was `bash: tm: command not found`."""
    env = dict(tm_env)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p and Path(p) != BIN)
    env.pop("TM_RUNS_DIR")
    cwd = tmp_path / "here"
    cwd.mkdir()
    result = run_tm(["--no-web", "--", sys.executable, "-c", "pass"], env, cwd=cwd)
    assert result.returncode == 0, result.stderr
    printed = result.stderr.rsplit("see it again: ", 1)[1].strip()
    assert not printed.startswith("tm "), printed
    # As printed, by a fresh shell with nothing but the system's PATH, from where the user was.
    view = subprocess.Popen(
        ["bash", "-c", printed],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        cwd=cwd,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        wait_for(
            lambda: (
                "viewing" in (lines.append(view.stderr.readline()) or lines[-1]) or view.poll() is not None
            ),
            60,
            "tm view",
        )
        (run_dir,) = (cwd / ".trainmeter" / "runs").iterdir()
        assert f"tm: viewing {run_dir.name}" in "".join(lines), "".join(lines)
    finally:
        os.killpg(view.pid, signal.SIGINT)
        view.wait(30)
