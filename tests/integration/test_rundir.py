"""Run directories: the lock that says a run is live, what `tm runs` shows, finding a run, the socket folders.

Locks are real flocks, held by this process or by a real subprocess killed with SIGKILL.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time

import pytest
from tm_runs import REPO

from trainmeter_core.runlog import rundir
from trainmeter_core.runlog.rundir import RunDirError, RunLock

JAN_1_2024 = 1_704_067_200.0  # 2024-01-01T00:00:00Z


def _run(base, name: str, wall: float):
    path = rundir.create_run_dir(base, name, wall=wall, host="node1.example.org")
    (path / "meta.json").write_text(json.dumps({"start_wall": wall}))
    return path


# --------------------------------------------------------------------------------------------------------------------
# Live or not


def test_is_live_follows_the_lock_in_this_process(tmp_path):
    assert rundir.is_live(tmp_path) is False  # no lock file at all
    lock = RunLock(tmp_path)
    lock.acquire()
    assert rundir.is_live(tmp_path) is True
    assert (tmp_path / "run.lock").read_text() == f"{os.getpid()}\n"
    lock.release()
    assert rundir.is_live(tmp_path) is False


def test_a_second_launcher_cannot_take_a_held_lock(tmp_path):
    first = RunLock(tmp_path)
    first.acquire()
    with pytest.raises(BlockingIOError):
        RunLock(tmp_path).acquire()
    first.release()


def test_a_run_whose_launcher_is_killed_with_sigkill_is_no_longer_live(tmp_path):
    holder = (
        "import sys; from pathlib import Path; from trainmeter_core.runlog.rundir import RunLock\n"
        f"RunLock(Path({str(tmp_path)!r})).acquire(); print('locked', flush=True); sys.stdin.read()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout.readline() == "locked\n"
        assert rundir.is_live(tmp_path) is True
        assert rundir.run_info(tmp_path).state == "running"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        # The kernel dropped the lock with the process: nobody had the chance to clean up, and it does not matter.
        assert rundir.is_live(tmp_path) is False
        assert rundir.run_info(tmp_path).state == "lost"
    finally:
        proc.kill()
        proc.wait()


def test_run_info_says_running_finished_with_the_exit_status_or_lost(tmp_path):
    base = tmp_path / "runs"
    running, finished, lost = (_run(base, n, JAN_1_2024 + i) for i, n in enumerate(["a", "b", "c"]))
    lock = RunLock(running)
    lock.acquire()
    summary = {"state": "finished", "exit_status": 3, "end_wall": JAN_1_2024 + 90, "steps": 12}
    (finished / "summary.json").write_text(json.dumps(summary))
    (lost / "summary.json").write_text("{not json")  # a summary cut short is no summary
    try:
        info = rundir.run_info(running)
        assert (info.state, info.start_wall, info.exit_status) == ("running", JAN_1_2024, None)
        info = rundir.run_info(finished)
        assert (info.state, info.exit_status, info.steps) == ("finished (exit 3)", 3, 12)
        assert (info.start_wall, info.end_wall) == (JAN_1_2024 + 1, JAN_1_2024 + 90)
        info = rundir.run_info(lost)
        assert (info.state, info.name) == ("lost", lost.name)
    finally:
        lock.release()


# --------------------------------------------------------------------------------------------------------------------
# Making and finding runs


def test_a_run_directory_is_named_by_utc_time_host_and_name_and_is_private(tmp_path):
    base = tmp_path / ".trainmeter" / "runs"
    first = rundir.create_run_dir(base, "my run/1", wall=JAN_1_2024, host="node1.example.org")
    second = rundir.create_run_dir(base, "my run/1", wall=JAN_1_2024, host="node1.example.org")
    # Unsafe characters become "-", the host is its short name, a second run in the same second gets "-2".
    assert first.name == "20240101T000000Z-node1-my-run-1"
    assert second.name == "20240101T000000Z-node1-my-run-1-2"
    assert stat.S_IMODE(first.stat().st_mode) == 0o700
    assert (base.parent / ".gitignore").read_text() == "*\n"


def test_a_run_directory_that_cannot_be_made_names_the_flag_that_fixes_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RunDirError) as info:
        rundir.create_run_dir(blocker / "runs", "x")
    message = str(info.value)
    assert "\n" not in message and "--runs-dir" in message and str(blocker / "runs") in message


def test_runs_dir_prefers_the_flag_then_the_environment_then_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {"TM_RUNS_DIR": str(tmp_path / "env")}
    assert rundir.runs_dir(str(tmp_path / "flag"), env) == tmp_path / "flag"
    assert rundir.runs_dir(None, env) == tmp_path / "env"
    assert rundir.runs_dir(None, {}) == tmp_path / ".trainmeter" / "runs"


def test_resolve_run_by_path_name_unique_prefix_short_name_and_latest(tmp_path):
    base = tmp_path / "runs"
    alpha1 = _run(base, "alpha", JAN_1_2024)  # 20240101T000000Z-node1-alpha
    beta = _run(base, "beta", JAN_1_2024 + 60)  # 20240101T000100Z-node1-beta
    alpha2 = _run(base, "alpha", JAN_1_2024 + 120)  # 20240101T000200Z-node1-alpha
    assert rundir.resolve_run(str(beta)) == beta
    assert rundir.resolve_run(alpha1.name, base) == alpha1
    assert rundir.resolve_run("20240101T0001", base) == beta
    assert rundir.resolve_run("beta", base) == beta
    assert rundir.resolve_run(None, base) == alpha2  # the latest
    assert rundir.list_runs(base) == [alpha2, beta, alpha1]


def test_an_ambiguous_or_unknown_run_is_a_one_line_error(tmp_path):
    base = tmp_path / "runs"
    _run(base, "alpha", JAN_1_2024)
    _run(base, "alpha", JAN_1_2024 + 120)
    with pytest.raises(RunDirError) as info:
        rundir.resolve_run("alpha", base)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("'alpha' matches 2 runs (") and message.endswith("give more of the name")
    with pytest.raises(RunDirError, match="no run matches 'gamma'"):
        rundir.resolve_run("gamma", base)
    with pytest.raises(RunDirError, match="no runs under"):
        rundir.resolve_run(None, tmp_path / "empty")


# --------------------------------------------------------------------------------------------------------------------
# Socket folders


def test_stale_socket_folders_are_removed_and_live_ones_kept(short_dir):
    held = rundir.SocketDir.create(short_dir)
    freed = rundir.SocketDir.create(short_dir)
    os.close(freed._lock_fd)  # its launcher died: the kernel released the lock
    old_debris = short_dir / "old"
    old_debris.mkdir()
    two_hours_ago = time.time() - 7200
    os.utime(old_debris, (two_hours_ago, two_hours_ago))
    new_debris = short_dir / "new"  # no lock yet: a folder being made right now
    new_debris.mkdir()
    try:
        # freed (lock free) and old (no lock, 2 h old): 2 removed.
        assert rundir.clean_stale_socket_dirs(short_dir) == 2
        assert sorted(p.name for p in short_dir.iterdir()) == sorted([held.path.name, "new"])
    finally:
        held.remove()


def test_a_tm_cleaning_stale_folders_as_another_makes_its_own_leaves_that_folder_alone(
    short_dir, monkeypatch
):
    # Two runs started at once on one node: the second's clean_stale_socket_dirs runs while the first is between
    # making its folder and holding its lock. It must not take that folder for a dead launcher's and remove it (CI
    # saw the first run then fail on its step pages' folder: "No such file or directory").
    real_flock = fcntl.flock
    cleaned = []

    def flock_after_a_cleaning(fd, operation):
        if not cleaned:  # the first lock taken is create's own: the other tm cleans just before it (once)
            cleaned.append(None)
            cleaned[0] = rundir.clean_stale_socket_dirs(short_dir)
        return real_flock(fd, operation)

    monkeypatch.setattr(rundir.fcntl, "flock", flock_after_a_cleaning)
    folder = rundir.SocketDir.create(short_dir)
    try:
        assert cleaned == [0]
        assert folder.path.is_dir()
        assert sorted(p.name for p in folder.path.iterdir()) == ["lock"]
        monkeypatch.setattr(rundir.fcntl, "flock", real_flock)
        assert rundir.clean_stale_socket_dirs(short_dir) == 0  # held: a live run's
        assert folder.path.is_dir()
        (folder.path / "pages").mkdir()
    finally:
        folder.remove()


def test_socket_paths_stay_under_the_ipc_limit(short_dir, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(short_dir))
    too_long = str(short_dir / ("x" * 120))
    link = short_dir / "link"
    link.symlink_to(short_dir)
    for environ in (
        {"TM_SOCKET_DIR": str(short_dir / "s")},
        {"TM_SOCKET_DIR": too_long},
        {"TM_SOCKET_DIR": str(link)},
    ):
        base = rundir.socket_base(environ)
        folder = rundir.SocketDir.create(base)
        try:
            for name in ("in", "out"):
                path = folder.endpoint(name).removeprefix("ipc://")
                assert len(path.encode()) <= rundir.IPC_PATH_MAX == 107
            assert stat.S_IMODE(base.stat().st_mode) == 0o700
        finally:
            folder.remove()
        # A path too long for an ipc socket, or a symlink someone could swap, falls back to a private tm-<uid>.
        expected = (
            short_dir / "s" if environ["TM_SOCKET_DIR"].endswith("/s") else short_dir / f"tm-{os.getuid()}"
        )
        assert base == expected


def test_the_newest_run_of_a_name_is_found_without_looking_at_every_other_run(tmp_path):
    # A sweep's runs directory holds thousands of runs, and every start looks for the newest run of its name.
    for i in range(50):
        run = tmp_path / f"20260101T0000{i:02d}Z-host-{'train' if i % 2 else 'eval'}"
        run.mkdir()
        (run / "meta.json").write_text("{}")
    (tmp_path / "notes").mkdir()  # not a run: no meta.json, no lock
    looked: list[str] = []

    def named(folder: str) -> bool:
        looked.append(folder)
        return folder.endswith("-train")

    newest = next(rundir.iter_runs(tmp_path, named))
    assert newest.name == "20260101T000049Z-host-train"
    assert looked == ["notes", "20260101T000049Z-host-train"]  # not the 49 older ones
    every = rundir.list_runs(tmp_path)
    assert len(every) == 50 and every == sorted(every, reverse=True) == list(rundir.iter_runs(tmp_path))
