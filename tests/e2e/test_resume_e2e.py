"""A preempted CPU training run, killed with tm by SIGKILL right after a checkpoint, resumed from it: one run, one
timeline, every step once (issue 15, acceptance 3); and a run that still runs cannot be resumed (acceptance 4)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from deadline import wait_for
from tm_runs import REPO, TM, log_records, only_run, run_tm
from torch_required import require_torch

from trainmeter_core.model import records
from trainmeter_core.runlog import replay

LOOP = str(REPO / "tests" / "scripts" / "resume_loop.py")
TOKENS_PER_STEP = 64
HEADER = set(records.Record.__struct_fields__) - {"t", "wall"}  # what the hub stamps on the engine's snapshot


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie of ours is gone too (its parent, the killed tm, will never reap it: init does).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


def preempt(env, ckpt: Path, stop_after: int, how: str = "kill") -> Path:
    """Run the loop under tm until it signals that step ``stop_after`` (and its checkpoint) is done and recorded, then
    SIGKILL tm and the training together, as a preemption does (``how="kill"``), or SIGTERM tm, as a scheduler does
    first (``how="term"``: tm passes it on and writes the run's end)."""
    tm = subprocess.Popen(
        [TM, "--no-web", "--tokens-per-step", str(TOKENS_PER_STEP), LOOP, str(ckpt), "300", str(stop_after)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stopped = ckpt / "stopped"
        wait_for(lambda: stopped.exists() and stopped.read_text(), timeout_s=120, what="the loop's signal")
        child = int(stopped.read_text())
        run = only_run(Path(env["TM_RUNS_DIR"]))

        def recorded() -> bool:
            # The loop emitted `stopped_at` after its last checkpoint, so the agent has sent everything before with
            # it: wait for the recorder to write it (it flushes every 100 ms). No guess of how long: the log says.
            log = log_records(run)
            saved = stop_after % 50 or any(r["kind"] == "phase" and r.get("step") == stop_after for r in log)
            return saved and any(r["kind"] == "metric" and "stopped_at" in r["values"] for r in log)

        wait_for(recorded, what=f"step {stop_after} in the log")
        if how == "term":
            os.kill(tm.pid, signal.SIGTERM)
            assert tm.wait(60) == 128 + signal.SIGTERM
        else:
            os.kill(tm.pid, signal.SIGKILL)
            os.kill(child, signal.SIGKILL)
            tm.wait(30)
        wait_for(lambda: gone(child), what="the training to be gone")
        stopped.unlink()
        return run
    finally:
        if tm.poll() is None:
            tm.kill()
            tm.wait()


def runs_lines(env) -> list[str]:
    result = run_tm(["runs"], env)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def attempt_records(log: list[dict]) -> list[list[dict]]:
    """The log split at each run.start (each attempt's records, its run.start first)."""
    parts: list[list[dict]] = []
    for record in log:
        if record["kind"] == "run.start" or not parts:
            parts.append([])
        parts[-1].append(record)
    return parts


def useful_compute_s(attempt: list[dict], to_t: float | None = None) -> float:
    """Seconds from the attempt's first step to its last step (or to ``to_t``), less the checkpoints written in
    between: what the run trained in that stretch (this loop has no data loader)."""
    steps = [r for r in attempt if r["kind"] == "step"]
    start = steps[0]["t"]
    end = steps[-1]["t"] if to_t is None else to_t
    saved = sum(
        min(p["end_t"], end) - max(p["start_t"], start)
        for p in attempt
        if p["kind"] == "phase" and p["end_t"] > start and p["start_t"] < end
    )
    return end - start - saved


@pytest.mark.xdist_group("heavy")
@pytest.mark.parametrize(
    ("stop_after", "how"),
    [(150, "kill"), (170, "kill"), (150, "term")],
    ids=["killed-at-its-checkpoint", "killed-20-steps-after-it", "terminated-at-its-checkpoint"],
)
def test_a_preempted_run_resumed_from_its_checkpoint_is_one_run_with_every_step_once(
    tm_env, tmp_path, stop_after, how
):
    require_torch()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    run = preempt(tm_env, ckpt, stop_after, how)
    (line,) = runs_lines(tm_env)
    ended = "lost" if how == "kill" else "finished (exit 143)"
    assert f" {ended} " in line and f" {stop_after} steps" in line

    # The same command again: it names the checkpoint folder the lost run wrote to, so it resumes that run.
    again = [TM, "--no-web", "--tokens-per-step", str(TOKENS_PER_STEP), LOOP, str(ckpt), "300"]
    if stop_after != 150:
        again[1:1] = ["--resume", run.name]  # and the explicit way
    result = subprocess.run(again, env=tm_env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "resuming" in line]
    if stop_after == 150:
        assert said == [
            f"tm: resuming run {run.name} as attempt 2: the command names {ckpt}, where it wrote its checkpoints "
            "(--new-run starts a new run)"
        ]
    else:
        assert said == []
    assert " · attempt 2, resumed after step 150, " in result.stderr.splitlines()[-1]

    # One run in tm runs, with its two attempts and 300 steps.
    (line,) = runs_lines(tm_env)
    assert line.split()[0] == run.name
    assert "finished (exit 0)" in line and " 300 steps" in line and line.endswith("2 attempts")

    # The log: two attempts in two segments, sequence numbers rising throughout, steps 1..300 once each but the
    # ones the second attempt did again (151..170 when the kill came at 170).
    log = log_records(run)
    assert sorted(p.name for p in run.glob("events-*")) == ["events-0001.jsonl", "events-0002.jsonl"]
    seqs = [r["seq"] for r in log]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    first, second = attempt_records(log)
    assert (first[0]["kind"], second[0]["kind"], second[0]["attempt"]) == ("run.start", "run.start", 2)
    assert [r["step"] for r in first if r["kind"] == "step"] == list(range(1, stop_after + 1))
    second_steps = [r for r in second if r["kind"] == "step"]
    assert [r["step"] for r in second_steps] == list(range(151, 301))
    assert second_steps[0]["resumed_from"] == 150  # read from the restored AdamW's step

    summary = json.loads((run / "summary.json").read_text())
    snapshot = summary["snapshot"]
    assert summary["steps"] == snapshot["steps"] == 300
    # the rank's steps mean the same: the steps it kept, each once (not 300 + the ones done again)
    assert [(r["rank"], r["steps"]) for r in snapshot["ranks"]] == [(0, 300)]
    assert snapshot["tokens"] == 300 * TOKENS_PER_STEP  # 19,200: each step's tokens once
    superseded = stop_after - 150  # steps 151..stop_after were done twice
    assert snapshot["metrics"]["superseded_steps"]["value"] == superseded
    lost, resumed = summary["attempts"]
    assert (lost["end"], lost["last_step"], lost.get("superseded_steps", 0)) == (
        "lost" if how == "kill" else "killed by SIGTERM",
        stop_after,
        superseded,
    )
    assert (resumed["end"], resumed["first_step"], resumed["resumed_from"]) == ("exited 0", 151, 150)

    # The gap, marked with its length: from the first attempt's end (its last tick or step: the hub ticks every
    # second while tm lives) to the second one's start.
    gap_s = second[0]["wall"] - max(r["wall"] for r in first if r["kind"] in ("tick", "step", "run.end"))
    assert resumed["gap_s"] == pytest.approx(gap_s, abs=1e-6) and gap_s > 0
    assert snapshot["phases_s"]["down"] == pytest.approx(gap_s, abs=1e-6)

    # Goodput, from the log by hand: one host, so both attempts share its monotonic clock.
    #   elapsed = run.end's t − the first run.start's t
    #   trained = (attempt 1: its first step → step 150, or → the end of the checkpoint of step 150 when the steps
    #              after it were done again; attempt 2: step 151 → step 300), each less the checkpoints inside
    #   goodput = trained / elapsed: below 1 by start-up, the gap, each attempt's start-up and end, the steps done again, the checkpoints
    end = next(r for r in second if r["kind"] == "run.end")
    elapsed_s = end["t"] - first[0]["t"]
    saved_150 = next(p for p in first if p["kind"] == "phase" and p.get("step") == 150)
    trained_s = useful_compute_s(first, saved_150["end_t"] if superseded else None) + useful_compute_s(second)
    assert snapshot["elapsed_s"] == pytest.approx(elapsed_s, abs=1e-6)
    assert snapshot["metrics"]["goodput"]["value"] == pytest.approx(trained_s / elapsed_s, rel=1e-9)
    assert snapshot["metrics"]["goodput"]["value"] < (elapsed_s - gap_s) / elapsed_s < 1
    assert summary["lost_time"]["seconds"]["down"] == pytest.approx(gap_s, abs=1e-6)

    # tm view gives what the run showed live (the hub's header aside): a replay of the whole log, and one from the
    # engine's checkpoint.
    for use_checkpoint in (False, True):
        again = json.loads(msgspec.json.encode(replay.final_snapshot(run, use_checkpoint=use_checkpoint)))
        assert body(again) == body(snapshot), use_checkpoint

    # The alerts went on: how the first attempt ended was said (when it ended, or while the second one started for a
    # lost one), and cleared since: one episode.
    died = [(r["state"], r["message"]) for r in log if r["kind"] == "alert" and r["rule"] == "died"]
    if how == "kill":
        said = (
            f"attempt 1 of the run was lost after step {stop_after}: tm stopped with the training, so no exit was "
            "seen; attempt 2 resumes it"
        )
    else:
        said = f"the training process was killed by SIGTERM (signal 15) after {stop_after} steps"
    assert [state for state, _ in died] == ["fired", "cleared"] and died[0][1] == said


def body(snapshot: dict) -> dict:
    return {k: v for k, v in snapshot.items() if k not in HEADER}


@pytest.mark.xdist_group("heavy")
def test_resuming_a_run_that_still_runs_is_refused_in_one_line(tm_env, tmp_path):
    up, release, ran = tmp_path / "up", tmp_path / "release", tmp_path / "ran"
    holder = (
        "import pathlib, sys, time\n"
        f"pathlib.Path({str(up)!r}).write_text('up')\n"
        f"while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.05)\n"
    )
    tm = subprocess.Popen(
        [TM, "--no-web", "--name", "holder", "--", sys.executable, "-c", holder],
        env=tm_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(up.exists, what="the first run to start")
        touch = f"import pathlib; pathlib.Path({str(ran)!r}).write_text('ran')"
        result = run_tm(["--no-web", "--resume", "holder", "--", sys.executable, "-c", touch], tm_env)
        assert result.returncode == 2
        (line,) = result.stderr.splitlines()
        run = only_run(Path(tm_env["TM_RUNS_DIR"]))
        assert line == (
            f"tm: run {run.name} is still running (its launcher holds run.lock): resume it once it has ended, "
            "or watch it with tm view"
        )
        assert not ran.exists()  # nothing of the refused command ran
    finally:
        release.write_text("go")
        assert tm.wait(60) == 0
    # Once it has ended, the same resume is taken: the same run, its second attempt.
    result = run_tm(["--no-web", "--resume", "holder", "--", sys.executable, "-c", touch], tm_env)
    assert result.returncode == 0, result.stderr
    assert ran.exists()
    (line,) = runs_lines(tm_env)
    assert line.endswith("2 attempts") and "finished (exit 0)" in line
    time.sleep(0)  # nothing to wait for: tm exited after writing its summary


@pytest.mark.xdist_group("heavy")
def test_the_same_command_again_while_its_run_lives_is_refused_and_new_run_starts_a_separate_run(
    tm_env, tmp_path
):
    """Issue 41, point 11: the second start would have trained beside the first, from its checkpoints, unsaid."""
    release = tmp_path / "release"
    holder = (
        "import pathlib, sys, time\n"
        f"with open({str(tmp_path / 'started')!r}, 'a') as f: f.write('x')\n"
        f"while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.05)\n"
    )
    argv = ["--no-web", "--", sys.executable, "-c", holder]
    runs = Path(tm_env["TM_RUNS_DIR"])
    described = lambda: [p for p in runs.iterdir() if (p / "meta.json").exists()] if runs.is_dir() else []  # noqa: E731
    first = subprocess.Popen([TM, *argv], env=tm_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    second = None
    try:
        (live,) = wait_for(described, 60, "the first run's meta.json")
        again = run_tm(argv, tm_env, timeout=60)  # unfixed, it ran (and waited) beside the first
        assert again.returncode == 2
        assert again.stderr == (
            f"tm: run {live.name} is still running the same command (its launcher holds run.lock): "
            f"watch it with tm view {live.name}, or pass --new-run to start a second run\n"
        )
        assert described() == [live]  # no run directory for the refused start
        # --new-run: a second run, deliberately, beside the first.
        second = subprocess.Popen(
            [TM, "--new-run", *argv], env=tm_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        wait_for(lambda: len(described()) == 2, 60, "the second run's meta.json")
        wait_for(lambda: (tmp_path / "started").read_text() == "xx", 60, "both commands to start")
    finally:
        release.write_text("go")
        assert first.wait(60) == 0
        if second is not None:
            assert second.wait(60) == 0, second.stderr.read()
    lines = runs_lines(tm_env)
    assert len(lines) == 2 and all("finished (exit 0)" in line for line in lines), lines
    assert all(not line.endswith("attempts") for line in lines)  # two runs, neither resumed the other
