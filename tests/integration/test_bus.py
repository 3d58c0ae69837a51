"""The bus client: a producer that never blocks or raises and counts every drop, and a subscriber filtered by kind.

Real zmq sockets on ipc endpoints in a short folder, a real hub and recorder where a record must arrive somewhere.
"""

from __future__ import annotations

import os
import threading

import msgspec
from blocks import blockify, same, training_run
from deadline import wait_for
from test_hub import END, raw_push, running_hub
from tm_runs import log_records

from trainmeter_core.bus import client as bus
from trainmeter_core.model import records
from trainmeter_core.runlog.reader import read_log
from trainmeter_core.runlog.rundir import RunLock


def _steps(items: list[dict]) -> list[dict]:
    return [r for r in items if r["kind"] == "step"]


# --------------------------------------------------------------------------------------------------------------------
# Producer


def test_producer_without_a_hub_drops_and_counts_exactly_and_the_bye_makes_the_books_balance(
    short_dir, tmp_path
):
    attempted = 100
    producer = bus.Producer(f"ipc://{short_dir}/in", "agent", hwm=10)
    results = [producer.send(records.Step(step=i)) for i in range(attempted)]
    # Nobody listens: the queue takes about hwm messages and the rest are dropped, each one counted.
    assert producer.sent + producer.dropped == attempted
    assert producer.sent == results.count(True) and producer.dropped == results.count(False)
    assert 0 < producer.sent < attempted

    with running_hub(short_dir, tmp_path) as hub:
        producer.close()  # the bye waits (bounded) for room behind the queued steps, now that a hub drains them
        wait_for(lambda: hub.kinds.get("bye"), what="the producer's bye")
    log = log_records(tmp_path)
    steps = _steps(log)
    (bye,) = [r for r in log if r["kind"] == "bye"]
    assert len(steps) == producer.sent == bye["sent"]
    assert bye["dropped"] == producer.dropped
    assert len(steps) + bye["dropped"] == attempted
    # What arrived is the head of the sequence, in order, each record carrying the drops before it (none yet).
    assert [s["step"] for s in steps] == list(range(len(steps)))
    assert all(s.get("dropped", 0) == 0 for s in steps)
    stats = [r for r in log if r["kind"] == "bus.stats"][-1]
    assert stats["final"] is True
    assert stats["dropped"] == {records.producer_key("agent", bus.HOSTNAME, os.getpid()): producer.dropped}
    assert stats["dropped_total"] == producer.dropped


def test_send_never_raises_with_a_bogus_endpoint():
    producer = bus.Producer("not-an-endpoint", "agent")
    assert producer.send(records.Step(step=1)) is False
    assert producer.send_many([records.Step(step=2), records.Step(step=3)]) is False
    producer.close()
    # 1 single + a batch of 2 = 3 records dropped, none sent; the reason is kept for diagnosis.
    assert (producer.sent, producer.dropped) == (0, 3)
    assert producer.error is not None and "ZMQError" in producer.error


def test_send_after_close_is_counted_and_never_raises(short_dir):
    producer = bus.Producer(f"ipc://{short_dir}/in", "agent", linger_ms=0)
    assert producer.send(records.Step(step=1)) is True
    producer.close(linger_ms=0)
    assert producer.send(records.Step(step=2)) is False
    assert producer.send_many([records.Step(step=3), records.Step(step=4)]) is False
    producer.close()  # twice is harmless
    assert (producer.sent, producer.dropped) == (1, 3)


def test_an_empty_batch_sends_nothing_and_drops_nothing(short_dir):
    producer = bus.Producer(f"ipc://{short_dir}/in", "agent", linger_ms=0)
    assert producer.send_many([]) is True
    assert (producer.sent, producer.dropped) == (0, 0)
    producer.close()


def test_producer_stamps_the_header_and_keeps_what_the_caller_set(short_dir, tmp_path):
    with running_hub(short_dir, tmp_path) as hub:
        producer = bus.Producer(hub.in_endpoint, "agent", rank=3)
        producer.send(records.Step(step=1))
        producer.send(records.Step(step=2, source="tap", rank=1, t=5.0))
        producer.close()
        wait_for(lambda: hub.kinds.get("bye"), what="the producer's bye")
    first, second = _steps(log_records(tmp_path))
    assert (first["source"], first["rank"], first["pid"], first["host"]) == (
        "agent",
        3,
        os.getpid(),
        bus.HOSTNAME,
    )
    assert first["t"] > 0 and first["wall"] > 0
    assert first["v"] == second["v"] == records.SCHEMA_VERSION
    assert (second["source"], second["rank"], second["t"]) == ("tap", 1, 5.0)


def test_forked_child_sends_through_the_parents_producer_with_its_own_pid(short_dir, tmp_path):
    with running_hub(short_dir, tmp_path) as hub:
        producer = bus.Producer(hub.in_endpoint, "agent")
        assert producer.send(records.Step(step=1))  # the parent's socket exists before the fork
        pid = os.fork()
        if pid == 0:  # the child: the inherited socket must never be used; a fresh one is made on first send
            ok = producer.send(records.Step(step=2))
            producer.close()
            os._exit(0 if ok and producer.sent == 1 else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert producer.send(records.Step(step=3))  # the parent's producer still works
        producer.close()
        wait_for(lambda: hub.kinds.get("bye", 0) >= 2, what="both byes")
    log = log_records(tmp_path)
    assert {s["step"]: s["pid"] for s in _steps(log)} == {1: os.getpid(), 2: pid, 3: os.getpid()}
    byes = {r["pid"]: r["sent"] for r in log if r["kind"] == "bye"}
    # The child starts its counters from zero: it sent 1; the parent sent steps 1 and 3.
    assert byes == {pid: 1, os.getpid(): 2}


# --------------------------------------------------------------------------------------------------------------------
# Subscriber


def _subscribed(sock, sub, probe: bytes) -> None:
    """Send probes until the subscriber gets one (a SUB joins late), then drain what is left of them."""
    wait_for(lambda: sock.send_multipart([b"x", probe]) or sub.recv(0.05), what="the subscription")


def test_subscriber_yields_only_the_kinds_asked_for_with_their_seq(short_dir, tmp_path):
    probe = records.encode(records.Step(step=-1))
    with running_hub(short_dir, tmp_path) as hub, raw_push(hub.in_endpoint) as sock:
        sub = bus.Subscriber(hub.out_endpoint, ["step"])
        try:
            _subscribed(sock, sub, probe)
            # "step.x" passes the SUB prefix filter; the subscriber must still refuse it.
            for payload in (
                msgspec.msgpack.encode({"kind": "step.x", "n": 1}),
                records.encode(records.Step(step=10)),
                records.encode(records.Metric(values={"loss": 1.0})),
                msgspec.msgpack.encode({"kind": "step.x", "n": 2}),
                records.encode(records.Step(step=11)),
            ):
                sock.send_multipart([b"x", payload])
            got = []
            while len(got) < 2:
                record = sub.recv(30)
                assert record is not None, "timed out waiting for the steps"
                if record.step != -1:
                    got.append(record)
        finally:
            sub.close()
    assert [type(r) for r in got] == [records.Step, records.Step]
    assert [r.step for r in got] == [10, 11]
    # The hub numbered metric and step.x in between: 11's seq is 10's + 3.
    assert got[0].seq is not None and got[1].seq == got[0].seq + 3
    logged = {r["step"]: r["seq"] for r in _steps(log_records(tmp_path)) if r["step"] != -1}
    assert logged == {10: got[0].seq, 11: got[1].seq}


def test_subscriber_without_a_filter_gets_every_kind_and_run_end(short_dir, tmp_path):
    probe = records.encode(records.Notice(topic="probe", message="p"))
    with running_hub(short_dir, tmp_path) as hub, raw_push(hub.in_endpoint) as sock:
        sub = bus.Subscriber(hub.out_endpoint)
        try:
            _subscribed(sock, sub, probe)
            sock.send_multipart([b"x", records.encode(records.Step(step=1))])
            # finish() drains what reached the hub, not what is still in flight (the launcher waits for byes).
            wait_for(lambda: hub.kinds.get("step"), what="the step")
            hub.finish(END)
            kinds = []
            while not kinds or kinds[-1] != "run.end":
                record = sub.recv(30)
                assert record is not None, "timed out waiting for run.end"
                kinds.append(records.kind_of(record))
        finally:
            sub.close()
    kinds = [k for k in kinds if k not in ("notice", "tick")]
    assert kinds == ["step", "bus.stats", "run.end"]


def test_subscribe_iterates_a_live_run_and_ends_at_run_end(short_dir, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock = RunLock(run_dir)
    lock.acquire()
    stop_feeding = threading.Event()
    got = []
    with running_hub(short_dir, tmp_path / "run") as hub:
        (run_dir / "endpoints.json").write_text(f'{{"in": "{hub.in_endpoint}", "out": "{hub.out_endpoint}"}}')

        def feed():  # the iterator subscribes on its first next(): keep steps coming until it has one
            n = 0
            while not stop_feeding.wait(0.05):
                n += 1
                hub.inject(records.Step(step=n))

        feeder = threading.Thread(target=feed)
        feeder.start()
        try:
            for record in bus.subscribe(run_dir, ["step"], idle_check_s=0.1):
                got.append(record)
                if len(got) == 1:
                    stop_feeding.set()
                    feeder.join()
                    threading.Thread(target=hub.finish, args=(END,)).start()
        finally:
            stop_feeding.set()
            feeder.join()
    lock.release()
    # The loop ended on its own (run.end came, and was not yielded: only steps were asked for).
    assert got and {records.kind_of(r) for r in got} == {"step"}
    assert [r.step for r in got] == sorted(r.step for r in got)


def test_subscribe_ends_when_the_launcher_lock_is_free(short_dir, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "endpoints.json").write_text(f'{{"out": "ipc://{short_dir}/nobody"}}')
    lock = RunLock(run_dir)
    lock.acquire()
    items = bus.subscribe(run_dir, idle_check_s=0.05)
    threading.Timer(0.3, lock.release).start()
    # Nobody publishes: the iterator idles until the lock is free, then stops instead of waiting forever.
    assert list(items) == []


def _received(sub: bus.Subscriber, done, what: str) -> list:
    got: list = []
    while not done(got):
        record = sub.recv(30)
        assert record is not None, f"timed out waiting for {what}"
        if getattr(record, "step", None) != -1:  # the subscription's probes
            got.append(record)
    return got


def test_a_subscriber_gets_the_rows_of_the_blocks_a_producer_sends_each_once_in_order_with_the_logs_seqs(
    short_dir, tmp_path
):
    # 150 steps of one producer, with their losses, data-wait phases and learning rates, in blocks of at most 40
    # records, between whole records (the facts, ticks and the run's start and end of the synthetic run).
    rows = [r for r in training_run(150, nan_at=9) if r.source == "agent"]
    sent = blockify(rows, at_most=40)
    assert sum(type(item) is records.Block for item in sent) >= 10
    for item in sent:
        item.seq = None  # the hub numbers them
    probes = [records.Step(step=-1), records.Metric(values={"probe": 1.0}, step=-1)]
    with running_hub(short_dir, tmp_path) as hub, raw_push(hub.in_endpoint) as sock:
        steps = bus.Subscriber(hub.out_endpoint, ["step"])
        losses = bus.Subscriber(hub.out_endpoint, ["metric"])
        every = bus.Subscriber(hub.out_endpoint)
        bulk = bus.Subscriber(hub.out_endpoint, blocks=True)
        try:
            for sub, probe in (
                (steps, probes[0]),
                (losses, probes[1]),
                (every, probes[0]),
                (bulk, probes[0]),
            ):
                _subscribed(sock, sub, records.encode(probe))
            producer = bus.Producer(hub.in_endpoint, "agent")
            for at in range(0, len(sent), 3):
                assert producer.send_many(sent[at : at + 3])
            producer.close()
            got_steps = _received(steps, lambda got: len(got) == 150, "the steps")
            got_metrics = _received(losses, lambda got: len(got) == 165, "the metrics")
            got_every = _received(every, lambda got: got and records.kind_of(got[-1]) == "bye", "the bye")
            got_bulk = _received(bulk, lambda got: got and records.kind_of(got[-1]) == "bye", "the bye")
            assert (
                every.gaps == bulk.gaps == 0
            )  # (a subscriber of some kinds sees the others' numbers as gaps)
        finally:
            for sub in (steps, losses, every, bulk):
                sub.close()
    # Every step once, in order; the metrics (150 losses, one NaN, and 15 learning rates) likewise.
    assert [s.step for s in got_steps] == list(range(1, 151))
    assert sum(1 for m in got_metrics if m.values.get("train_loss") != m.values.get("train_loss")) == 1
    # Their numbers are the log's (rows numbered by the hub inside their block), and so are the rows themselves.
    assert same(got_steps, [r for r in read_log(tmp_path, {"step"}) if r.step != -1])
    assert same(got_metrics, [r for r in read_log(tmp_path, {"metric"}) if r.step != -1])
    assert [r.seq for r in got_every] == sorted({r.seq for r in got_every})
    assert [records.kind_of(r) for r in got_every if records.kind_of(r) in records.ROW_KINDS] == [
        records.kind_of(r) for r in rows if records.kind_of(r) in records.ROW_KINDS
    ]
    # Who asked for blocks got them as they are, each numbered as its last row.
    blocks = [b for b in got_bulk if type(b) is records.Block]
    assert len(blocks) == sum(type(item) is records.Block for item in sent)
    assert same(blocks, read_log(tmp_path, {"block"}))
    assert bulk.last_seq == every.last_seq
