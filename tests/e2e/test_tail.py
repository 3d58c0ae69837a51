"""Anyone can subscribe: `tm tail` and the example print a live run's step records while it runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from deadline import wait_for
from tm_runs import REPO, TM, only_run, run_tm

LOOP = str(REPO / "tests" / "scripts" / "emit_loop.py")


def read_lines(proc, n, what):
    lines = []

    def enough():
        line = proc.stdout.readline()
        if line:
            lines.append(line)
        return len(lines) >= n

    wait_for(enough, what=what)
    return lines


@pytest.mark.xdist_group("heavy")
def test_tail_and_the_example_print_step_records_while_the_run_goes(tm_env, tmp_path):
    done = tmp_path / "done"
    run_proc = subprocess.Popen(
        [TM, "--", sys.executable, LOOP, "150", "0.05", str(done)], env=tm_env, stderr=subprocess.DEVNULL
    )
    runs = tmp_path / "runs"
    run = wait_for(lambda: runs.exists() and any(runs.iterdir()) and only_run(runs), what="the run directory")
    wait_for(lambda: (run / "endpoints.json").exists() and (run / "meta.json").exists(), what="the endpoints")
    tail = subprocess.Popen(
        [TM, "tail", run.name, "--kind", "step"], env=tm_env, stdout=subprocess.PIPE, text=True
    )
    example = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "subscribe.py"), str(run)],
        env=tm_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        tail_lines = read_lines(tail, 5, "five step records from tm tail")
        example_lines = read_lines(example, 6, "five step lines from examples/subscribe.py")
        assert not done.exists(), "the run ended before the subscribers printed: not live"
    finally:
        run_proc.wait(120)
    records = [json.loads(line) for line in tail_lines]
    assert all(r["kind"] == "step" for r in records)
    steps = [r["step"] for r in records]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert example_lines[0] == f"following {run.name}\n"
    assert all(line.startswith("step ") for line in example_lines[1:])
    # Both end by themselves once the run has ended.
    assert tail.wait(30) == 0 and example.wait(30) == 0


def test_tail_of_a_finished_run_prints_its_log(tm_env, tmp_path):
    assert run_tm(["--", sys.executable, "-c", "import sys; sys.exit(4)"], tm_env).returncode == 4
    result = run_tm(["tail", "--kind", "run.end"], tm_env)
    assert result.returncode == 0, result.stderr
    (end,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert end["kind"] == "run.end" and end["status"] == 4
