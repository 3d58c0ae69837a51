"""Filling the dashboard's model: the engine's checkpoint, the log up to the first live record, then the bus."""

from __future__ import annotations

import json
import threading
from collections import deque
from pathlib import Path

from trainmeter_core import records as rec
from trainmeter_core.engine import Engine
from trainmeter_core.engine_component import save_checkpoint
from trainmeter_web.follow import Follower, log_last_seq, open_run, replay

WALL0 = 1_700_000_000.0


def records(n_steps: int, first_seq: int = 1) -> list[rec.Record]:
    """Steps with a loss, a tick after each, an alert in the middle; seq and times as the hub would stamp them."""
    out: list[rec.Record] = []
    for step in range(1, n_steps + 1):
        out.append(rec.Step(step=step, tokens_global=100, agent_us=5.0))
        out.append(rec.Metric(values={"train_loss": 10.0 / step}, step=step))
        if step == n_steps // 2:
            out.append(rec.Alert(rule="throughput_drop", state="fired", message="tokens/s fell"))
        out.append(rec.Tick(n=step, interval_s=1.0))
    for i, record in enumerate(out):
        record.seq = first_seq + i
        record.t = 100.0 + i
        record.wall = WALL0 + 100.0 + i
    return out


def write_log(run_dir: Path, recs: list[rec.Record], cut_last: bool = False) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "meta.json").write_text(json.dumps({"run_id": run_dir.name, "name": "t", "command": ["x.py"]}))
    data = b"".join(rec.to_log_line(rec.to_builtins(r)) for r in recs)
    if cut_last:
        data = data[:-10]
    (run_dir / "events-0001.jsonl").write_bytes(data)


def test_a_replayed_log_gives_the_same_snapshot_as_feeding_the_engine_directly(tmp_path):
    recs = records(20)
    write_log(tmp_path / "run", recs)
    model, through = open_run(tmp_path / "run")
    assert through == 0  # no checkpoint: the whole log is read
    assert replay(model, tmp_path / "run") == recs[-1].seq
    engine = Engine()
    expected = [s for r in recs for s in engine.feed(r)][-1]
    assert model.snapshot == expected
    assert len(model.alerts) == 1
    assert model.overhead_doc()["agent_us_per_step"] == 5.0


def test_after_a_checkpoint_only_the_tail_reaches_the_engine_but_alerts_come_from_the_whole_log(tmp_path):
    recs = records(20)
    run_dir = tmp_path / "run"
    write_log(run_dir, recs)
    engine = Engine()
    for record in recs[:30]:
        engine.feed(record)
    save_checkpoint(run_dir, engine, recs[29].seq)
    model, through = open_run(run_dir)
    assert through == recs[29].seq
    replay(model, run_dir, through)
    full = Engine()
    expected = [s for r in recs for s in full.feed(r)][-1]
    assert model.snapshot == expected  # resumed from the checkpoint, equal to a full replay
    assert [a["rule"] for a in model.alerts] == ["throughput_drop"]  # the alert is before the checkpoint
    assert model.history("train_loss", "step")[0].x == 1.0  # the history came with the checkpoint


def test_replay_stops_before_the_first_live_record(tmp_path):
    recs = records(5)
    write_log(tmp_path / "run", recs)
    model, _ = open_run(tmp_path / "run")
    assert replay(model, tmp_path / "run", before_seq=recs[4].seq) == recs[3].seq
    assert model.through_seq == recs[3].seq


def test_the_last_sequence_number_is_read_from_the_tail_and_a_cut_line_is_skipped(tmp_path):
    recs = records(5)
    write_log(tmp_path / "whole", recs)
    write_log(tmp_path / "cut", recs, cut_last=True)
    assert log_last_seq(tmp_path / "whole") == recs[-1].seq
    assert log_last_seq(tmp_path / "cut") == recs[-2].seq


def test_an_empty_run_directory_has_no_last_sequence_number(tmp_path):
    assert log_last_seq(tmp_path) is None


def test_catching_up_reads_the_log_until_the_first_live_record_and_counts_nothing_twice(tmp_path):
    recs = records(10)
    run_dir = tmp_path / "run"
    write_log(run_dir, recs)
    live = deque(recs[20:])  # the bus delivers from seq 21 on; the log already holds everything
    stopping = threading.Event()

    def recv(timeout_s: float):
        return live.popleft() if live else None

    model, through = open_run(run_dir)
    follower = Follower(model, recv, stopping, through)
    assert follower.catch_up()
    changes = []

    def changed():
        changes.append(model.version)
        if not live:
            stopping.set()

    follower.run_live(changed)
    engine = Engine()
    expected = [s for r in recs for s in engine.feed(r)][-1]
    assert model.snapshot == expected
    assert (
        model.overhead_doc()["agent_steps"] == 10
    )  # each step once, though the log and the bus both had some
    assert model.through_seq == recs[-1].seq


def test_catching_up_gives_up_when_asked_to_stop_before_anything_came(tmp_path):
    write_log(tmp_path / "run", records(2))
    stopping = threading.Event()
    stopping.set()
    model, _ = open_run(tmp_path / "run")
    assert not Follower(model, lambda timeout_s: None, stopping).catch_up()


def test_the_engine_components_snapshots_on_the_bus_do_not_mark_the_hand_over(tmp_path):
    recs = records(3)
    write_log(tmp_path / "run", recs)
    snapshot = rec.Snapshot(tick=1, seq=recs[2].seq)
    live = deque([snapshot, *recs[5:]])
    model, _ = open_run(tmp_path / "run")
    follower = Follower(model, lambda timeout_s: live.popleft() if live else None, threading.Event())
    assert follower.catch_up()
    # the hand-over is at the first record that is not a snapshot (seq 6): the log gave seq 1..5, the bus seq 6
    assert recs[5].seq == 6
    assert model.through_seq == 6
    assert model.overhead_doc()["agent_steps"] == 2  # steps at seq 1 and 5, each once
