"""The hub: every frame numbered, recorded and republished in order; garbage counted and dropped; never stopped.

Real zmq sockets on ipc endpoints in a short folder; frames are sent from a plain PUSH so the tests control every
byte. The fuzz test is the issue's acceptance 7, with fixed seeds printed for replay.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time

import msgspec
import zmq
from deadline import wait_for
from steady_blocks import malformed_block, steady_block
from tm_runs import log_records

from trainmeter_core.bus import client as bus
from trainmeter_core.bus.hub import Hub
from trainmeter_core.bus.publish import PUBLISH_GROUP_MAX
from trainmeter_core.bus.tick_clock import first_tick
from trainmeter_core.model import records
from trainmeter_core.runlog.recorder import Recorder

END = records.RunEnd(status=0, reason="exited", elapsed_s=1.0)


@contextlib.contextmanager
def running_hub(short_dir, log_dir, **kw):
    """A hub with its recorder, bound in ``short_dir``; finished and closed at the end whatever happened."""
    recorder = Recorder(log_dir)
    hub = Hub(f"ipc://{short_dir}/in", f"ipc://{short_dir}/out", recorder, **kw)
    recorder.start()
    hub.start()
    try:
        yield hub
    finally:
        hub.finish(END)
        recorder.close()


@contextlib.contextmanager
def raw_push(endpoint):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(endpoint)
    try:
        yield sock
    finally:
        sock.close()
        ctx.term()


@contextlib.contextmanager
def raw_sub(endpoint):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        yield sock
    finally:
        sock.close()
        ctx.term()


def _seqs_strictly_increase(log: list[dict]) -> bool:
    seqs = [r["seq"] for r in log]
    return all(a < b for a, b in zip(seqs, seqs[1:], strict=False))


# --------------------------------------------------------------------------------------------------------------------
# Acceptance 7: fuzzed frames

SEEDS = (20240601, 7, 99991)
FUZZ_FRAMES = 10_000
BIG_FRAMES = 3  # 10 MB each
VALID_EVERY = 10  # one valid step (or batch of steps) between every 10 fuzz frames

_GOOD = records.Step(step=1, source="agent", host="h", pid=1, tokens=4096, step_time_s=0.25)
_WRONG_TYPES = [
    {"kind": "step", "step": "x"},
    {"kind": "step", "step": 1.5},
    {"kind": "step", "step": 1, "pid": "one"},
    {"kind": "step", "step": 1, "tokens_source": "guess"},
    {"kind": "metric", "values": {"loss": "low"}},
    {"kind": "metric", "values": [1.0]},
    {"kind": "tick", "n": None, "interval_s": 1.0},
    {"kind": "alert", "rule": "r", "state": "maybe", "message": "m"},
    {"kind": "run.end", "status": 0, "reason": "exited"},  # elapsed_s missing
    {"kind": "sample.gpu", "index": 0, "util_gpu": "busy"},
    {"kind": 7},
    {"kind": None, "step": 1},
    {"step": 1},
]


def _hub_would_count_malformed(frames: list[bytes]) -> int:
    """How many malformed records the wire protocol makes of one message (2 frames: topic, body; batch: an array)."""
    if len(frames) != 2:
        return 1
    if frames[0] == bus.BATCH_TOPIC:
        try:
            items = records.split_batch(frames[1])
        except records.MalformedRecord:
            return 1
    else:
        items = [frames[1]]
    bad = 0
    for item in items:
        try:
            checked = records.check(item)
            if checked.kind == "block":
                records.block.validate(checked.record)
                if checked.record.rows < 1:
                    raise records.MalformedRecord("block: no rows")
        except records.MalformedRecord:
            bad += 1
    return bad if bad == len(items) else -1  # -1: some item is valid, so this is no clean fuzz frame


def _log_steps(log: list[dict]) -> list[int]:
    """The step numbers of the log's step records and of its blocks' step rows, in order."""
    return [
        n
        for r in log
        if r["kind"] in ("step", "block")
        for n in (r["step"] if r["kind"] == "block" else [r["step"]])
    ]


def _fuzz_frame(rng: random.Random) -> list[bytes]:
    """One message the hub must count as exactly one malformed record."""
    good = records.encode(_GOOD)
    choice = rng.randrange(12)
    if choice == 10:  # a block that is malformed, alone
        return [b"block", malformed_block(rng)[1]]
    if choice == 11:  # ... or in a batch of its own
        return [bus.BATCH_TOPIC, b"\x91" + malformed_block(rng)[1]]
    if choice == 0:  # random bytes
        return [b"step", rng.randbytes(rng.randrange(0, 300))]
    if choice == 1:  # a valid record cut short
        return [b"step", good[: rng.randrange(0, len(good))]]
    if choice == 2:  # a valid record with a field of the wrong type
        return [b"step", msgspec.msgpack.encode(rng.choice(_WRONG_TYPES))]
    if choice == 3:  # wrong frame counts: one frame, or a valid record with extra frames
        return rng.choice([[good], [b"step", good, b""], [b"step", good, good, good]])
    if choice == 4:  # a batch frame that is not an array
        return [bus.BATCH_TOPIC, rng.choice([good, msgspec.msgpack.encode(5), b"\x80"])]
    if choice == 5:  # a batch cut short
        batch = records.encode_many([_GOOD, _GOOD, _GOOD])
        return [bus.BATCH_TOPIC, batch[: rng.randrange(1, len(batch))]]
    if choice == 6:  # a batch holding one record of the wrong type
        return [bus.BATCH_TOPIC, msgspec.msgpack.encode([rng.choice(_WRONG_TYPES)])]
    if choice == 7:  # absurd nesting (once it stopped the hub with a RecursionError)
        return [b"step", b"\x82\xa4kind\xa2zz\xa1x" + b"\x91" * rng.randrange(2_000, 200_000) + b"\x01"]
    if choice == 8:  # what the JSON log cannot hold (once it stopped the recorder)
        return [
            b"x",
            msgspec.msgpack.encode({"kind": "zz", "x": rng.choice([{None: 1}, msgspec.msgpack.Ext(3, b"")])}),
        ]
    return [b"step", good + rng.randbytes(rng.randrange(1, 8))]  # trailing bytes after a valid record


def test_ten_thousand_fuzzed_frames_are_each_counted_malformed_and_the_valid_ones_all_recorded(
    short_dir, tmp_path
):
    expected_steps: list[int] = []
    sent_fuzz = 0
    rerolled = 0
    with running_hub(short_dir, tmp_path) as hub, raw_push(hub.in_endpoint) as sock:
        for seed in SEEDS:
            print(f"seed={seed}")
        rngs = [random.Random(seed) for seed in SEEDS]
        big_at = set(random.Random(SEEDS[0]).sample(range(FUZZ_FRAMES), BIG_FRAMES))
        step = 0
        for i in range(FUZZ_FRAMES):
            rng = rngs[i % len(rngs)]
            if i in big_at:
                frames = [b"step", rng.randbytes(10 * 1024 * 1024)]
            else:
                frames = _fuzz_frame(rng)
            # A frame that happens to be valid (random bytes can, in principle) is drawn again, so the count is exact.
            while _hub_would_count_malformed(frames) != 1:
                rerolled += 1
                frames = _fuzz_frame(rng)
            sock.send_multipart(frames)
            sent_fuzz += 1
            if i % VALID_EVERY == 0:
                draw = rng.random()
                if draw < 0.4:
                    step += 1
                    sock.send_multipart([b"step", records.encode(records.Step(step=step, source="fuzz"))])
                    expected_steps.append(step)
                elif (
                    draw < 0.6
                ):  # an agent's batch: a block of two steady steps (six rows) and a whole record
                    items = [
                        steady_block(step + 1, 2, source="fuzz"),
                        records.Notice(topic="fuzz", message="m"),
                    ]
                    sock.send_multipart([bus.BATCH_TOPIC, records.encode_many(items)])
                    expected_steps += [step + 1, step + 2]
                    step += 2
                else:
                    batch = [
                        records.Step(step=step + 1, source="fuzz"),
                        records.Step(step=step + 2, source="fuzz"),
                    ]
                    sock.send_multipart([bus.BATCH_TOPIC, records.encode_many(batch)])
                    expected_steps += [step + 1, step + 2]
                    step += 2
        print(f"fuzz frames={sent_fuzz} rerolled={rerolled} valid steps={len(expected_steps)}")
        wait_for(
            lambda: hub.malformed >= sent_fuzz and hub.kinds.get("step", 0) >= len(expected_steps),
            what="the hub to take every frame",
        )
        wait_for(lambda: hub.ticks >= 1, what="a tick")
        # Nothing a producer sent stopped the hub or the recorder.
        assert hub._thread.is_alive() and hub.error is None
        assert hub.recorder._thread.is_alive() and hub.recorder.error is None
    assert hub.error is None
    assert hub.malformed == sent_fuzz
    log = log_records(tmp_path)
    assert _log_steps(log) == expected_steps
    assert any(r["kind"] == "tick" for r in log)
    assert log[-1]["kind"] == "run.end"  # the hub was still there to finish the run
    assert _seqs_strictly_increase(log)
    final = [r for r in log if r["kind"] == "bus.stats"][-1]
    assert final["final"] is True and final["malformed"] == sent_fuzz


# --------------------------------------------------------------------------------------------------------------------
# Publication


def _wait_subscribed(sock, receive) -> None:
    """A SUB joins late: send notice probes until one comes back."""
    probe = records.encode(records.Notice(topic="probe", message="p"))
    wait_for(lambda: sock.send_multipart([b"notice", probe]) or receive(), what="the subscription")


def test_a_burst_is_published_in_groups_in_order_with_consecutive_seq(short_dir, tmp_path):
    n = 2500
    with (
        running_hub(short_dir, tmp_path) as hub,
        raw_push(hub.in_endpoint) as sock,
        raw_sub(hub.out_endpoint) as sub_raw,
    ):
        typed = bus.Subscriber(hub.out_endpoint, ["step"])
        try:
            poller = zmq.Poller()
            poller.register(sub_raw, zmq.POLLIN)
            _wait_subscribed(sock, lambda: poller.poll(50) and sub_raw.recv_multipart())
            wait_for(
                lambda: (
                    sock.send_multipart([b"step", records.encode(records.Step(step=-1))]) or typed.recv(0.05)
                )
            )
            # One batch frame is drained in one go, so the steps leave as consecutive groups of at most 1000.
            sock.send_multipart(
                [bus.BATCH_TOPIC, records.encode_many([records.Step(step=i) for i in range(n)])]
            )
            groups = []  # (first seq, records in the message)
            while sum(size for _, size in groups) < n:
                assert poller.poll(30_000), "timed out waiting for the burst"
                topic, seq, body = sub_raw.recv_multipart()
                if topic != b"step":
                    continue
                items = records.split_batch(body) if body[:1] == b"\xdd" else [body]
                if records.decode(bytes(items[0])).step == -1:
                    continue  # a probe
                groups.append((int.from_bytes(seq, "big"), len(items)))
            typed_steps = []
            while len(typed_steps) < n:
                record = typed.recv(30)
                assert record is not None, "timed out waiting for the typed subscriber"
                if record.step != -1:
                    typed_steps.append(record)
        finally:
            typed.close()
    # 2500 records at PUBLISH_GROUP_MAX = 1000 per message: 1000 + 1000 + 500, numbered without a hole.
    assert PUBLISH_GROUP_MAX == 1000
    assert [size for _, size in groups] == [1000, 1000, 500]
    first = groups[0][0]
    assert [seq for seq, _ in groups] == [first, first + 1000, first + 2000]
    assert [r.step for r in typed_steps] == list(range(n))
    assert [r.seq for r in typed_steps] == list(range(first, first + n))


def _loop_records(n: int, first_step: int) -> list[records.Record]:
    """What a training loop sends per iteration, interleaved: its data wait, its loss, its step."""
    out: list[records.Record] = []
    for i in range(first_step, first_step + n):
        out.append(records.Phase(phase="data_wait", start_t=i, end_t=i + 0.1, step=i, probe="dataloader"))
        out.append(records.Metric(values={"train_loss": 1.0}, step=i, origin="backward"))
        out.append(records.Step(step=i))
    return out


def _is_probe(record) -> bool:
    """A notice or a negative step: what the test sent to learn that a subscription is live."""
    return isinstance(record, records.Notice) or (isinstance(record, records.Step) and record.step < 0)


def _received(sub, n: int, who: str) -> list:
    """The next ``n`` records a typed subscriber receives, the probes left out."""
    got = []
    while len(got) < n:
        record = sub.recv(30)
        assert record is not None, f"timed out waiting for {who}"
        if not _is_probe(record):
            got.append(record)
    return got


def _published(poller, sub_raw, n: int) -> list[tuple[bytes, int, list[str]]]:
    """The next messages carrying ``n`` loop records: (topic, first seq, the kinds of its records in order); the
    notices and steps that probed the subscriptions are left out."""
    messages = []
    while sum(len(kinds) for _, _, kinds in messages) < n:
        assert poller.poll(30_000), "timed out waiting for the loop's records"
        topic, seq, body = sub_raw.recv_multipart()
        items = [
            records.decode(bytes(item))
            for item in (records.split_batch(body) if body[:1] == b"\xdd" else [body])
        ]
        if any(_is_probe(r) for r in items):
            # Probes may leave together (a notice still queued and a step sent before the hub saw the step filter,
            # when steps were a kind nobody filtered for), never with the loop's records
            assert all(_is_probe(r) for r in items), "a probe shares a message with the loop's records"
            continue
        messages.append((topic, int.from_bytes(seq, "big"), [records.kind_of(r) for r in items]))
    return messages


def test_kinds_no_subscriber_filters_for_leave_together_and_a_filtered_kind_leaves_apart(short_dir, tmp_path):
    # A training loop's data wait, loss and step interleave: as groups of one kind they would leave as three messages
    # per iteration. Kinds no subscriber filters for share a message (topic "*"); a kind some subscriber filters for
    # keeps messages of its own, so that its filter still finds it. No tick or stats of the hub's own come between.
    with (
        running_hub(short_dir, tmp_path, tick_s=3600, stats_every_s=3600) as hub,
        raw_push(hub.in_endpoint) as sock,
        raw_sub(hub.out_endpoint) as sub_raw,
    ):
        steps_only = bus.Subscriber(hub.out_endpoint, ["step"])
        every = bus.Subscriber(hub.out_endpoint)
        try:
            poller = zmq.Poller()
            poller.register(sub_raw, zmq.POLLIN)
            _wait_subscribed(sock, lambda: poller.poll(50) and sub_raw.recv_multipart())
            _wait_subscribed(sock, lambda: every.recv(0.05))
            probe = [b"step", records.encode(records.Step(step=-1))]
            wait_for(lambda: sock.send_multipart(probe) or steps_only.recv(0.05), what="the step filter")
            wait_for(lambda: b"step" in hub.topics, what="the hub to see the step filter")
            sock.send_multipart([bus.BATCH_TOPIC, records.encode_many(_loop_records(100, 0))])
            filtered = _published(poller, sub_raw, 300)
            steps = _received(steps_only, 100, "the filtered subscriber")
            steps_only.close()
            wait_for(lambda: b"step" not in hub.topics, what="the hub to see the step filter go")
            sock.send_multipart([bus.BATCH_TOPIC, records.encode_many(_loop_records(100, 100))])
            together = _published(poller, sub_raw, 300)
            seen = _received(every, 600, "the subscriber of every kind")
        finally:
            steps_only.close()
            every.close()
    # With a filter on steps: the data wait and the loss of each iteration together, its step alone.
    assert filtered == [
        message
        for i in range(100)
        for message in (
            (b"*", filtered[0][1] + 3 * i, ["phase", "metric"]),
            (b"step", filtered[0][1] + 3 * i + 2, ["step"]),
        )
    ]
    assert [r.step for r in steps] == list(range(100))
    # Without it: the whole burst in one message.
    assert [(topic, kinds) for topic, _, kinds in together] == [(b"*", ["phase", "metric", "step"] * 100)]
    # The subscriber of every kind took all of them in the hub's order, numbered without a hole.
    assert [records.kind_of(r) for r in seen] == ["phase", "metric", "step"] * 200
    assert [r.seq for r in seen[:300]] == list(range(filtered[0][1], filtered[0][1] + 300))
    assert [r.seq for r in seen[300:]] == list(range(together[0][1], together[0][1] + 300))
    assert [r.step for r in seen if isinstance(r, records.Step)] == list(range(200))


def test_records_of_one_kind_published_one_by_one_each_carry_their_own_seq(short_dir, tmp_path):
    # Each step waits for the one before to arrive, so each leaves the hub alone, as a group of one of the same
    # kind as the last: it must carry its own seq, not the first seq of an earlier group.
    with running_hub(short_dir, tmp_path) as hub, raw_push(hub.in_endpoint) as sock:
        sub = bus.Subscriber(hub.out_endpoint, ["step"])
        try:
            probe = [b"step", records.encode(records.Step(step=-1))]
            wait_for(lambda: sock.send_multipart(probe) or sub.recv(0.05), what="the subscription")
            got = {}
            for i in (1, 2, 3):
                sock.send_multipart([b"step", records.encode(records.Step(step=i))])
                while i not in got:
                    record = sub.recv(30)
                    assert record is not None, f"timed out waiting for step {i}"
                    got[record.step] = record.seq
        finally:
            sub.close()
    logged = {r["step"]: r["seq"] for r in log_records(tmp_path) if r["kind"] == "step"}
    assert {i: got[i] for i in (1, 2, 3)} == {i: logged[i] for i in (1, 2, 3)}


def test_snapshots_are_published_but_never_written_to_the_log(short_dir, tmp_path):
    with running_hub(short_dir, tmp_path) as hub, raw_push(hub.in_endpoint) as sock:
        sub = bus.Subscriber(hub.out_endpoint, ["snapshot"])
        try:
            probe = [b"snapshot", records.encode(records.Snapshot(tick=-1))]
            wait_for(lambda: sock.send_multipart(probe) or sub.recv(0.05), what="the subscription")
            sock.send_multipart([b"step", records.encode(records.Step(step=1))])
            sock.send_multipart([b"snapshot", records.encode(records.Snapshot(tick=7, steps=1))])
            sock.send_multipart([b"step", records.encode(records.Step(step=2))])
            snapshot = None
            while snapshot is None or snapshot.tick == -1:
                snapshot = sub.recv(30)
                assert snapshot is not None, "timed out waiting for the snapshot"
            wait_for(lambda: hub.kinds.get("step", 0) >= 2, what="the second step")
        finally:
            sub.close()
    assert (snapshot.tick, snapshot.steps) == (7, 1)
    assert hub.last_snapshot["tick"] == 7
    log = log_records(tmp_path)
    assert not [r for r in log if r["kind"] == "snapshot"]
    steps = {r["step"]: r["seq"] for r in log if r["kind"] == "step"}
    # The snapshot took the seq between the two steps; the log skips it and stays strictly increasing.
    assert steps == {1: snapshot.seq - 1, 2: snapshot.seq + 1}
    assert _seqs_strictly_increase(log)


def test_unknown_kinds_and_fields_reach_the_log_verbatim_and_are_counted_unknown(short_dir, tmp_path):
    newer_kind = {"kind": "gpu.power_cap", "v": 2, "watts": 300.5, "nested": {"a": [1, "b", None]}}
    newer_field = {"kind": "step", "step": 4, "moe_aux_loss": 0.125}
    with running_hub(short_dir, tmp_path) as hub, raw_push(hub.in_endpoint) as sock:
        sock.send_multipart([b"gpu.power_cap", msgspec.msgpack.encode(newer_kind)])
        sock.send_multipart([b"step", msgspec.msgpack.encode(newer_field)])
        wait_for(lambda: hub.kinds.get("step"), what="the step")
    assert (hub.unknown, hub.malformed) == (2, 0)
    log = log_records(tmp_path)
    (kind_line,) = [r for r in log if r["kind"] == "gpu.power_cap"]
    (field_line,) = [r for r in log if r["kind"] == "step"]
    assert {k: v for k, v in kind_line.items() if k != "seq"} == newer_kind
    assert {k: v for k, v in field_line.items() if k != "seq"} == newer_field
    assert [r for r in log if r["kind"] == "bus.stats"][-1]["unknown"] == 2


def test_a_batch_with_one_malformed_record_loses_that_one_alone(short_dir, tmp_path):
    good = [records.to_builtins(records.Step(step=i, source="agent")) for i in (1, 2)]
    newer_kind = {"kind": "gpu.power_cap", "watts": 300.5}
    batch = [good[0], {"kind": "step", "step": "x"}, newer_kind, good[1]]
    with running_hub(short_dir, tmp_path) as hub, raw_push(hub.in_endpoint) as sock:
        sock.send_multipart([bus.BATCH_TOPIC, msgspec.msgpack.encode(batch)])
        wait_for(lambda: hub.kinds.get("step") == 2, what="both good steps")
    assert (hub.malformed, hub.unknown) == (1, 1)
    log = [r for r in log_records(tmp_path) if r["kind"] in ("step", "gpu.power_cap")]
    assert [(r["kind"], r.get("step")) for r in log] == [("step", 1), ("gpu.power_cap", None), ("step", 2)]


def test_history_records_are_derived_too_and_after_the_end_only_derived_kinds_and_alerts_pass(
    short_dir, tmp_path
):
    derived = [
        records.HistoryRequest(reason="start"),
        records.HistorySync(incarnation="e1", n=1, checkpoint="engine.ckpt"),
        records.HistoryDelta(
            incarnation="e1", n=2, series=["train_loss"], points=[(0, 1.0, 2.0, 3.0, 4.0, 5.0)]
        ),
    ]
    late = [
        records.Snapshot(tick=9, final=True),
        records.HistoryDelta(incarnation="e1", n=3),
        records.Alert(rule="died", state="fired", message="the training process died"),
        records.Step(step=99),
        records.Component(name="alerts", event="stopped", process="components"),  # ComponentContext.done
    ]
    recorder = Recorder(tmp_path)
    hub = Hub(f"ipc://{short_dir}/in", f"ipc://{short_dir}/out", recorder)
    recorder.start()
    hub.start()
    sub = bus.Subscriber(
        hub.out_endpoint, ["history", "history.request", "history.sync", "snapshot", "alert"]
    )
    try:
        with raw_push(hub.in_endpoint) as sock:
            probe = [b"history", records.encode(records.HistoryDelta(incarnation="probe", n=0))]
            wait_for(lambda: sock.send_multipart(probe) or sub.recv(0.05), what="the subscription")
            for record in derived:
                sock.send_multipart([records.topic(records.kind_of(record)), records.encode(record)])
            wait_for(lambda: hub.kinds.get("history.sync"), what="the derived records")
            hub.end(END)
            for record in late:
                sock.send_multipart([records.topic(records.kind_of(record)), records.encode(record)])
            # one socket keeps their order: once the last came, so had the others
            wait_for(lambda: hub.done_components, what="the late records")
        got = []
        while len(got) < 6:
            record = sub.recv(30)
            assert record is not None, "timed out waiting for the published records"
            if getattr(record, "incarnation", "") != "probe" and records.kind_of(record) != "run.end":
                got.append(records.kind_of(record))
    finally:
        sub.close()
        hub.stop()
        recorder.close()
    # Published: the three derived records, and after run.end the final snapshot, the last delta and the alert.
    assert got == ["history.request", "history.sync", "history", "snapshot", "history", "alert"]
    assert hub.late == 1  # the step after the end: dropped
    assert hub.done_components == {
        "alerts"
    }  # noted for the launcher's wait, neither written nor counted as dropped
    # Written: none of the derived records; after run.end only the alert.
    kinds = [r["kind"] for r in log_records(tmp_path)]
    assert not {"history", "history.request", "history.sync", "snapshot"} & set(kinds)
    assert kinds[-2:] == ["run.end", "alert"]


def test_a_history_delta_nobody_receives_is_numbered_and_counted_unread_and_checked_once_someone_listens(
    short_dir, tmp_path
):
    delta = records.encode(records.HistoryDelta(incarnation="e1", n=1, series=["train_loss"]))
    bad_delta = msgspec.msgpack.encode({"kind": "history", "n": "not a number"})  # a real check refuses it
    with running_hub(short_dir, tmp_path) as hub, raw_push(hub.in_endpoint) as sock:
        for payload in (delta, bad_delta, records.encode(records.Step(step=1, source="agent"))):
            sock.send_multipart([b"history", payload])
        wait_for(lambda: hub.kinds.get("step") == 1, what="the step after the deltas")
        # No subscriber: neither delta was read (the bad one is not malformed: nobody would have seen it), both were
        # numbered as if published, and the step after them has the number it would have had
        assert (hub.kinds.get("history"), hub.malformed, hub.published) == (2, 0, 1)
        sub = bus.Subscriber(hub.out_endpoint, ["history"])
        try:
            wait_for(lambda: hub.listening("history"), what="the subscription")
            sock.send_multipart([b"history", bad_delta])
            sock.send_multipart([b"history", delta])
            received = sub.recv(30)
        finally:
            sub.close()
        # Someone listens: each is checked, the bad one refused, the good one published
        assert records.kind_of(received) == "history" and received.incarnation == "e1"
        assert (hub.kinds.get("history"), hub.malformed) == (3, 1)
    assert [r["seq"] for r in log_records(tmp_path) if r["kind"] == "step"] == [3]


def test_a_derived_record_from_a_job_node_is_refused_though_nobody_listens(short_dir):
    hub = Hub(f"ipc://{short_dir}/in", f"ipc://{short_dir}/out", None)
    delta = records.encode(records.HistoryDelta(incarnation="e1", n=1, host="node2"))
    try:
        # Taken in the hub's own thread's place before it starts: a node never sends a derived kind (NOT_FORWARDED)
        assert hub._accept(delta, node_host="node2") is False
        assert (hub.malformed, hub.kinds.get("history")) == (1, None)
        assert hub._accept(delta) is True  # the hub's own node's, nobody listening: counted, never read
        assert (hub.malformed, hub.kinds.get("history"), hub.seq) == (1, 1, 1)
    finally:
        hub.start()
        hub.finish(END)


def test_leading_kind_reads_a_records_tag_from_its_first_bytes_and_nothing_else():
    assert records.leading_kind(records.encode(records.HistoryDelta(incarnation="e", n=1))) == "history"
    assert records.leading_kind(records.encode(records.HistoryRequest())) == "history.request"
    many_fields = {"kind": "gpu.power_cap", **{f"f{i}": i for i in range(20)}}  # a map of 16 fields or more
    assert records.leading_kind(msgspec.msgpack.encode(many_fields)) == "gpu.power_cap"
    for payload in (b"", b"\x93\x01\x02\x03", b"\x81\xa4kind", b"\x81\xa4kind\xa7hist", b"\x81\xa4kinx\xa1a"):
        assert records.leading_kind(payload) is None, payload
    assert (
        records.leading_kind(msgspec.msgpack.encode({"n": 1, "kind": "history"})) is None
    )  # not first: no look


# --------------------------------------------------------------------------------------------------------------------
# The clock, the counters and the launcher's own records


def test_ticks_come_once_a_second_never_early_and_carry_child_alive(short_dir, tmp_path):
    child = {"alive": True}
    started_t = time.monotonic()
    with running_hub(short_dir, tmp_path, child_alive=lambda: child["alive"]) as hub:
        wait_for(lambda: hub.ticks >= 1, what="the first tick")
        child["alive"] = False
        wait_for(lambda: hub.ticks >= 2, what="the second tick")
    ticks = [r for r in log_records(tmp_path) if r["kind"] == "tick"]
    assert [t["n"] for t in ticks] == list(range(1, len(ticks) + 1)) and len(ticks) >= 2
    assert all(t["interval_s"] == 1.0 and t["source"] == "hub" for t in ticks)
    # Tick n is due half a second after a whole second of the monotonic clock, n - 1 seconds after the first one, which
    # is at least a second after the hub started, and is never sent before that (a late one is fine): between two
    # closes of the agents' windows of a second (bus/tick_clock.py).
    first_due = first_tick(started_t, 1.0)
    assert first_due >= started_t + 1.0
    assert all(t["t"] >= first_due + (t["n"] - 1) * 1.0 for t in ticks)
    assert all((t["t"] - 0.5) % 1.0 < 0.45 for t in ticks), [t["t"] for t in ticks]
    assert (
        ticks[0].get("child_alive", True) is True and ticks[-1]["child_alive"] is False
    )  # True is the default, left out


def test_bus_stats_come_periodically_and_the_final_one_balances_the_books(short_dir, tmp_path):
    with running_hub(short_dir, tmp_path, stats_every_s=0.2) as hub, raw_push(hub.in_endpoint) as sock:
        wait_for(lambda: hub.kinds.get("bus.stats"), what="a periodic bus.stats")
        for i in range(3):
            sock.send_multipart([b"step", records.encode(records.Step(step=i))])
        sock.send_multipart([b"step", b"\xc1"])  # malformed
        sock.send_multipart([b"zz", msgspec.msgpack.encode({"kind": "zz"})])  # unknown
        wait_for(lambda: hub.kinds.get("zz") and hub.malformed, what="the last two frames")
    log = log_records(tmp_path)
    assert [r["kind"] for r in log[-2:]] == ["bus.stats", "run.end"]
    final = log[-2]
    periodic = [r for r in log[:-2] if r["kind"] == "bus.stats"]
    assert periodic and not any(r.get("final") for r in periodic)
    before_final = log[:-2]
    # Every payload received was either published or malformed; every published one (no snapshots) is in the log.
    assert final["final"] is True
    assert (final["malformed"], final["unknown"]) == (1, 1)
    assert final["published"] == len(before_final)
    assert final["received"] == final["published"] + final["malformed"]
    assert final["flushed_seq"] <= before_final[-1]["seq"]
    assert final["log_segments"] == 1 and final["log_bytes"] > 0
    assert log[-1]["seq"] == final["seq"] + 1 and log[-1]["status"] == 0


def test_the_final_bus_stats_report_the_flush_of_every_record_before_them(short_dir, tmp_path, monkeypatch):
    from trainmeter_core.runlog import recorder as recorder_mod

    # Batches that never come due by themselves: without the hub asking for a flush at the end, the final stats
    # would report nothing flushed at all (the race this once lost about 1 run in 12 under load).
    monkeypatch.setattr(recorder_mod, "FLUSH_EVERY_S", 3600.0)
    with (
        running_hub(short_dir, tmp_path, stats_every_s=3600.0, tick_s=3600.0) as hub,
        raw_push(hub.in_endpoint) as sock,
    ):
        for i in range(3):
            sock.send_multipart([b"step", records.encode(records.Step(step=i))])
        wait_for(lambda: hub.kinds.get("step", 0) == 3, what="the three steps")
    log = log_records(tmp_path)
    assert [r["kind"] for r in log] == ["step", "step", "step", "bus.stats", "run.end"]
    assert log[-2]["final"] is True and log[-2]["flushed_seq"] == log[-3]["seq"]


def test_injected_records_are_numbered_recorded_and_stamped_as_the_hubs(short_dir, tmp_path):
    with running_hub(short_dir, tmp_path) as hub:
        hub.inject(records.Notice(topic="launcher", message="child started"))
        hub.inject(records.Fact(name="gpus", value=0, provenance="detected", origin="launcher"))
        wait_for(lambda: hub.kinds.get("fact"), what="the injected fact")
    log = log_records(tmp_path)
    notice, fact = [r for r in log if r["kind"] in ("notice", "fact")]
    assert (notice["message"], fact["name"]) == ("child started", "gpus")
    assert notice["seq"] < fact["seq"]
    assert notice["source"] == "hub" and notice["pid"] > 0 and notice["t"] > 0
    assert notice["v"] == fact["v"] == records.SCHEMA_VERSION  # the hub stamps the schema on its own records
    assert log[-1]["kind"] == "run.end"


def test_the_runs_steps_are_its_lowest_ranks_so_a_node_without_rank_0_counts_its_own(short_dir, tmp_path):
    # Another node of a job hosts ranks 2 and 3, never rank 0: its summary's steps are rank 2's, not a 0.
    with running_hub(short_dir, tmp_path) as hub, raw_push(hub.in_endpoint) as push:
        # Rank 3 reports steps 1-3, rank 2 steps 1-5 with step 4 skipped: 5 steps, 1 skipped (not 3, nor 8).
        for step in range(1, 6):
            for rank in (3, 2) if step <= 3 else (2,):
                record = records.Step(step=step, rank=rank, skipped=step == 4, source="agent", pid=10 + rank)
                push.send_multipart([b"step", records.encode(record)])
        wait_for(lambda: hub.kinds.get("step") == 8, what="the eight step records")
        assert (hub.steps, hub.skipped_steps) == (5, 1)


def test_a_subscriber_listens_for_one_more_kind_and_stops_without_missing_the_kinds_it_had(
    short_dir, tmp_path
):
    with running_hub(short_dir, tmp_path, tick_s=0.05) as hub:
        with bus.Subscriber(hub.out_endpoint, kinds=["alert"]) as sub, raw_push(hub.in_endpoint) as push:
            # It had alerts: nothing to add, and nothing for stop_listening to take away
            assert not sub.listen_for("alert")
            assert sub.listen_for("tick")
            first = None
            deadline = time.monotonic() + 60
            while not isinstance(first, records.Tick) and time.monotonic() < deadline:
                first = sub.recv(timeout_s=1)
            assert isinstance(first, records.Tick)
            # In the hub's order: an alert published after the first tick received always comes.
            alert = records.Alert(rule="r", state="fired", message="m", source="engine", pid=7)
            push.send_multipart([b"alert", records.encode(alert)])
            sub.stop_listening("tick")
            sub.stop_listening("alert")  # not one listen_for added: stays
            seen = []
            deadline = time.monotonic() + 60
            # Twenty ticks' time after it stopped listening (a busy machine stretches it), then whatever is queued
            while (hub.ticks < first.n + 20 or len(seen) < 1) and time.monotonic() < deadline:
                record = sub.recv(timeout_s=0.1)
                if record is not None:
                    seen.append(record)
            while (record := sub.recv(timeout_s=0.2)) is not None:
                seen.append(record)
            alerts = [r for r in seen if isinstance(r, records.Alert)]
            assert len(alerts) == 1 and alerts[0].seq > first.seq
            # Ticks already on their way when it stopped listening may come, not the twenty after
            late_ticks = [r for r in seen if isinstance(r, records.Tick)]
            assert hub.ticks >= first.n + 20 and len(late_ticks) <= 5


def test_a_quiet_hub_polls_until_its_next_tick_without_spinning(short_dir, tmp_path, monkeypatch):
    """Between its ticks and stats a quiet hub's poll returns empty-handed about once per due time; with its timeout
    truncated to whole milliseconds it returned at once through each due time's last millisecond: 1,098 empty passes
    in a 12 s run (docs/performance.md, "Polls that did not wait")."""
    empty: list[int] = []
    poll = zmq.Poller.poll

    def counted(self, timeout=None):
        events = poll(self, timeout)
        if not events and threading.current_thread().name != "MainThread":
            empty.append(timeout)
        return events

    monkeypatch.setattr(zmq.Poller, "poll", counted)
    with running_hub(short_dir, tmp_path, stats_every_s=0.5) as hub:
        wait_for(lambda: hub.ticks >= 1, what="the first tick")
        empty.clear()
        time.sleep(2.0)  # two ticks and four stats due: about six empty returns, a few more on a slow machine
        passes = len(empty)
    assert passes <= 20, passes
