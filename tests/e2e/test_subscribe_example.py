"""``examples/subscribe.py``, as a newcomer first runs it: with no run it waits and says so in one line, it follows
the next run, prints what a person reads (no ``rank None`` for a one-process run) and says when that run ended.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from deadline import wait_for
from tm_runs import REPO, run_tm

EXAMPLE = str(REPO / "examples" / "subscribe.py")
LOOP = str(REPO / "tests" / "scripts" / "emit_loop.py")

pytestmark = pytest.mark.xdist_group("heavy")


def read_until(proc, text: str, lines: list[str], what: str) -> None:
    def seen() -> bool:
        line = proc.stdout.readline()
        if line:
            lines.append(line.rstrip("\n"))
        return bool(lines) and text in lines[-1]

    wait_for(seen, 60, what)


def test_with_no_run_it_waits_in_one_line_then_follows_the_next_run_to_its_end(tm_env, tmp_path):
    example = subprocess.Popen(
        [sys.executable, EXAMPLE], env=tm_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        lines: list[str] = []
        read_until(example, "waiting", lines, "the example to say it waits")
        assert lines == [f"no run under {tmp_path / 'runs'} yet: waiting for one to start (Ctrl-C to stop)"]
        # Ten steps of 0.1 s: the example has joined by the time they run (it polls every 0.2 s).
        result = run_tm(
            ["--no-web", "--", sys.executable, LOOP, "10", "0.1", str(tmp_path / "never")], tm_env
        )
        assert result.returncode == 0, result.stderr
        assert example.wait(60) == 0
        rest = example.stdout.read().splitlines()
    finally:
        example.kill()
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert rest[0] == f"following {run_dir.name}"
    steps = [line for line in rest if line.startswith("step ")]
    assert steps, rest
    assert all("rank" not in line and "None" not in line for line in steps)
    assert rest[-1].startswith(f"{run_dir.name} ended: exit 0 after ") and rest[-1].endswith(" and 10 steps")
    assert example.stderr.read() == ""


def test_after_a_finished_run_it_says_so_and_waits_for_the_next(tm_env, tmp_path):
    assert run_tm(["--no-web", "--", sys.executable, "-c", "pass"], tm_env).returncode == 0
    (finished,) = (tmp_path / "runs").iterdir()
    example = subprocess.Popen([sys.executable, EXAMPLE], env=tm_env, stdout=subprocess.PIPE, text=True)
    try:
        lines: list[str] = []
        read_until(example, "waiting", lines, "the example to say it waits")
        assert lines == [
            f"{finished.name} is finished (exit 0); waiting for the next run under {tmp_path / 'runs'} to start "
            "(Ctrl-C to stop)"
        ]
        assert example.poll() is None  # still waiting
    finally:
        example.kill()
        example.wait(30)


def test_a_finished_run_by_name_is_one_line_pointing_at_its_log(tm_env, tmp_path):
    assert run_tm(["--no-web", "--", sys.executable, "-c", "raise SystemExit(3)"], tm_env).returncode == 3
    (finished,) = (tmp_path / "runs").iterdir()
    result = subprocess.run(
        [sys.executable, EXAMPLE, finished.name], env=tm_env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert (
        result.stdout == f"{finished.name} is finished (exit 3): `tm tail {finished.name}` prints its log\n"
    )


def test_an_unknown_run_is_one_line_and_no_traceback(tm_env, tmp_path):
    result = subprocess.run(
        [sys.executable, EXAMPLE, "nope"], env=tm_env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr == f"no run matches 'nope' under {tmp_path / 'runs'}: `tm runs` lists them\n"
