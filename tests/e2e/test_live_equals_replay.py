"""Live equals replay: every snapshot a real run published is reproduced, field for field, by replaying its log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import msgspec
import pytest
from deadline import wait_for
from tm_runs import REPO, TM, log_records, only_run

from trainmeter_core.model import records
from trainmeter_core.runlog import replay

HEADER = set(records.Record.__struct_fields__) - {
    "t",
    "wall",
}  # who sent it and when it went differ; the numbers must not
CAPTURE = str(REPO / "tests" / "scripts" / "capture_snapshots.py")
GPT = str(REPO / "examples" / "tiny_gpt.py")


def body(snapshot: dict) -> dict:
    return {k: v for k, v in snapshot.items() if k not in HEADER}


def replayed_by_seq(run_dir) -> dict[int, dict]:
    encoder = msgspec.json.Encoder()
    out = {}
    for snapshot in replay.snapshots(run_dir):
        # Through the same JSON encoding as the live capture, so both sides compare alike (NaN -> null on both).
        out[snapshot.through_seq] = json.loads(encoder.encode(records.to_builtins(snapshot)))
    return out


def start_run(tm_env, tmp_path, extra_env=None, steps=60):
    env = dict(tm_env, TM_DISABLE_COMPONENTS="web", TM_HOST_INTERVAL_S="0.3", **(extra_env or {}))
    args = [
        TM,
        "--budget-tokens",
        "200k",
        "--tokens-per-step",
        "1024",
        GPT,
        "--steps",
        str(steps),
        "--sleep",
        "0.05",
    ]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    runs = tmp_path / "runs"
    run = wait_for(lambda: runs.exists() and any(runs.iterdir()) and only_run(runs), what="the run directory")
    wait_for(lambda: (run / "endpoints.json").exists() and (run / "meta.json").exists(), what="the endpoints")
    return proc, run, env


def capture(run, tmp_path, env):
    out = tmp_path / "live.jsonl"
    sub = subprocess.Popen([sys.executable, CAPTURE, str(run), str(out)], env=env)
    wait_for(lambda: out.exists() and out.read_text().startswith("ready"), what="the subscriber")
    return sub, out


def live_snapshots(out) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()[1:]]


@pytest.mark.xdist_group("heavy")
def test_every_live_snapshot_equals_the_replay_of_the_log(tm_env, tmp_path):
    proc, run, env = start_run(tm_env, tmp_path)
    sub, out = capture(run, tmp_path, env)
    assert proc.wait(120) == 0, proc.stderr.read()
    assert sub.wait(30) == 0
    live = live_snapshots(out)
    assert len(live) >= 3 and live[-1]["final"] is True
    replayed = replayed_by_seq(run)
    for snapshot in live:
        assert body(snapshot) == body(replayed[snapshot["through_seq"]]), f"tick {snapshot['tick']} differs"
    summary = json.loads((run / "summary.json").read_text())
    assert body(summary["snapshot"]) == body(replayed[live[-1]["through_seq"]])


@pytest.mark.xdist_group("heavy")
def test_after_kill_9_of_the_engine_its_next_snapshot_equals_the_replay(tm_env, tmp_path):
    proc, run, env = start_run(tm_env, tmp_path, {"TM_OWN_PROCESS": "engine"}, steps=90)
    sub, out = capture(run, tmp_path, env)
    wait_for(lambda: len(live_snapshots(out)) >= 2, what="two live snapshots")
    (pid,) = {
        r["child_pid"] for r in log_records(run) if r["kind"] == "component" and r["process"] == "engine"
    }
    os.kill(pid, signal.SIGKILL)

    def restarted():
        recs = log_records(run)
        again = [
            r
            for r in recs
            if r["kind"] == "component" and r["process"] == "engine" and r["event"] == "restarted"
        ]
        return again[0]["seq"] if again else None

    restart_seq = wait_for(restarted, what="the engine's restart")
    assert proc.wait(120) == 0, proc.stderr.read()
    assert sub.wait(30) == 0
    after = [s for s in live_snapshots(out) if s["through_seq"] > restart_seq]
    assert after, "no snapshot after the restart"
    replayed = replayed_by_seq(run)
    for snapshot in after:
        assert body(snapshot) == body(replayed[snapshot["through_seq"]]), f"tick {snapshot['tick']} differs"
