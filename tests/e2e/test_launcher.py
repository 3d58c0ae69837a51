"""The launcher runs a command untouched and exits with its status; tm's own failures are one clear line."""

from __future__ import annotations

import json
import os
import platform
import shlex
import signal
import stat
import subprocess
import sys
import textwrap

from deadline import wait_for
from tm_runs import TM, log_records, only_run, run_tm


def test_child_exit_status_is_tms_exit_status(tm_env, tmp_path):
    result = run_tm(["--", sys.executable, "-c", "import sys; sys.exit(3)"], tm_env)
    assert result.returncode == 3, result.stderr
    run = only_run(tmp_path / "runs")
    records = log_records(run)
    kinds = [r["kind"] for r in records]
    # run.end is the last line, but for alerts computed from the final snapshot (a run that ended badly)
    ending = kinds.index("run.end")
    assert kinds[0] == "run.start" and set(kinds[ending + 1 :]) <= {"alert"}
    end = records[ending]
    assert end["status"] == 3 and end["exit_code"] == 3


def test_child_killed_by_sigterm_gives_143(tm_env):
    result = run_tm(
        ["--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], tm_env
    )
    assert result.returncode == 128 + signal.SIGTERM == 143


def test_missing_script_is_one_line_and_127(tm_env, tmp_path):
    result = run_tm(["nonexistent.py"], tm_env, cwd=tmp_path)
    assert result.returncode == 127
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "nonexistent.py" in lines[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()  # nothing ran, so no run directory


def test_missing_command_is_127_and_not_executable_is_126(tm_env, tmp_path):
    assert run_tm(["--", "no-such-command-xyz"], tm_env).returncode == 127
    script = tmp_path / "plain.txt"
    script.write_text("echo hi\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    result = run_tm(["--", str(script)], tm_env)
    assert result.returncode == 126
    assert len(result.stderr.strip().splitlines()) == 1


def test_sigterm_to_tm_reaches_the_child_exactly_once(tm_env, tmp_path):
    marker = tmp_path / "signals.txt"
    ready = tmp_path / "ready"
    child = textwrap.dedent(
        f"""
        import signal, sys, time, pathlib
        got = []
        def on_term(signum, frame):
            got.append(signum)
            with open({str(marker)!r}, "a") as f:
                f.write(f"{{signum}}\\n")
        signal.signal(signal.SIGTERM, on_term)
        pathlib.Path({str(ready)!r}).write_text("1")
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # a duplicate delivery would arrive within this
        sys.exit(7)
        """
    )
    proc = subprocess.Popen(
        [TM, "--", sys.executable, "-c", child], env=tm_env, stderr=subprocess.PIPE, text=True
    )
    wait_for(ready.exists, what="the child to install its handler")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 7
    assert marker.read_text().splitlines() == [str(int(signal.SIGTERM))]


def test_tm_inside_tm_runs_the_command_untouched(tm_env, tmp_path):
    inner = f"import subprocess, sys; sys.exit(subprocess.call([{TM!r}, '--', sys.executable, '-c', 'import sys; sys.exit(5)']))"
    result = run_tm(["--", sys.executable, "-c", inner], tm_env)
    assert result.returncode == 5
    assert len([p for p in (tmp_path / "runs").iterdir()]) == 1  # the inner tm made no run of its own


def test_tm_inside_a_torchrun_rank_says_to_put_tm_outside(tm_env):
    env = dict(tm_env, LOCAL_RANK="0")
    result = run_tm(["--", sys.executable, "-c", "print('ran')"], env)
    assert result.returncode == 0 and result.stdout.strip() == "ran"
    assert "tm -- torchrun" in result.stderr


def test_closed_pipe_leaves_no_traceback_and_the_training_finishes(tm_env, tmp_path):
    done = tmp_path / "done"
    code = (
        "import sys, time, pathlib\n"
        "for i in range(200):\n"
        "    try:\n        print(i, flush=True)\n    except BrokenPipeError:\n        break\n"
        f"pathlib.Path({str(done)!r}).write_text('1')\n"
    )
    shell = f"{TM} -- {sys.executable} -c {shlex.quote(code)} 2>&1 | head -1"
    result = subprocess.run(["bash", "-c", shell], env=tm_env, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() != ""
    assert "Traceback" not in result.stdout + result.stderr
    wait_for(done.exists, what="the training to finish after the reader went away")


def test_run_directory_is_private_and_ignored_by_git(tm_env, tmp_path):
    env = dict(tm_env)
    env.pop("TM_RUNS_DIR")
    result = run_tm(["--", sys.executable, "-c", "pass"], env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / ".trainmeter" / ".gitignore").read_text() == "*\n"
    run = only_run(tmp_path / ".trainmeter" / "runs")
    assert stat.S_IMODE(run.stat().st_mode) == 0o700


def test_unwritable_runs_directory_is_one_line_naming_the_flag(tm_env, tmp_path):
    if os.geteuid() == 0:
        target = "/proc/tm-cannot-write-here"  # root writes anywhere a mode allows; /proc refuses everyone
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        target = str(locked / "runs")
    result = run_tm(["--runs-dir", target, "--", sys.executable, "-c", "pass"], tm_env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--runs-dir" in lines[0]


def test_secrets_in_the_command_line_are_redacted_in_meta_and_log(tm_env, tmp_path):
    args = [
        "--",
        sys.executable,
        "-c",
        "pass",
        "--api-key",
        "sk-live-123456789012345678901234",
        "--max-tokens",
        "512",
    ]
    assert run_tm(args, tm_env).returncode == 0
    run = only_run(tmp_path / "runs")
    for path in [run / "meta.json", *run.glob("events-*.jsonl")]:
        text = path.read_text()
        assert "sk-live" not in text
        assert "512" in text
    start = log_records(run)[0]
    assert start["command"][-4:] == ["--api-key", "***", "--max-tokens", "512"]


def test_run_start_is_dated_when_the_run_started_even_when_a_step_came_first(tm_env, tmp_path):
    # An emit-only loop can send its first step before the launcher has loaded its plugins and described the run:
    # the run's start is still the moment tm started it, so the time before the first step is never negative.
    script = "from trainmeter_agent import emit\nfor i in range(3):\n    emit(step=i, tokens=10)\n"
    result = run_tm(["--", sys.executable, "-c", script], dict(tm_env, TM_DISABLE_COMPONENTS="web"))
    assert result.returncode == 0, result.stderr
    run_dir = only_run(tmp_path / "runs")
    log = log_records(run_dir)
    (start,) = [r for r in log if r["kind"] == "run.start"]
    first_step = min(r["t"] for r in log if r["kind"] == "step")
    assert start["t"] <= first_step
    meta = json.loads((run_dir / "meta.json").read_text())
    assert start["wall"] == meta["start_wall"]
    snapshot = json.loads((run_dir / "summary.json").read_text())["snapshot"]
    assert snapshot["phases_s"]["startup"] >= 0
    assert snapshot["metrics"]["goodput"]["value"] <= 1


def test_the_runs_platform_is_the_one_python_names(tm_env, tmp_path):
    # The launcher looks it up in a thread while it starts (platform.platform() runs `uname -p`): the same string.
    result = run_tm(["--", sys.executable, "-c", "pass"], dict(tm_env, TM_DISABLE_COMPONENTS="web"))
    assert result.returncode == 0, result.stderr
    run_dir = only_run(tmp_path / "runs")
    (start,) = [r for r in log_records(run_dir) if r["kind"] == "run.start"]
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["platform"] == start["platform"] == platform.platform()
