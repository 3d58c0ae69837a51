"""Which run a command resumes: ``--resume RUN`` (refused while it runs), or the newest unfinished run of the same name
whose checkpoint the command names; and how ``tm runs`` counts a resumed run's steps and attempts."""

from __future__ import annotations

import json
import os
import shlex
import socket

import pytest
from test_reopen import write_log

from trainmeter_core.commands.runs import count_steps
from trainmeter_core.model import records
from trainmeter_core.run import resume
from trainmeter_core.run.run_options import RunOptions
from trainmeter_core.runlog import rundir


def make_run(base, stamp, name, *, checkpoint=None, summary_exit=None, attempts=None):
    """A run directory as a launcher leaves it: meta.json, a log (with a checkpoint phase), maybe summary.json."""
    run_dir = base / f"{stamp}-vm-{name}"
    run_dir.mkdir(parents=True)
    meta = {"run_id": run_dir.name, "name": name, "start_wall": 1000.0, "command": ["train.py"]}
    if attempts:
        meta["attempts"] = [{"attempt": n} for n in range(1, attempts + 1)]
    (run_dir / "meta.json").write_text(json.dumps(meta))
    logged = [(1, records.Step(step=1))]
    if checkpoint is not None:
        logged.append(
            (2, records.Phase(phase="checkpoint", start_t=1.0, end_t=2.0, paths=[str(checkpoint)], step=1))
        )
    write_log(run_dir, logged)
    if summary_exit is not None:
        (run_dir / "summary.json").write_text(json.dumps({"state": "finished", "exit_status": summary_exit}))
    return run_dir


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A working folder with a checkpoint folder in it, and the runs folder beside."""
    cwd = tmp_path / "work"
    (cwd / "ckpt").mkdir(parents=True)
    (cwd / "ckpt" / "step-50.pt").write_bytes(b"x")
    monkeypatch.chdir(cwd)
    return cwd


def test_an_argument_naming_the_checkpoint_or_its_folder_matches_and_the_working_folder_does_not(work):
    saved = [str(work / "ckpt" / "step-50.pt")]
    assert resume.names_checkpoint(["train.py", "--out", "ckpt"], str(work), saved) == "ckpt"
    assert (
        resume.names_checkpoint(["train.py", "--from=ckpt/step-50.pt"], str(work), saved)
        == "--from=ckpt/step-50.pt"
    )
    assert resume.names_checkpoint(["train.py", str(work / "ckpt")], "/", saved) == str(work / "ckpt")
    assert (
        resume.names_checkpoint(["train.py", ".", ".."], str(work), saved) is None
    )  # too broad to say anything
    assert resume.names_checkpoint(["train.py", "other"], str(work), saved) is None
    assert resume.names_checkpoint(["train.py", "ckpt"], str(work), []) is None
    (work / "ckpt" / "step-50.pt").unlink()
    os.rmdir(work / "ckpt")  # the checkpoint is gone: the command cannot be resuming from it
    assert resume.names_checkpoint(["train.py", "ckpt"], str(work), saved) is None


def test_the_newest_lost_run_of_the_name_whose_checkpoint_the_command_names_is_resumed(work, tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "20260101T000000Z", "train", checkpoint=work / "ckpt" / "step-50.pt", summary_exit=0)
    lost = make_run(runs, "20260102T000000Z", "train", checkpoint=work / "ckpt" / "step-50.pt", attempts=2)
    make_run(runs, "20260103T000000Z", "other", checkpoint=work / "ckpt" / "step-50.pt")
    found = resume.matching("train", ["train.py", "--out", "ckpt"], str(work), str(runs))
    assert found is not None
    target, arg = found
    assert (target.run_dir, target.attempt, arg) == (lost, 3, "ckpt")
    assert target.reason == "the command names ckpt, where it wrote its checkpoints"
    assert resume.matching("train", ["train.py"], str(work), str(runs)) is None  # names no checkpoint


def test_a_run_that_finished_well_or_crashed_without_a_named_checkpoint_starts_a_new_run(work, tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "20260101T000000Z", "train", checkpoint=work / "ckpt" / "step-50.pt", summary_exit=0)
    assert resume.matching("train", ["train.py", "ckpt"], str(work), str(runs)) is None
    crashed = make_run(
        runs, "20260102T000000Z", "train", checkpoint=work / "ckpt" / "step-50.pt", summary_exit=1
    )
    target, _ = resume.matching("train", ["train.py", "ckpt"], str(work), str(runs))
    assert target.run_dir == crashed and target.attempt == 2


def test_resuming_a_run_that_still_runs_is_refused_by_its_lock(work, tmp_path):
    runs = tmp_path / "runs"
    live = make_run(runs, "20260101T000000Z", "train", checkpoint=work / "ckpt" / "step-50.pt")
    lock = rundir.RunLock(live)
    lock.acquire()  # its launcher
    try:
        with pytest.raises(resume.ResumeError) as raised:
            resume.explicit("train", str(runs))
        assert str(raised.value) == (
            f"run {live.name} is still running (its launcher holds run.lock): resume it once it has ended, "
            "or watch it with tm view"
        )
        assert "\n" not in str(raised.value)
        assert resume.matching("train", ["train.py", "ckpt"], str(work), str(runs)) is None
        assert rundir.run_info(live).state == "running"
    finally:
        lock.release()
    target = resume.explicit("train", str(runs))
    assert (target.run_dir, target.attempt, target.reason) == (live, 2, "--resume")


def test_a_missing_run_is_one_line_naming_it():
    with pytest.raises(resume.ResumeError) as raised:
        resume.explicit("nope", "/nonexistent-runs")
    assert str(raised.value).startswith("--resume nope: no run")


def test_a_running_resumed_run_is_running_even_beside_the_summary_of_its_attempt_before(tmp_path):
    run_dir = make_run(tmp_path, "20260101T000000Z", "train", summary_exit=137, attempts=2)
    lock = rundir.RunLock(run_dir)
    lock.acquire()
    try:
        info = rundir.run_info(run_dir)
        assert (info.state, info.attempts) == ("running", 2)
    finally:
        lock.release()
    assert rundir.run_info(run_dir).state == "finished (exit 137)"


def test_tm_runs_counts_each_step_once_over_attempts(tmp_path):
    def start(attempt):
        return records.RunStart(
            run_id="r", name="n", run_dir="/r", command=["x"], cwd="/", tm_version="0", python="3", platform="p",
            attempt=attempt,
        )  # fmt: skip

    logged = [start(1), *(records.Step(step=n) for n in range(1, 171))]  # killed after step 170
    logged += [
        start(2),
        *(records.Step(step=n) for n in range(151, 301)),
    ]  # resumed from the checkpoint of step 150
    logged += [start(3), *(records.Step(step=n) for n in range(301, 311))]  # and once more, from step 300
    write_log(tmp_path, list(enumerate(logged, start=1)))
    # 170 + 150 + 10 step records, of which steps 151..170 were done twice: 310 steps
    assert count_steps(tmp_path) == 310


def live_run(base, stamp, name, command, cwd, *, host=None, checkpoint=None):
    """A run whose launcher still holds its lock (this test holds it), described as ``tm`` describes one."""
    run_dir = make_run(base, stamp, name, checkpoint=checkpoint)
    meta = json.loads((run_dir / "meta.json").read_text())
    meta.update(command=command, cwd=str(cwd), host=host or socket.gethostname())
    (run_dir / "meta.json").write_text(json.dumps(meta))
    lock = rundir.RunLock(run_dir)
    lock.acquire()
    return run_dir, lock


def options(command, runs, **kw):
    return RunOptions(command=command, script_mode=True, runs_dir=str(runs), **kw)


def test_the_same_command_again_beside_its_live_run_is_refused_in_one_line_and_new_run_starts_a_second(
    work, tmp_path, monkeypatch
):
    monkeypatch.delenv(
        "TM_RUNS_DIR", raising=False
    )  # the run is named by its path: tm looks elsewhere by default
    runs = tmp_path / "runs"
    command = ["train.py", "--steps", "200"]
    live, lock = live_run(runs, "20260101T000000Z", "train", command, work)
    said = []
    try:
        with pytest.raises(resume.ResumeError) as raised:
            resume.target_for(options(command, runs), "train", said.append)
        assert str(raised.value) == (
            f"run {live.name} is still running the same command (its launcher holds run.lock): "
            f"watch it with tm view {shlex.quote(str(live))}, or pass --new-run to start a second run"
        )
        assert raised.value.exit_status == 2
        # --new-run: a deliberate second run, said nothing about.
        assert resume.target_for(options(command, runs, new_run=True), "train", said.append) is None
        assert said == []
    finally:
        lock.release()
    # Once it has ended, the same command starts a new run as before.
    assert resume.target_for(options(command, runs), "train", said.append) is None


def test_a_second_start_is_refused_when_it_names_the_live_runs_checkpoints_and_not_for_a_sweep_or_another_host(
    work, tmp_path
):
    runs = tmp_path / "runs"
    saved = work / "ckpt" / "step-50.pt"
    live, lock = live_run(
        runs, "20260101T000000Z", "train", ["train.py", "--lr", "1e-3", "ckpt"], work, checkpoint=saved
    )
    other, other_lock = live_run(runs, "20260102T000000Z", "train", ["train.py"], work, host="another-node")
    try:
        # Another learning rate, the same checkpoint folder: the two would write over each other's checkpoints.
        with pytest.raises(resume.ResumeError) as raised:
            resume.refuse_second_start("train", ["train.py", "--lr", "3e-4", "ckpt"], str(work), str(runs))
        assert str(raised.value).startswith(
            f"run {live.name} is still running and writes its checkpoints to ckpt, which this command names "
        )
        # A sweep's other point (its own checkpoint folder), another name, the same command on another host: no word.
        resume.refuse_second_start("train", ["train.py", "--lr", "3e-4", "other"], str(work), str(runs))
        resume.refuse_second_start("eval", ["train.py", "--lr", "1e-3", "ckpt"], str(work), str(runs))
        assert resume.live_twin("train", ["train.py"], str(work), str(runs)) is None
        # The same command in another folder is another run's business too.
        assert resume.live_twin("train", ["train.py", "--lr", "1e-3", "x"], str(tmp_path), str(runs)) is None
    finally:
        lock.release()
        other_lock.release()


def test_a_secret_the_plugins_hid_in_the_recorded_command_still_counts_as_the_same_command():
    assert resume.same_command(["train.py", "--wandb-secret", "***"], ["train.py", "--wandb-secret", "abc"])
    assert not resume.same_command(["train.py", "--lr", "1"], ["train.py", "--lr", "2"])
    assert not resume.same_command(["train.py"], ["train.py", "--lr", "2"])
    assert not resume.same_command(None, ["train.py"])


def test_the_tasks_of_one_slurm_step_on_one_node_are_no_second_start(work, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    live, lock = live_run(runs, "20260101T000000Z", "train", ["train.py"], work)
    meta = json.loads((live / "meta.json").read_text())
    meta["env"] = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}
    (live / "meta.json").write_text(json.dumps(meta))
    try:
        monkeypatch.setenv("SLURM_JOB_ID", "7")
        monkeypatch.setenv("SLURM_STEP_ID", "0")
        assert resume.live_twin("train", ["train.py"], str(work), str(runs)) is None  # srun's next task
        monkeypatch.setenv("SLURM_STEP_ID", "1")  # a later step of the job, while the first still runs
        assert resume.live_twin("train", ["train.py"], str(work), str(runs)) == (live, "the same command")
    finally:
        lock.release()
