"""Filling the dashboard's state (DashboardState): a live run through the one hand-over (its own parts from the log
up to the first live record, then the bus) with the numbers and the history from the run's engine; a finished run by a replay."""

from __future__ import annotations

import json
import threading
from collections import deque
from pathlib import Path

from trainmeter_core.components.engine import LiveEngine, Saved
from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.model.history_sync import JournaledHistory
from trainmeter_core.runlog.checkpoint import load_checkpoint, save_checkpoint
from trainmeter_web.dashboard_state import DashboardState
from trainmeter_web.follow import Follower, replayed_dashboard

WALL0 = 1_700_000_000.0


def run_records(n_steps: int, first_seq: int = 1) -> list[records.Record]:
    """Steps with a loss, a tick after each, an alert in the middle; seq and times as the hub would stamp them."""
    out: list[records.Record] = []
    for step in range(1, n_steps + 1):
        out.append(records.Step(step=step, tokens_global=100, agent_us=5.0))
        out.append(records.Metric(values={"train_loss": 10.0 / step}, step=step))
        if step == n_steps // 2:
            out.append(records.Alert(rule="throughput_drop", state="fired", message="tokens/s fell"))
        out.append(records.Tick(n=step, interval_s=1.0))
    for i, record in enumerate(out):
        record.seq = first_seq + i
        record.t = 100.0 + i
        record.wall = WALL0 + 100.0 + i
    return out


def as_logged(record: records.Record) -> dict:
    """A record as the recorder writes it: the hub appends ``seq`` last."""
    data = records.to_builtins(record)
    data["seq"] = data.pop("seq")
    return data


def write_log(run_dir: Path, recs: list[records.Record], cut_last: bool = False) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "meta.json").write_text(json.dumps({"run_id": run_dir.name, "name": "t", "command": ["x.py"]}))
    data = b"".join(records.to_log_line(as_logged(r)) for r in recs)
    if cut_last:
        data = data[:-10]
    (run_dir / "events-0001.jsonl").write_bytes(data)


def final_of(recs: list[records.Record]) -> records.Snapshot:
    engine = Engine()
    return [s for r in recs for s in engine.feed(r)][-1]


# --------------------------------------------------------------------------------------------------------------------
# A finished run: replayed here


def test_a_replayed_log_gives_the_same_snapshot_as_feeding_the_engine_directly(tmp_path):
    recs = run_records(20)
    write_log(tmp_path / "run", recs)
    model = replayed_dashboard(tmp_path / "run")  # no checkpoint: the whole log is read
    assert model.snapshot == final_of(recs)
    assert len(model.alerts) == 1
    assert model.overhead_doc()["agent_us_per_step"] == 5.0


def test_after_a_checkpoint_only_the_tail_reaches_the_engine_but_alerts_come_from_the_whole_log(tmp_path):
    recs = run_records(20)
    run_dir = tmp_path / "run"
    write_log(run_dir, recs)
    engine = Engine()
    for record in recs[:30]:
        engine.feed(record)
    save_checkpoint(run_dir, engine, recs[29].seq)
    stats: dict = {}
    model = replayed_dashboard(run_dir, stats)
    assert model.snapshot == final_of(recs)  # resumed from the checkpoint, equal to a full replay
    assert [a["rule"] for a in model.alerts] == ["throughput_drop"]  # the alert is before the checkpoint
    assert model.history("train_loss", "step")[0].x == 1.0  # the history came with the checkpoint
    # 61 records (20 steps × 3, and the alert); the engine decoded the 31 after the checkpoint and nothing before
    assert stats["decoded"] == len(recs) - 30 == 31


# --------------------------------------------------------------------------------------------------------------------
# A live run: the bus, as the hub and the engine component would fill it


class Bus:
    """The records from ``first_live`` on, each followed by what the engine makes of it; the engine, live all along,
    answers a ``history.request`` as the engine component does (a checkpoint, then ``history.sync``)."""

    def __init__(self, run_dir: Path, recs: list[records.Record], first_live: int) -> None:
        self.run_dir = run_dir
        self.live = LiveEngine(Engine(history=JournaledHistory()))
        for record in recs[: first_live - 1]:
            self.live.catch_up(record)  # what the engine saw before the dashboard joined
        self.live.caught_up()
        self.saved = Saved(run_dir, self.live)
        self.upcoming = deque(recs[first_live - 1 :])
        self.queue: deque[records.Record] = deque()
        self.asked: list[str] = []

    def publish(self, record: records.Record) -> None:  # the engine component's ctx.publish
        self.queue.append(record)

    def recv(self, timeout_s: float) -> records.Record | None:
        if not self.queue and self.upcoming:
            record = self.upcoming.popleft()
            self.queue.append(record)
            for out in self.live.feed(record):
                self.queue.append(out)
        return self.queue.popleft() if self.queue else None

    def ask(self, reason: str) -> None:
        self.asked.append(reason)
        self.saved.now(self)  # type: ignore[arg-type]


def follow(run_dir: Path, bus: Bus) -> tuple[DashboardState, Follower]:
    stopping = threading.Event()
    model = DashboardState(run_dir, {})
    follower = Follower(model, bus.recv, stopping, bus.ask)
    assert follower.catch_up()

    def changed():
        if not bus.queue and not bus.upcoming:
            stopping.set()

    follower.run_live(changed)
    return model, follower


def test_catching_up_reads_the_log_until_the_first_live_record_and_counts_nothing_twice(tmp_path):
    recs = run_records(10)
    run_dir = tmp_path / "run"
    write_log(run_dir, recs)  # the recorder already wrote everything; the bus delivers from seq 21 on
    bus = Bus(run_dir, recs, first_live=21)
    model, _ = follow(run_dir, bus)
    assert bus.asked == ["start"]
    assert model.snapshot == final_of(recs)  # the engine's last snapshot, taken from the bus
    # the copy of the history is the engine's, bucket for bucket
    assert model.replica.history.to_state() == bus.live.history.to_state()
    assert [p.value for p in model.history("train_loss", "step")] == [10.0 / s for s in range(1, 11)]
    assert (
        model.overhead_doc()["agent_steps"] == 10
    )  # each step once, though the log and the bus both had some
    assert model.through_seq == recs[-1].seq


def test_a_live_dashboard_counts_the_log_lines_it_could_not_read_while_catching_up(tmp_path):
    recs = run_records(10)
    run_dir = tmp_path / "run"
    write_log(run_dir, recs)
    log = run_dir / "events-0001.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(
        b"".join(lines[:5]) + b"not a record\n" + b"".join(lines[5:])
    )  # before the first live record
    model, _ = follow(run_dir, Bus(run_dir, recs, first_live=21))
    assert model.run_doc()["log_skipped"] == {"lines": 1, "reasons": {"not JSON": 1}}
    assert model.skipped_line() == "skipped 1 unreadable line of the log (1 not JSON)"
    assert model.skipped_line() in model.run_doc()["warnings"]


def test_a_missing_delta_makes_the_dashboard_ask_for_the_whole_history_again(tmp_path):
    recs = run_records(10)
    run_dir = tmp_path / "run"
    write_log(run_dir, recs)
    bus = Bus(run_dir, recs, first_live=4)
    lost: list[int] = []
    recv = bus.recv

    def lossy(timeout_s: float):
        record = recv(timeout_s)
        # The subscriber fell behind once: the engine's fifth delta never reaches the dashboard.
        if isinstance(record, records.HistoryDelta) and record.n == 5 and not lost:
            lost.append(record.n)
            return recv(timeout_s)
        return record

    bus.recv = lossy  # type: ignore[method-assign]
    model, _ = follow(run_dir, bus)
    assert lost == [5] and bus.asked == ["start", "out of step"]
    assert not model.needs_history
    assert model.replica.history.to_state() == bus.live.history.to_state()


def test_a_restarted_engine_is_a_new_incarnation_and_its_whole_history_is_taken(tmp_path):
    recs = run_records(10)
    run_dir = tmp_path / "run"
    write_log(run_dir, recs)
    bus = Bus(run_dir, recs, first_live=4)
    upcoming = bus.upcoming
    later = [upcoming.pop() for _ in range(12)][::-1]  # the last four steps come after the engine's restart
    model = DashboardState(run_dir, {})
    stopping = threading.Event()
    follower = Follower(model, bus.recv, stopping, bus.ask)
    assert follower.catch_up()
    follower.run_live(lambda: not bus.queue and not bus.upcoming and stopping.set())
    first = bus.live.incarnation
    # The engine restarts from its checkpoint: a new incarnation, its delta counter from 1.
    save_checkpoint(run_dir, bus.live.engine, bus.live.through_seq)
    restarted = LiveEngine(*load_checkpoint(run_dir, JournaledHistory))
    assert restarted.incarnation != first
    bus.live, bus.saved = restarted, Saved(run_dir, restarted)
    bus.upcoming.extend(later)
    stopping.clear()
    follower.run_live(lambda: not bus.queue and not bus.upcoming and stopping.set())
    assert bus.asked == ["start", "out of step"]
    assert model.replica.incarnation == restarted.incarnation
    assert model.replica.history.to_state() == restarted.history.to_state()
    assert model.snapshot == final_of(recs)


def test_catching_up_gives_up_when_asked_to_stop_before_anything_came(tmp_path):
    write_log(tmp_path / "run", run_records(2))
    stopping = threading.Event()
    stopping.set()
    model = DashboardState(tmp_path / "run", {})
    assert not Follower(model, lambda timeout_s: None, stopping, lambda reason: None).catch_up()


def test_a_dashboard_of_a_block_log_shows_what_the_log_of_rows_shows_without_building_a_step(tmp_path):
    from blocks import blockify, log_line, training_run

    rows = training_run(200)
    blocked = blockify(rows, at_most=40)
    docs = {}
    for name, log in (("blocks", blocked), ("rows", rows)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "events-0001.jsonl").write_bytes(b"".join(log_line(r) for r in log))
        dashboard = replayed_dashboard(tmp_path / name)
        docs[name] = (dashboard.overhead_doc(), dashboard.snapshot_doc(), dashboard.through_seq)
    assert docs["blocks"] == docs["rows"]
    # The agent's own time of steps 16, 32, ... 192 (3 µs each): 12 steps.
    assert docs["blocks"][0]["agent_steps"] == 12 and docs["blocks"][0]["agent_us_per_step"] == 3.0
    # Fed live, a block whole and its rows one by one leave the same dashboard.
    by_block, by_row = DashboardState(None, {}), DashboardState(None, {})
    for item in blocked:
        by_block.feed(item)
    for row in rows:
        by_row.feed(row)
    assert by_block.overhead_doc() == by_row.overhead_doc() and by_block.through_seq == by_row.through_seq
