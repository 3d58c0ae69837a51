"""tm's threads sleep until there is something to do (issue 42): none wakes on a short timer to look.

A wake costs a thread 100 to 250 µs of CPU on a virtual machine whatever it then does, and an idle run made 184 of
them a second (docs/performance.md, "Fewer, larger windows, and threads that sleep"). Each test here fails on the
timers they replaced: a component's wait for records that looked at its stop every 0.1 s, a recorder's writer that
looked at its queue every 10 ms.
"""

from __future__ import annotations

import json
import select
import threading
import time

from trainmeter_core.bus.client import Producer, Subscriber, poll_ms
from trainmeter_core.bus.component import STOP_CHECK_S, ComponentContext, Stopping, alerts_until_stopped
from trainmeter_core.bus.hub import Hub
from trainmeter_core.components.engine import EngineComponent
from trainmeter_core.model import records
from trainmeter_core.runlog.reader import read_log
from trainmeter_core.runlog.recorder import Recorder


def _wakes(thread: threading.Thread) -> int:
    """The voluntary context switches of a live thread so far: one for each time it slept and woke."""
    with open(f"/proc/self/task/{thread.native_id}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def _sleeps_then_stops(thread: threading.Thread, stopping: threading.Event) -> None:
    """``thread``, waiting for a record that does not come, wakes at most once in 3 s, and ends within 10 s of the
    stop."""
    before = _wakes(thread)
    time.sleep(3.0)
    during = _wakes(thread) - before
    assert during <= 1, f"{during} wakes in 3 s with no record"
    stopping.set()
    started = time.monotonic()
    thread.join(30.0)
    assert not thread.is_alive() and time.monotonic() - started < 10.0


def _set_later(event: threading.Event, after_s: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(after_s), event.set()), daemon=True)
    thread.start()
    return thread


def test_stopping_leaves_its_pipe_readable_once_set_and_from_then_on():
    stopping = Stopping()
    poller = select.poll()
    poller.register(stopping.fileno(), select.POLLIN)
    assert poller.poll(0) == []
    stopping.set()
    stopping.set()  # a second set writes nothing more, and changes nothing
    assert stopping.is_set()
    for _ in range(3):
        assert poller.poll(0) == [(stopping.fileno(), select.POLLIN)]


def test_a_subscriber_waiting_with_a_wake_fd_returns_when_the_fd_is_readable(tmp_path):
    stopping = Stopping()
    subscriber = Subscriber(f"ipc://{tmp_path}/nobody-publishes", None)
    try:
        _set_later(stopping, 0.2)
        started = time.monotonic()
        assert subscriber.recv(60.0, wake_fd=stopping.fileno()) is None
        # woken by the pipe, long before its timeout (no publisher: nothing else could end the wait)
        assert time.monotonic() - started < 30.0
    finally:
        subscriber.close()


def _context(
    tmp_path, stopping: threading.Event, name: str = "test", kinds: tuple[str, ...] = ("tick",)
) -> ComponentContext:
    (tmp_path / "endpoints.json").write_text(
        json.dumps({"in": f"ipc://{tmp_path}/in", "out": f"ipc://{tmp_path}/out"})
    )
    (tmp_path / "meta.json").write_text("{}")
    return ComponentContext(name, tmp_path, stopping, kinds)


def test_a_component_waiting_for_records_sleeps_through_its_timeout_and_wakes_at_the_stop(tmp_path):
    # With the process's Stopping, recv(timeout) sleeps in one poll (the stop's pipe beside the bus), where it looked
    # at the event every STOP_CHECK_S before: at least 10 wakes in a second's wait, at most 2 now.
    stopping = Stopping()
    ctx = _context(tmp_path, stopping)
    try:
        waited: dict[str, float] = {}

        def wait() -> None:
            started = time.monotonic()
            assert ctx.recv(60.0) is None
            waited["s"] = time.monotonic() - started

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)  # the waiter is in its poll
        before = _wakes(waiter)
        time.sleep(1.5)
        during = _wakes(waiter) - before
        assert during <= 2, f"{during} wakes in 1.5 s of waiting"
        stopping.set()
        waiter.join(30.0)
        assert not waiter.is_alive() and waited["s"] < 30.0  # the stop ended the wait, not its 60 s
        # Once stopping, a wait is STOP_CHECK_S at most (the pipe stays readable: it no longer listens to it)
        started = time.monotonic()
        assert ctx.recv(60.0) is None
        assert STOP_CHECK_S * 0.5 <= time.monotonic() - started < 30.0
    finally:
        ctx.close()


def test_an_alert_sink_sleeps_while_no_alert_comes_and_ends_soon_after_the_stop(tmp_path):
    # alerts_until_stopped waited a second at a time (a wake a second in every sink: the terminal's, the alerts
    # file's, a webhook's); the stop's pipe ends its wait, so it now waits for as long as no record comes.
    stopping = Stopping()
    ctx = _context(tmp_path, stopping, "sink", ("alert",))
    try:
        got: list = []
        sink = threading.Thread(target=lambda: got.extend(alerts_until_stopped(ctx)))
        sink.start()
        time.sleep(0.5)  # past the log's first read, in its wait
        _sleeps_then_stops(sink, stopping)
        assert got == []
    finally:
        ctx.close()


def test_the_engine_sleeps_while_no_record_comes_and_ends_soon_after_the_stop(tmp_path):
    # The engine's loop looked every 0.5 s for a checkpoint due every 300 s: two wakes a second of an idle run, a third
    # of the engine's. It now waits until the checkpoint is due, the stop's pipe ending the wait.
    recorder = Recorder(tmp_path)
    hub = Hub(f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out", recorder, tick_s=3600.0, stats_every_s=3600.0)
    recorder.start()
    hub.start()
    stopping = Stopping()
    ctx = _context(tmp_path, stopping, "engine", EngineComponent.subscribes)
    producer = Producer(f"ipc://{tmp_path}/in", "test")
    listener = Subscriber(f"ipc://{tmp_path}/out", {"snapshot"})
    engine = threading.Thread(target=EngineComponent().run, args=(ctx,))
    try:
        engine.start()
        # Ticks until the engine's snapshot of one is heard: it is then past its catch-up, in its live loop.
        n, heard = 0, None
        deadline = time.monotonic() + 60.0
        while heard is None and time.monotonic() < deadline:
            n += 1
            producer.send(records.Tick(n=n, interval_s=1.0, child_alive=True))
            heard = listener.recv(0.2)
        assert isinstance(heard, records.Snapshot), "no snapshot from the engine within 60 s"
        time.sleep(0.5)  # the last tick's snapshot out, the engine back in its wait
        _sleeps_then_stops(engine, stopping)
    finally:
        stopping.set()
        engine.join(30.0)
        producer.close()
        listener.close()
        hub.finish(records.RunEnd(status=0, reason="exited", elapsed_s=1.0))
        recorder.close()
        ctx.close()


def test_a_plain_event_still_stops_a_component_within_the_stop_check(tmp_path):
    # A context made with a threading.Event (a test's, an embedder's) keeps looking every STOP_CHECK_S.
    stopping = threading.Event()
    ctx = _context(tmp_path, stopping)
    try:
        _set_later(stopping, 0.2)
        started = time.monotonic()
        while not stopping.is_set():
            assert ctx.recv(60.0) is None
        assert time.monotonic() - started < 30.0
    finally:
        ctx.close()


def _data(record: records.Record, seq: int) -> dict:
    data = records.check(records.encode(record)).data
    data["seq"] = seq
    return data


def test_an_idle_writer_sleeps_and_a_record_put_wakes_it(tmp_path, monkeypatch):
    from trainmeter_core.runlog import recorder as recorder_mod

    # No timer of its own to end a wait: the free space is looked at hourly, what it writes is flushed at once. A
    # writer that waited for a timer to look at its queue would never write the record below.
    monkeypatch.setattr(recorder_mod, "SPACE_CHECK_EVERY_S", 3600.0)
    monkeypatch.setattr(recorder_mod, "FLUSH_EVERY_S", 0.0)
    recorder = Recorder(tmp_path, reserve_b=0)
    recorder.start()
    try:
        time.sleep(0.3)
        before = _wakes(recorder._thread)
        time.sleep(1.0)
        idle = _wakes(recorder._thread) - before
        assert idle <= 2, f"{idle} wakes in an idle second (a look every 10 ms made about 100)"
        recorder.put(_data(records.Step(step=1), 1))
        deadline = time.monotonic() + 30.0
        while recorder.flushed_seq != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert recorder.flushed_seq == 1
        assert [r.step for r in read_log(tmp_path)] == [1]
        # A stream of records: written in batches, the writer woken at most once every BATCH_S (100 a second)
        before = _wakes(recorder._thread)
        started = time.monotonic()
        for seq in range(2, 2002):
            recorder.put(_data(records.Step(step=seq), seq))
            time.sleep(0.0002)
        elapsed = time.monotonic() - started
        assert recorder.flush(timeout_s=30.0) and recorder.flushed_seq == 2001
        streamed = _wakes(recorder._thread) - before
        # Each batch is two sleeps of the writer (its wait for the queue, then BATCH_S for more to come), and on a busy
        # machine a wait for the GIL or the disk now and then, each a voluntary switch too: 141 against a bound of 2
        # per batch (129) in one CI run. A writer woken for each record would switch at least 2,000 times here.
        assert streamed <= 4 * (elapsed / recorder_mod.BATCH_S) + 10, (streamed, elapsed)
    finally:
        recorder.close()
    assert [r.step for r in read_log(tmp_path)] == list(range(1, 2002))


def test_a_subscriber_waits_out_a_timeout_of_less_than_a_millisecond(tmp_path):
    """pyzmq truncates a poll's float milliseconds: a wait of 0.5 ms was a poll that returned at once, so a loop that
    waits for a due time spun through its last millisecond (``client.poll_ms`` rounds up)."""
    subscriber = Subscriber(f"ipc://{tmp_path}/nobody-publishes", None)
    try:
        started = time.monotonic()
        for _ in range(100):
            assert subscriber.recv(0.0005) is None
        assert time.monotonic() - started >= 100 * 0.0005  # each waited its half millisecond at least
    finally:
        subscriber.close()
    assert poll_ms(0.0005) == 1 and poll_ms(0.0) == 0 and poll_ms(-1.0) == 0 and poll_ms(1.5) == 1500
