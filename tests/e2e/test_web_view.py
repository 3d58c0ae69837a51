"""``tm view``: a run's final snapshot as JSON, or its dashboard rebuilt from the log."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import urllib.request
from pathlib import Path

import msgspec
import pytest
from deadline import wait_for
from tm_runs import TM, log_records, only_run

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_web import view

WALL0 = 1_700_000_000.0


def write_run(run_dir: Path, steps: int, ended: bool) -> list[records.Record]:
    recs: list[records.Record] = []
    for step in range(1, steps + 1):
        recs += [
            records.Step(step=step, tokens_global=100),
            records.Metric(values={"loss": 1.0 / step}, step=step),
        ]
        recs.append(records.Tick(n=step, interval_s=1.0))
    if ended:
        recs.append(records.RunEnd(status=0, reason="exited", exit_code=0, elapsed_s=float(steps)))
    for i, record in enumerate(recs, start=1):
        record.seq, record.t, record.wall = i, float(i), WALL0 + i
    run_dir.mkdir(parents=True)
    (run_dir / "meta.json").write_text(
        json.dumps({"run_id": run_dir.name, "name": "demo", "command": ["demo.py"]})
    )
    (run_dir / "events-0001.jsonl").write_bytes(
        b"".join(records.to_log_line(records.to_builtins(r)) for r in recs)
    )
    return recs


def test_json_prints_the_final_snapshot_of_a_replay(tmp_path, capsys):
    run_dir = tmp_path / "runs" / "20260101T000000Z-host-demo"
    recs = write_run(run_dir, 4, ended=True)
    assert view.main(["--json", str(run_dir)]) == 0
    printed = json.loads(capsys.readouterr().out)
    engine = Engine()
    expected = [s for r in recs for s in engine.feed(r)][-1]
    assert printed == json.loads(msgspec.json.encode(records.to_builtins(expected)))
    assert printed["final"] is True and printed["state"] == "finished"


def test_an_unknown_run_is_one_line_and_status_2(tmp_path, capsys):
    assert view.main(["--runs-dir", str(tmp_path), "nothing-like-this"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tm: ") and err.count("\n") == 1


def serve_in_thread(run_dir: Path, capsys) -> tuple[int, threading.Event, threading.Thread]:
    stopping = threading.Event()
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(view.serve(run_dir, "127.0.0.1", 0, stopping)))
    thread.start()
    seen: list[str] = []

    def url():
        seen.append(capsys.readouterr().err)
        return re.search(r"dashboard http://localhost:(\d+)/", "".join(seen))

    port = int(wait_for(url, what="the dashboard's start line").group(1))
    return port, stopping, thread


def get_json(port: int, path: str) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Host": f"localhost:{port}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_a_finished_run_is_served_from_its_log_with_its_exit_status(tmp_path, capsys):
    run_dir = tmp_path / "runs" / "20260101T000000Z-host-demo"
    write_run(run_dir, 5, ended=True)
    port, stopping, thread = serve_in_thread(run_dir, capsys)
    try:
        run = get_json(port, "/api/run")
        assert run["status"]["state"] == "finished" and run["status"]["exit_status"] == 0
        history = get_json(port, "/api/history?series=train_loss&x=step")["series"]["train_loss"]
        assert [p[0] for p in history] == [1.0, 2.0, 3.0, 4.0, 5.0]
    finally:
        stopping.set()
        thread.join(10)
    assert not thread.is_alive()


def test_a_run_that_never_ended_and_holds_no_lock_is_lost(tmp_path, capsys):
    run_dir = tmp_path / "runs" / "20260101T000000Z-host-demo"
    write_run(run_dir, 3, ended=False)
    port, stopping, thread = serve_in_thread(run_dir, capsys)
    try:
        assert get_json(port, "/api/run")["status"] == {"state": "lost"}
        assert get_json(port, "/api/snapshot")["steps"] == 3
    finally:
        stopping.set()
        thread.join(10)


def damage(run_dir: Path) -> None:
    """One line that is not JSON among the records, and a last line cut short (a kill mid-write)."""
    log = run_dir / "events-0001.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:3]) + b"not a record\n" + b"".join(lines[3:]) + b'{"kind":"step","st')


SKIPPED = "skipped 2 unreadable lines of the log (1 not JSON, 1 truncated last line)"


def test_the_dashboard_server_says_which_log_lines_it_skipped_on_stderr_and_in_the_page(tmp_path, capsys):
    run_dir = tmp_path / "runs" / "20260101T000000Z-host-demo"
    write_run(run_dir, 5, ended=True)
    damage(run_dir)
    stopping = threading.Event()
    thread = threading.Thread(target=view.serve, args=(run_dir, "127.0.0.1", 0, stopping))
    thread.start()
    seen: list[str] = []
    try:
        wait_for(
            lambda: seen.append(capsys.readouterr().err) or "viewing" in "".join(seen), what="tm view's start"
        )
        said = "".join(seen)
        assert f"tm: {SKIPPED}\n" in said, said
        port = int(re.search(r"dashboard http://localhost:(\d+)/", said).group(1))
        run = get_json(port, "/api/run")
        assert run["log_skipped"] == {"lines": 2, "reasons": {"not JSON": 1, "truncated last line": 1}}
        assert SKIPPED in run["warnings"]
        assert get_json(port, "/api/snapshot")["steps"] == 5  # the readable lines all count
    finally:
        stopping.set()
        thread.join(10)


def test_tm_passport_says_which_log_lines_it_skipped_as_tm_view_json_does(tmp_path, capsys):
    from trainmeter_core.commands import cli

    run_dir = tmp_path / "runs" / "20260101T000000Z-host-demo"
    write_run(run_dir, 5, ended=True)
    damage(run_dir)
    assert cli.main(["passport", str(run_dir)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("# Run passport") and captured.err == f"tm: {SKIPPED}\n"
    assert view.main(["--json", str(run_dir)]) == 0
    assert capsys.readouterr().err == f"tm: {SKIPPED}\n"  # the same line


LOOP = """
import os, sys, time
from trainmeter_agent import emit
step = 0
while not os.path.exists(sys.argv[1]):
    step += 1
    emit(step=step, tokens=2048, train_loss=4.0 / step)
    time.sleep(0.05)
"""


@pytest.mark.heavy
@pytest.mark.xdist_group("heavy")
def test_a_live_run_is_followed_with_the_engines_numbers_and_no_engine_of_its_own(
    tm_env, tmp_path, capsys, monkeypatch
):
    from trainmeter_web.follow import replayed_dashboard

    script, stop = tmp_path / "loop.py", tmp_path / "stop"
    script.write_text(LOOP)
    proc = subprocess.Popen([TM, "--no-web", str(script), str(stop)], env=tm_env, stderr=subprocess.DEVNULL)
    made = []
    init = Engine.__init__
    monkeypatch.setattr(Engine, "__init__", lambda self, *a, **kw: made.append(1) or init(self, *a, **kw))
    try:
        runs = tmp_path / "runs"
        run_dir = wait_for(lambda: runs.exists() and any(runs.iterdir()) and only_run(runs), what="the run")
        wait_for(
            lambda: any(r["kind"] == "tick" for r in log_records(run_dir, live=True)), what="the first tick"
        )
        port, stopping, thread = serve_in_thread(run_dir, capsys)
        try:
            snapshot = wait_for(
                lambda: (s := get_json(port, "/api/snapshot")).get("steps") and s, what="a snapshot"
            )
            assert snapshot["source"] == "engine"  # the run's engine made it
            stop.touch()
            assert proc.wait(120) == 0
            wait_for(
                lambda: get_json(port, "/api/run")["status"]["state"] == "finished", what="the run's end"
            )
            assert made == []  # following a live run built no engine here

            def served_history():
                return get_json(port, "/api/history?series=train_loss&x=step")["series"]["train_loss"]

            replayed = replayed_dashboard(run_dir).history("train_loss", "step")
            expected = json.loads(msgspec.json.encode(replayed))
            # The engine's last delta follows its final snapshot: wait for it, then the copy is the replay's history.
            wait_for(lambda: served_history() == expected, what="the history to equal the replay's")
            assert len(expected) == sum(1 for r in log_records(run_dir) if r["kind"] == "metric")
        finally:
            stopping.set()
            thread.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
