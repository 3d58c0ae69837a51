"""The hub and blocks: a good block is numbered as the records it stands for, written as one line ending with its last
row's seq, published alone with its first row's seq and counted as its rows; a malformed one (columns that disagree,
wrong types, times that are not finite, a ``rows`` that lies, no rows, bytes cut short) is refused with one line and
counted malformed, and neither the hub nor the recorder stops. A node forwards a block as it is and the job hub logs it.

Real zmq sockets on ipc (and loopback tcp for the job); frames come from a plain PUSH so the tests control every byte.
"""

from __future__ import annotations

import contextlib
import json
import random

import msgspec
import zmq
from deadline import wait_for
from steady_blocks import malformed_block, steady_block
from test_hub import raw_push, raw_sub, running_hub
from test_job_link import NODE, _joined, free_port, job_hub, node_hub
from tm_runs import log_records

from trainmeter_core.bus import client as bus
from trainmeter_core.bus import jobkeys
from trainmeter_core.bus import jobwire as wire
from trainmeter_core.model import records
from trainmeter_core.runlog.reader import read_log

SEED = 4242
GARBAGE_BLOCKS = 10_000


def _note(n: int) -> records.Notice:
    return records.Notice(topic="blocks", message=f"after {n}", source="test", host="h", pid=1)


def test_a_block_is_numbered_as_its_rows_logged_as_one_line_and_published_alone_with_its_first_rows_seq(
    short_dir, tmp_path
):
    block = steady_block(1, 10)  # 10 steps, 30 rows
    payload = records.encode(block)
    with (
        running_hub(short_dir, tmp_path) as hub,
        raw_sub(hub.out_endpoint) as sub,
        bus.Subscriber(hub.out_endpoint, blocks=True) as subscriber,
        raw_push(hub.in_endpoint) as push,
    ):
        wait_for(lambda: len(hub.topics) >= 1, what="the subscriptions")
        push.send_multipart([b"notice", records.encode(_note(0))])
        wait_for(lambda: hub.seq >= 1, what="the first record")
        first = hub.seq + 1
        push.send_multipart([bus.BATCH_TOPIC, records.encode_many([block, _note(1)])])
        wait_for(lambda: hub.kinds.get("notice", 0) >= 2, what="the block and the record after it")
        messages = []
        while True:
            frames = sub.recv_multipart()
            messages.append(frames)
            if frames[0] == b"block":
                break
        # Alone, under its own topic, its first row's number, the producer's bytes unchanged.
        assert frames == [b"block", first.to_bytes(8, "big"), payload]
        after = sub.recv_multipart()
        # 30 rows numbered first .. first + 29: the record after it is first + 30
        assert int.from_bytes(after[1], "big") == first + 30
        seen = []
        while len(seen) < 3:
            record = subscriber.recv(5.0)
            assert record is not None
            seen.append(record)
        counts = dict(hub.kinds)
        # Two notices and the block's 30 rows, with whatever ticks and stats the hub added meanwhile: all published.
        assert hub.received == hub.published >= 32 and hub.malformed == 0 and hub.steps == 10
    # A subscriber that takes blocks whole gets the block with its own seq, its last row's.
    got = [r for r in seen if records.kind_of(r) == "block"]
    assert got and got[0].seq == first + 29 and got[0].step == block.step
    assert (counts["step"], counts["phase"], counts["metric"]) == (10, 10, 10)
    assert "block" not in counts  # counted as the records it stands for
    log = log_records(tmp_path, blocks=True)
    (line,) = [r for r in log if r["kind"] == "block"]
    assert line["seq"] == first + 29 and list(line)[-1] == "seq"
    assert [r["seq"] for r in log if r["kind"] == "notice"][:2] == [first - 1, first + 30]
    assert line["step"] == list(range(1, 11)) and line["rows"] == 30
    final = log[-2]
    assert final["kind"] == "bus.stats" and final["received"] == final["published"] + final["malformed"]
    assert final["malformed"] == 0


def test_the_bus_stats_count_a_blocks_rows_and_its_producers_drop_count(short_dir, tmp_path):
    with running_hub(short_dir, tmp_path) as hub, raw_push(hub.in_endpoint) as push:
        push.send_multipart([b"block", records.encode(steady_block(1, 100, rank=0, dropped=3))])
        push.send_multipart([b"block", records.encode(steady_block(101, 50, rank=0, dropped=5))])
        wait_for(lambda: hub.kinds.get("step", 0) == 150, what="both blocks")
        assert hub.steps == 150 and hub.skipped_steps == 0
        assert hub.received == hub.published == 450  # 3 rows a step
        assert hub.dropped == {"agent@h:7": 5}  # the last block's header is the producer's latest word
    log = [r for r in log_records(tmp_path, blocks=True) if r["kind"] == "block"]
    assert [r["seq"] for r in log] == [300, 450]


def test_ten_thousand_garbage_blocks_are_each_refused_and_the_hub_and_recorder_go_on(short_dir, tmp_path):
    rng = random.Random(SEED)
    print(f"seed={SEED}")
    whys: dict[str, int] = {}
    good_steps: list[int] = []
    with running_hub(short_dir, tmp_path) as hub, raw_push(hub.in_endpoint) as push:
        for i in range(GARBAGE_BLOCKS):
            why, payload = malformed_block(rng)
            whys[why] = whys.get(why, 0) + 1
            # Alone, or as the only record of a batch: either way one malformed record.
            push.send_multipart([b"block", payload] if i % 2 else [bus.BATCH_TOPIC, b"\x91" + payload])
            if i % 500 == 0:
                step = len(good_steps) + 1
                push.send_multipart([b"block", records.encode(steady_block(step, 2))])
                good_steps += [step, step + 1]
        wait_for(
            lambda: hub.malformed >= GARBAGE_BLOCKS and hub.kinds.get("step", 0) >= len(good_steps),
            what="every block",
            timeout_s=120,
        )
        assert "\n" not in (hub.last_malformed or "") and hub.last_malformed
        # The hub still serves: a good record after all of them is numbered and published.
        with raw_sub(hub.out_endpoint) as sub:
            wait_for(lambda: len(hub.topics) >= 1, what="the subscription")
            before = hub.seq
            push.send_multipart([b"notice", records.encode(_note(GARBAGE_BLOCKS))])
            frames = sub.recv_multipart()
            assert frames[0] == b"notice" and int.from_bytes(frames[1], "big") == before + 1
        assert hub._thread.is_alive() and hub.error is None
        assert hub.recorder._thread.is_alive() and hub.recorder.error is None
    print(f"kinds of garbage: {sorted(whys.items())}")
    assert hub.malformed == GARBAGE_BLOCKS
    stats: dict = {}
    logged = list(read_log(tmp_path, stats=stats, blocks=True))
    assert stats["skipped"] == 0
    assert [n for r in logged if records.kind_of(r) == "block" for n in r.step] == good_steps
    assert records.kind_of(logged[-1]) == "run.end"


def test_a_node_forwards_a_block_as_it_is_and_the_job_hub_logs_and_counts_it(tmp_path, short_dir):
    keys = jobkeys.create(tmp_path / "keys", "job")
    block = steady_block(1, 20, host=NODE)  # 60 rows
    with job_hub(short_dir, tmp_path / "hub", keys) as hub:
        with node_hub(short_dir, tmp_path / "node", hub.job.endpoint, tmp_path / "keys") as node:
            ctx = zmq.Context()
            push = ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 5000)
            push.connect(node.in_endpoint)
            push.send_multipart([b"block", records.encode(block)])
            push.send_multipart(
                [b"notice", records.encode(records.Notice(topic="t", message="m", host=NODE))]
            )
            push.close()
            ctx.term()
            wait_for(
                lambda: hub.kinds.get("notice", 0) >= 1 and hub.kinds.get("step") == 20, what="the block"
            )
            # The job hub counts its rows; the link counts what the node forwarded (the block is one of two).
            (link,) = hub.job.links.values()
            assert link.received == 2 and link.expect == 3
            assert (hub.kinds["phase"], hub.kinds["metric"]) == (20, 20)
            assert node.forwarder.head == 2
            # A node's steps are its own launcher's to count, never the job's.
            assert hub.steps == 0
    log = log_records(tmp_path / "hub", blocks=True)
    (line,) = [r for r in log if r["kind"] == "block"]
    assert line["host"] == NODE and line["step"] == list(range(1, 21)) and line["rows"] == 60
    notice = next(r for r in log if r["kind"] == "notice" and r.get("host") == NODE)
    # The block's numbers are its rows', no other record's; the node's next record comes after them, with nothing of
    # the node's between (a record of the job hub's own may be: a loaded CI run numbered one there).
    rows = set(range(line["seq"] - line["rows"] + 1, line["seq"] + 1))
    assert not rows & {r["seq"] for r in log if r is not line}
    between = [r for r in log if line["seq"] < r["seq"] < notice["seq"]]
    assert notice["seq"] > line["seq"] and not [r for r in between if r.get("host") == NODE], between
    assert records.from_log_line(json.dumps(line)).step == block.step


def test_a_node_may_not_forward_a_block_of_another_hosts_rows(tmp_path, short_dir):
    keys = jobkeys.create(tmp_path / "keys", "job")
    with job_hub(short_dir, tmp_path / "hub", keys) as hub:
        with node_hub(short_dir, tmp_path / "node", hub.job.endpoint, tmp_path / "keys") as node:
            with raw_push(node.in_endpoint) as push:
                push.send_multipart([b"block", records.encode(steady_block(1, 5, host="elsewhere"))])
                push.send_multipart([b"block", records.encode(steady_block(1, 5, host=NODE))])
            wait_for(lambda: hub.kinds.get("step") == 5 and hub.malformed == 1, what="both blocks")
    assert [r["host"] for r in log_records(tmp_path / "hub", blocks=True) if r["kind"] == "block"] == [NODE]


def test_a_block_of_a_newer_writer_is_kept_verbatim_and_one_with_a_nan_loss_logged_as_text(
    short_dir, tmp_path
):
    newer = records.to_builtins(steady_block(1, 2))
    newer["grad_norm"] = [0.5, 0.25]  # a column this version does not know
    nan = steady_block(3, 2)
    nan.loss[1] = float("nan")
    with running_hub(short_dir, tmp_path) as hub, raw_push(hub.in_endpoint) as push:
        push.send_multipart([b"block", msgspec.msgpack.encode(newer)])
        push.send_multipart([bus.BATCH_TOPIC, records.encode_many([nan, _note(1)])])
        wait_for(lambda: hub.kinds.get("notice"), what="both blocks")
        assert (hub.unknown, hub.malformed, hub.kinds["step"]) == (1, 0, 4)
    first, second = [r for r in log_records(tmp_path, blocks=True) if r["kind"] == "block"]
    assert first["grad_norm"] == [0.5, 0.25] and list(first)[-1] == "seq" and first["seq"] == 6
    assert second["loss"][1] == "NaN" and second["seq"] == 12


def test_garbage_blocks_from_a_node_are_each_counted_malformed_and_its_good_block_after_them_is_logged(
    tmp_path, short_dir
):
    keys = jobkeys.create(tmp_path / "keys", "job")
    rng = random.Random(SEED)
    # Only whole MessagePack values: bytes cut short would break the array of a recs message, not be one bad record.
    bad = []
    while len(bad) < 2000:
        payload = malformed_block(rng, host=NODE)[1]
        with contextlib.suppress(records.MalformedRecord):
            if [bytes(raw) for raw in records.split_batch(wire.group([payload]))] == [payload]:
                bad.append(payload)
    good = records.encode(steady_block(1, 3, host=NODE))
    ctx = zmq.Context()
    try:
        with job_hub(short_dir, tmp_path / "hub", keys) as hub:
            sock, monitor = _joined(ctx, hub, keys)
            # Forwarding numbers count what the node forwards, a block one: 2000 garbage blocks are 1 .. 2000.
            for first in range(0, len(bad), 500):
                sock.send_multipart([wire.RECS, wire.number(first + 1), wire.group(bad[first : first + 500])])
            sock.send_multipart([wire.RECS, wire.number(len(bad) + 1), wire.group([good])])
            (link,) = hub.job.links.values()
            wait_for(lambda: link.expect == len(bad) + 2, what="the good block after the garbage")
            assert link.malformed == len(bad) and hub.malformed == len(bad)
            assert hub.kinds.get("step") == 3 and "\n" not in hub.last_malformed
            monitor.close()
            sock.close()
    finally:
        ctx.destroy(linger=0)
    (line,) = [r for r in log_records(tmp_path / "hub", blocks=True) if r["kind"] == "block"]
    assert line["step"] == [1, 2, 3] and line["host"] == NODE


def test_blocks_past_the_resend_buffers_bytes_are_told_as_a_gap_and_the_newest_arrive(tmp_path, short_dir):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    keys = jobkeys.create(tmp_path / "keys", "job")
    blocks = [records.encode(steady_block(1 + 100 * i, 100, host=NODE)) for i in range(5)]
    # Room for two of the five blocks by their bytes (the count bound, a million, is far): three fall out.
    room = 2 * max(len(b) for b in blocks) + 100
    assert room < 3 * min(len(b) for b in blocks)
    with node_hub(short_dir, tmp_path / "node", endpoint, tmp_path / "keys", max_bytes=room) as node:
        with raw_push(node.in_endpoint) as push:
            for block in blocks:
                push.send_multipart([b"block", block])
        wait_for(lambda: node.forwarder.overflowed == 3, what="three blocks out of the resend buffer")
        with job_hub(short_dir, tmp_path / "hub", keys, endpoint=endpoint) as hub:
            wait_for(lambda: node.forwarder.pending() == 0, what="the two blocks held acknowledged")
            assert hub.kinds.get("step") == 200
    log = log_records(tmp_path / "hub", blocks=True)
    (gap,) = [r for r in log if r["kind"] == "node" and r["event"] == "gap"]
    assert gap["lost"] == 3 and gap["through"] == 0  # counted in forwarded records: three blocks
    assert [r["step"][0] for r in log if r["kind"] == "block"] == [301, 401]
