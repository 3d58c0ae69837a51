"""A sink gets every alert of the run once, in order: those logged before it subscribed come from the log (a
component starts after the training, late on a busy machine), then the bus's. Not an earlier attempt's, nor what it had
before tm restarted it after a crash."""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path

from trainmeter_core.api import alerts_until_stopped
from trainmeter_core.bus import component
from trainmeter_core.model import records


def logged(record: records.Record, seq: int) -> bytes:
    data = records.to_builtins(record)
    data.pop("seq", None)
    data["seq"] = seq  # the hub appends seq last
    return records.to_log_line(data)


def alert(n: int, state: str = "fired") -> records.Alert:
    return records.Alert(rule=f"rule{n}", state=state, message=f"alert {n}")  # type: ignore[arg-type]


def run_start(attempt: int) -> records.RunStart:
    return records.RunStart(
        run_id="r",
        name="r",
        run_dir="r",
        command=["python", "train.py"],
        cwd="/",
        tm_version="0",
        python="3",
        platform="linux",
        attempt=attempt,
    )


class Log:
    """A run log the test appends to, numbered as the hub numbers: one seq per record."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "events-0001.jsonl"
        self.seq = 0

    def add(self, *items: records.Record) -> list[int]:
        seqs = []
        with open(self.path, "ab") as f:
            for record in items:
                self.seq += 1
                f.write(logged(record, self.seq))
                seqs.append(self.seq)
        return seqs


class Ctx:
    """What alerts_until_stopped reads of a ComponentContext; ``recv`` gives the scripted live records, then None."""

    def __init__(self, run_dir: Path, live, name: str = "ledger") -> None:
        self.name = name
        self.run_dir = run_dir
        self.stopping = threading.Event()
        self.live = deque(live)

    def recv(self, timeout_s: float):
        if not self.live:
            self.stopping.set()
            return None
        item = self.live.popleft()
        return item() if callable(item) else item


def live(record: records.Record, seq: int) -> records.Record:
    record.seq = seq
    return record


def got(ctx: Ctx) -> list[tuple[int, str]]:
    return [(a.seq, a.rule) for a in alerts_until_stopped(ctx)]


def test_alerts_logged_before_the_sink_subscribed_come_first_and_none_twice(tmp_path):
    log = Log(tmp_path)
    log.add(run_start(1), records.Step(step=1), alert(1), records.Step(step=2), alert(2))
    # The bus delivers alert 2 too (the subscription came first), then alert 3.
    ctx = Ctx(tmp_path, [live(alert(2), 5), live(records.Step(step=3), 6), live(alert(3), 7)])
    log.add(records.Step(step=3), alert(3))
    assert got(ctx) == [(3, "rule1"), (5, "rule2"), (7, "rule3")]


def test_alerts_raised_between_the_log_read_and_the_subscription_come_before_the_first_live_one(tmp_path):
    log = Log(tmp_path)
    log.add(run_start(1), alert(1))

    def later():
        # Published after the sink read the log and before its subscription took effect: only the log has it.
        log.add(records.Step(step=1), alert(2), records.Step(step=2), alert(3))
        return live(alert(3), 6)

    ctx = Ctx(tmp_path, [None, later, live(alert(4), 7)])
    assert got(ctx) == [(2, "rule1"), (4, "rule2"), (6, "rule3"), (7, "rule4")]


def test_with_no_live_alert_the_missed_ones_come_at_the_stop(tmp_path):
    log = Log(tmp_path)
    log.add(run_start(1), alert(1))

    def later():
        log.add(alert(2))
        return live(records.Step(step=1), 4)

    ctx = Ctx(tmp_path, [later])
    assert got(ctx) == [(2, "rule1"), (3, "rule2")]


def test_a_resumed_run_repeats_no_alert_of_its_earlier_attempt(tmp_path):
    log = Log(tmp_path)
    end = records.RunEnd(status=143, reason="signaled", signal=15, elapsed_s=3.0)
    # The first attempt's alerts, one of them from its final snapshot (after run.end), then the second attempt's.
    log.add(run_start(1), alert(1), end, alert(2), run_start(2), alert(3))
    ctx = Ctx(tmp_path, [live(alert(4), 7)])
    log.add(alert(4))
    assert got(ctx) == [(6, "rule3"), (7, "rule4")]


def test_a_restarted_sink_takes_up_after_its_crash_and_another_components_crash_changes_nothing(tmp_path):
    log = Log(tmp_path)
    crashed = records.Component(name="ledger", event="crashed", process="ledger", signal=9)
    other = records.Component(name="webhook", event="crashed", process="webhook", signal=9)
    restarted = records.Component(name="ledger", event="restarted", process="ledger", restarts=1)
    log.add(run_start(1), alert(1), crashed, alert(2), other, restarted, alert(3))
    assert got(Ctx(tmp_path, [])) == [(4, "rule2"), (7, "rule3")]
    assert got(Ctx(tmp_path, [], name="webhook")) == [(7, "rule3")]
    assert got(Ctx(tmp_path, [], name="journal")) == [(2, "rule1"), (4, "rule2"), (7, "rule3")]


def test_on_a_job_hub_another_nodes_start_and_crash_change_nothing(tmp_path):
    log = Log(tmp_path)
    mine = run_start(1)
    mine.host = "node0"
    theirs = run_start(1)
    theirs.host = "node1"
    crashed = records.Component(name="ledger", event="crashed", process="ledger", signal=9, host="node1")
    log.add(mine, alert(1), theirs, crashed, alert(2))
    ctx = Ctx(tmp_path, [])
    ctx.meta = {"host": "node0"}
    assert got(ctx) == [(2, "rule1"), (5, "rule2")]


class ListeningCtx(Ctx):
    """A context that can receive one more kind, as ComponentContext can: the ticks a sink asks for while it has no
    live alert to tell where its subscription took effect."""

    def __init__(self, run_dir: Path, live, name: str = "ledger") -> None:
        super().__init__(run_dir, live, name)
        self.listening: list[str] = []
        self.asked: list[tuple[str, str]] = []

    def listen_for(self, kind: str) -> bool:
        self.asked.append(("listen", kind))
        self.listening.append(kind)
        return True

    def stop_listening(self, kind: str) -> None:
        self.asked.append(("stop", kind))
        self.listening.remove(kind)


def tick(n: int) -> records.Tick:
    return records.Tick(n=n, interval_s=1.0)


def test_the_first_tick_fills_in_the_missed_alerts_then_and_the_stop_reads_no_log(tmp_path, monkeypatch):
    log = Log(tmp_path)
    log.add(run_start(1), alert(1))

    def first_tick():
        # Published after the sink read the log and before its subscription took effect: only the log has alert 2.
        log.add(records.Step(step=1), alert(2), tick(1))
        return live(tick(1), 5)

    def after():
        # Logged after the point the tick marks but never received (a gap on the bus): not read from the log again.
        log.add(alert(3), tick(2))
        return live(tick(2), 7)

    ctx = ListeningCtx(tmp_path, [first_tick, after, live(alert(4), 8)])
    log_reads = []
    original = component._logged_alerts

    def counted(*args, **kwargs):
        log_reads.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(component, "_logged_alerts", counted)
    assert got(ctx) == [(2, "rule1"), (4, "rule2"), (8, "rule4")]
    assert ctx.asked == [("listen", "tick"), ("stop", "tick")]
    assert log_reads == [
        {},
        {"after_seq": 2, "before_seq": 5},
    ]  # the first read, the missed ones; none at the stop


def test_a_live_alert_before_any_tick_stops_the_ticks_too(tmp_path):
    log = Log(tmp_path)
    log.add(run_start(1))

    def logged_and_live(record: records.Record):
        def item():
            (seq,) = log.add(record)
            return live(record, seq)

        return item

    ctx = ListeningCtx(
        tmp_path, [logged_and_live(alert(1)), logged_and_live(tick(1)), logged_and_live(alert(2))]
    )
    assert got(ctx) == [(2, "rule1"), (4, "rule2")]
    assert ctx.asked == [("listen", "tick"), ("stop", "tick")] and ctx.listening == []
