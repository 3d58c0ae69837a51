"""`tm attach PID`: a running training script is watched from outside, its CPU and memory recorded in a run
directory, and Ctrl-C ends the watch while the script keeps running; a script that exits ends the run."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from deadline import wait_for
from tm_runs import TM, log_records, only_run, run_tm

# A "training script" that burns CPU, holds memory, and counts its steps in a file we can watch.
TRAIN = """
import os, sys, time
ballast = bytearray(64 * 1024 * 1024)
steps = 0
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    sum(range(20000))
    steps += 1
    if steps % 200 == 0:
        # Whole or not at all: the test reads it meanwhile, and a file opened with "w" is empty for a moment.
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write(str(steps))
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""


def start_training(tmp_path, seconds: float) -> tuple[subprocess.Popen, object]:
    progress = tmp_path / "steps"
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    # Its own session, as a job started from another shell: nothing tm does can reach it by process group.
    child = subprocess.Popen(
        [sys.executable, str(script), str(progress), str(seconds)], start_new_session=True
    )
    wait_for(progress.exists, what="the script's first steps")
    return child, progress


def host_samples(runs) -> list[dict]:
    run_dirs = [p for p in runs.iterdir() if p.is_dir()] if runs.exists() else []
    return [
        r
        for d in run_dirs
        for r in log_records(d, live=True)
        if r["kind"] == "sample.host" and "cpu_cores" in r
    ]


@pytest.mark.xdist_group("heavy")
def test_attach_records_cpu_and_memory_and_ctrl_c_leaves_the_script_running(tm_env, tmp_path):
    child, progress = start_training(tmp_path, seconds=120)
    try:
        env = dict(tm_env, TM_HOST_INTERVAL_S="0.2")
        watch = subprocess.Popen(
            [TM, "attach", str(child.pid)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        runs = tmp_path / "runs"
        wait_for(lambda: len(host_samples(runs)) >= 2, what="two sample.host records of the attached script")
        watch.send_signal(signal.SIGINT)  # what Ctrl-C in tm's terminal delivers
        _, stderr = watch.communicate(timeout=60)
        assert watch.returncode == 0, stderr
        assert f"watch stopped, pid {child.pid} still runs" in stderr

        steps_at_stop = int(progress.read_text())
        wait_for(lambda: int(progress.read_text()) > steps_at_stop, what="the script to keep stepping")
        assert child.poll() is None

        run_dir = only_run(runs)
        records = log_records(run_dir)
        samples = [r for r in records if r["kind"] == "sample.host" and "cpu_cores" in r]
        assert all(r["root_pid"] == child.pid for r in samples)
        assert max(r["cpu_cores"] for r in samples) > 0.2
        assert min(r["rss_b"] for r in samples) > 64 * 1024 * 1024  # the 64 MiB ballast is resident
        start = next(r for r in records if r["kind"] == "run.start")
        assert start["child_pid"] == child.pid and start["agent"] is False
        assert "train.py" in " ".join(start["command"])
        end = next(r for r in records if r["kind"] == "run.end")
        assert end["absent"]["exit_code"].startswith("detached")
    finally:
        child.kill()
        child.wait()


@pytest.mark.xdist_group("heavy")
def test_the_run_ends_when_the_watched_script_exits(tm_env, tmp_path):
    child, _ = start_training(tmp_path, seconds=1.5)
    result = run_tm(["attach", str(child.pid), "--name", "short"], tm_env, timeout=60)
    child.wait()
    assert result.returncode == 0 and f"pid {child.pid} exited" in result.stderr
    run_dir = only_run(tmp_path / "runs")
    assert run_dir.name.endswith("-short")
    kinds = [r["kind"] for r in log_records(run_dir)]
    assert kinds[0] == "run.start" and kinds[-1] == "run.end"


@pytest.mark.parametrize(
    "pid, message",
    [("abc", "'abc' is not a process id"), ("999999999", "no process 999999999")],
)
def test_a_pid_that_cannot_be_watched_is_one_line_and_exit_2(tm_env, pid, message):
    result = run_tm(["attach", pid], tm_env)
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_attach_never_signals_the_program():
    # The module holds no call that could: kill, killpg, send_signal, terminate appear nowhere in it.
    from trainmeter_core.run import attach

    source = open(attach.__file__).read()
    for call in ("os.kill", "killpg", "send_signal", ".terminate(", "pidfd_send_signal"):
        assert call not in source


def test_a_run_is_named_after_the_script_or_module_it_runs():
    from trainmeter_core.run.attach import program_name

    assert program_name(["/usr/bin/python3", "-u", "scripts/train.py", "--lr", "3"], 1) == "train"
    assert program_name(["python", "-m", "torch.distributed.run", "x.py"], 1) == "torch.distributed.run"
    assert program_name(["python3", "-c", "pass"], 1) == "python3"
    assert program_name(["./a.out"], 1) == "a.out" and program_name([], 42) == "pid42"
