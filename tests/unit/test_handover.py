"""The one hand-over from log to bus: the log up to the first record received live, then the bus; the wait for the
recorder reads only the log's tail; derived kinds never mark the hand-over."""

from __future__ import annotations

import threading
from collections import deque

from trainmeter_core.model import records
from trainmeter_core.runlog.handover import HandOver, log_has_ended


def numbered(got: list[records.Record], first_seq: int = 1) -> list[records.Record]:
    for i, record in enumerate(got):
        record.seq = first_seq + i
    return got


def logged(record: records.Record) -> bytes:
    data = records.to_builtins(record)
    data["seq"] = data.pop("seq")  # the hub appends seq last
    return records.to_log_line(data)


def write(run_dir, got: list[records.Record]) -> None:
    (run_dir / "events-0001.jsonl").write_bytes(b"".join(logged(r) for r in got))


def steps(n: int, first_seq: int = 1) -> list[records.Record]:
    return numbered([records.Step(step=i) for i in range(first_seq, first_seq + n)], first_seq)


def test_the_log_gives_the_records_after_the_checkpoint_and_before_the_first_live_one(tmp_path):
    log = steps(10)
    write(tmp_path, log)
    live = deque(steps(4, first_seq=7))  # the bus delivers from seq 7 on
    handover = HandOver(tmp_path, lambda timeout_s: live.popleft() if live else None, threading.Event())
    assert handover.wait_first_live() and handover.first_live == 7
    assert handover.wait_for_log()
    assert [r.seq for r in handover.from_log(after_seq=2)] == [3, 4, 5, 6]
    after = []
    while (record := handover.next(0.0)) is not None:
        after.append(record.seq)
    assert after == [7, 8, 9, 10]  # each record once: the log's up to 6, the bus's from 7


def test_derived_records_never_mark_the_hand_over_and_are_kept_for_the_reader(tmp_path):
    write(tmp_path, steps(5))
    snapshot = records.Snapshot(tick=1, seq=4)
    delta = records.HistoryDelta(incarnation="a", n=1, seq=5)
    request = records.HistoryRequest(reason="start", seq=6)
    live = deque([snapshot, delta, request, *steps(2, first_seq=7)])
    handover = HandOver(tmp_path, lambda timeout_s: live.popleft() if live else None, threading.Event())
    assert handover.wait_first_live()
    assert handover.first_live == 7  # not the snapshot's 4, the delta's 5 or the request's 6
    assert [r.seq for r in handover.from_log()] == [1, 2, 3, 4, 5]
    kept = [records.kind_of(handover.next(0.0)) for _ in range(4)]
    assert kept == ["snapshot", "history", "history.request", "step"]


def test_the_wait_for_the_recorder_ends_when_the_log_reaches_the_record_before_the_first_live_one(tmp_path):
    write(tmp_path, steps(3))  # the recorder has written up to seq 3; the bus already delivered seq 6
    live = deque(steps(1, first_seq=6))
    stopping = threading.Event()
    handover = HandOver(tmp_path, lambda timeout_s: live.popleft() if live else None, stopping, wait_s=0.3)
    assert handover.wait_first_live()
    assert not handover.wait_for_log()  # seq 4 and 5 never came: given up after wait_s, not forever
    write(tmp_path, steps(5))
    assert handover.wait_for_log()


def test_a_bus_stats_that_says_the_recorder_flushed_ends_the_wait(tmp_path):
    # Below the free-space reserve the recorder leaves ticks out: the log never shows seq 5, the hub's counters do.
    write(tmp_path, steps(3))
    stats = records.BusStats(received=7, published=7, malformed=0, unknown=0, flushed_seq=6, seq=7)
    live = deque([*numbered([records.Tick(n=1, interval_s=1.0)], 6), stats])
    handover = HandOver(
        tmp_path, lambda timeout_s: live.popleft() if live else None, threading.Event(), wait_s=30
    )
    assert handover.wait_first_live() and handover.first_live == 6
    assert handover.wait_for_log()


def test_the_wait_for_a_first_live_record_can_end_when_the_run_already_ended(tmp_path):
    end = numbered([records.RunEnd(status=0, reason="exited", elapsed_s=1.0)], 4)
    write(tmp_path, steps(3) + end)
    assert log_has_ended(tmp_path)
    handover = HandOver(tmp_path, lambda timeout_s: None, threading.Event())
    assert not handover.wait_first_live(idle=lambda: log_has_ended(tmp_path))


def test_a_run_still_going_has_not_ended(tmp_path):
    write(tmp_path, steps(3))
    assert not log_has_ended(tmp_path)
