"""The launcher says once, for each process of the run the agent never joined, why and what fixes it."""

from __future__ import annotations

import sys

import pytest
from tm_runs import log_records, only_run, run_tm

SLEEP = "import time; time.sleep(3)"


@pytest.fixture
def env(tm_env):
    # The agent says hello within tens of ms of the interpreter's start: half a second of grace is plenty here.
    return dict(tm_env, TM_SILENCE_GRACE_S="0.5", TM_DISABLE_COMPONENTS="web")


def silent_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "never said hello" in line]


def notices(tmp_path) -> list[dict]:
    return [
        r for r in log_records(only_run(tmp_path / "runs")) if r["kind"] == "notice" and r["topic"] == "agent"
    ]


def test_python_in_isolated_mode_is_named_with_the_command_that_fixes_it(env, tmp_path):
    result = run_tm(["--", sys.executable, "-I", "-c", SLEEP], env)
    assert result.returncode == 0, result.stderr
    (line,) = silent_lines(result.stderr)
    assert "isolated mode (-I)" in line
    # The fix is the same command without -I, shell-quoted as a user would paste it.
    assert f"fix: {sys.executable} -c 'import time; time.sleep(3)'" in line
    (notice,) = notices(tmp_path)
    assert notice["message"] == line.removeprefix("tm: ")
    assert notice.get("level", "warning") == "warning"  # the default level is left out of the line


def test_a_cleared_environment_is_named(env, tmp_path):
    result = run_tm(["--", "env", "-i", sys.executable, "-c", SLEEP], env)
    assert result.returncode == 0, result.stderr
    (line,) = silent_lines(result.stderr)
    assert "lacks tm's TM_AGENT_ENDPOINT and PYTHONPATH" in line and "sudo -E" in line


def test_a_command_that_is_not_python_gets_one_line_on_what_tm_cannot_see(env, tmp_path):
    result = run_tm(["--", "sh", "-c", "sleep 3"], env)
    assert result.returncode == 0, result.stderr
    (line,) = silent_lines(result.stderr)
    assert "sh is not Python" in line and "GPU counters and host data" in line


def test_a_python_process_the_agent_joined_gets_no_line(env, tmp_path):
    result = run_tm(["--", sys.executable, "-c", SLEEP], env)
    assert result.returncode == 0, result.stderr
    assert silent_lines(result.stderr) == []
    assert notices(tmp_path) == []


def test_a_shell_that_starts_python_is_not_reported_once_its_python_said_hello(env, tmp_path):
    result = run_tm(["--", "sh", "-c", f"{sys.executable} -c '{SLEEP}'; true"], env)
    assert result.returncode == 0, result.stderr
    assert silent_lines(result.stderr) == []


def test_without_the_agent_nothing_is_watched(env, tmp_path):
    result = run_tm(["--no-agent", "--", sys.executable, "-c", SLEEP], env)
    assert result.returncode == 0, result.stderr
    assert silent_lines(result.stderr) == []


def test_another_python_without_trainmeter_is_named_with_the_install_that_fixes_it(env, tmp_path):
    import subprocess

    other = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True)
    python = str(other / "bin" / "python")
    # Run from tmp_path: from the repository's own folder `python -c` would find trainmeter_agent in it.
    result = run_tm(["--", python, "-c", SLEEP], env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (line,) = silent_lines(result.stderr)
    # Asked in its own environment, that interpreter cannot import trainmeter_agent: certain, so it is said.
    assert f"it runs {python}, another Python than tm's (" in line and "), which has no trainmeter" in line
    assert line.endswith(f"fix: {python} -m pip install trainmeter")
