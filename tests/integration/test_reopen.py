"""Reopening a run's log for its next attempt: where it ends (a last line cut by SIGKILL, a checkpoint ahead of the
log), a new segment that leaves the old ones byte for byte, sequence numbers and ticks that go on, and the checkpoints
the run wrote."""

from __future__ import annotations

import hashlib

from deadline import wait_for
from test_hub import END, running_hub

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.runlog.checkpoint import checkpoint_through_seq, save_checkpoint
from trainmeter_core.runlog.reader import read_log
from trainmeter_core.runlog.recorder import Recorder
from trainmeter_core.runlog.reopen import checkpoint_paths, log_end


def _data(record: records.Record, seq: int) -> dict:
    data = records.check(records.encode(record)).data
    data["seq"] = seq
    return data


def write_log(run_dir, logged, first_segment=1, **kw):
    recorder = Recorder(run_dir, reserve_b=0, first_segment=first_segment, **kw)
    recorder.start()
    for seq, record in logged:
        recorder.put(_data(record, seq))
    recorder.close()
    return recorder


def test_the_end_of_a_log_cut_by_sigkill_is_its_last_whole_record(tmp_path):
    write_log(
        tmp_path,
        [
            (1, records.Tick(n=1, interval_s=1.0)),
            (2, records.Step(step=1)),
            (3, records.Tick(n=2, interval_s=1.0)),
        ],
    )
    with open(tmp_path / "events-0001.jsonl", "ab") as f:
        f.write(b'{"kind":"step","step":2,"se')  # the line being written when the launcher was killed
    end = log_end(tmp_path)
    assert (end.last_seq, end.last_tick, end.next_segment, end.ended) == (3, 2, 2, False)


def test_numbering_goes_on_after_a_checkpoint_ahead_of_the_log(tmp_path):
    # The engine saw records 1..7 on the bus and checkpointed them; the recorder had written 1..3 when all was killed.
    write_log(
        tmp_path,
        [(1, records.Tick(n=1, interval_s=1.0)), (2, records.Step(step=1)), (3, records.Step(step=2))],
    )
    save_checkpoint(tmp_path, Engine(), 7)
    assert checkpoint_through_seq(tmp_path) == 7
    assert log_end(tmp_path).last_seq == 7


def test_a_finished_log_says_it_ended(tmp_path):
    write_log(tmp_path, [(1, records.Step(step=1)), (2, END)])
    assert log_end(tmp_path).ended


def test_the_next_attempt_writes_a_segment_of_its_own_and_leaves_the_others_byte_for_byte(tmp_path):
    write_log(tmp_path, [(n, records.Step(step=n)) for n in range(1, 301)], segment_limit_b=4000)
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.glob("events-*")}
    end = log_end(tmp_path)
    assert end.next_segment == len(before) + 1 > 2  # rotated: several segments, the last one plain
    write_log(tmp_path, [(n, records.Step(step=n)) for n in range(301, 311)], first_segment=end.next_segment)
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.glob("events-*")}
    assert {k: after[k] for k in before} == before
    assert set(after) - set(before) == {f"events-{end.next_segment:04d}.jsonl"}
    assert [r.step for r in read_log(tmp_path)] == list(range(1, 311))


def test_a_hub_that_goes_on_with_a_log_numbers_and_ticks_after_it(short_dir, tmp_path):
    with running_hub(short_dir, tmp_path, after_seq=41, after_tick=9) as hub:
        hub.inject(records.Notice(topic="launcher", message="attempt 2"))
        wait_for(lambda: hub.ticks >= 10, what="the first tick")
    logged = list(read_log(tmp_path))
    assert logged[0].seq == 42 and isinstance(logged[0], records.Notice)
    ticks = [r.n for r in logged if isinstance(r, records.Tick)]
    assert ticks[0] == 10  # 9 + 1: a resumed run's ticks never repeat


def test_the_checkpoints_a_run_wrote_are_read_from_its_last_segment_that_has_one(tmp_path):
    def saved(path, seq):
        return seq, records.Phase(phase="checkpoint", start_t=1.0, end_t=2.0, paths=[path], step=seq)

    write_log(
        tmp_path,
        [
            saved("/ckpt/step-50.pt", 1),
            saved("/ckpt/step-100.pt", 2),
            *[(n, records.Step(step=n)) for n in range(3, 200)],
        ],
        segment_limit_b=1500,
    )
    # The last segments hold steps only: the reader goes back to the first segment, and no further than needed; but
    # only so far: a checkpoint older than the last three segments (hours of a run) is not looked for.
    assert checkpoint_paths(tmp_path, max_segments=100) == ["/ckpt/step-50.pt", "/ckpt/step-100.pt"]
    assert len(list(tmp_path.glob("events-*"))) > 3
    assert checkpoint_paths(tmp_path) == []
    empty = tmp_path / "empty"
    empty.mkdir()
    assert checkpoint_paths(empty) == []
