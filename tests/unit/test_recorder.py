"""The recorder: segments rotated at a size and gzipped once closed, a free-space reserve, a fsynced end.

Records are put as the hub puts them (checked mappings carrying their seq); the log is read back with read_log.
"""

from __future__ import annotations

import gzip
import math
import os
import sys

import pytest
from steady_blocks import steady_block

from trainmeter_core.bus.sample_intake import typed_sample
from trainmeter_core.model import records
from trainmeter_core.runlog.reader import read_log
from trainmeter_core.runlog.recorder import Recorder, block_line


def _data(record: records.Record, seq: int) -> dict:
    data = records.check(records.encode(record)).data
    data["seq"] = seq
    return data


def test_segments_rotate_at_the_limit_closed_ones_are_gzipped_and_all_read_back_in_order(tmp_path):
    recorder = Recorder(tmp_path, segment_limit_b=2000, reserve_b=0)
    recorder.start()
    for seq in range(1001, 1301):
        # '{"kind":"step","source":"agent","step":1001,"seq":1001}\n' is 56 bytes for every 4-digit step and seq.
        assert recorder.put(_data(records.Step(step=seq, source="agent"), seq))
    recorder.close()
    # 35 lines are 1960 B < 2000, 36 are 2016 B: a segment closes after 36 lines. 300 = 8 × 36 + 12: 8 closed
    # segments, and the 9th (still plain) holds the last 12 lines.
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"events-{n:04d}.jsonl.gz" for n in range(1, 9)] + ["events-0009.jsonl"]
    assert recorder.segments == 9
    for n in range(1, 9):
        assert len(gzip.decompress((tmp_path / f"events-{n:04d}.jsonl.gz").read_bytes())) == 36 * 56
    assert (tmp_path / "events-0009.jsonl").stat().st_size == 12 * 56
    assert recorder.bytes_written == 300 * 56
    stats: dict = {}
    back = list(read_log(tmp_path, stats=stats))
    assert [r.step for r in back] == list(range(1001, 1301))
    assert [r.seq for r in back] == list(range(1001, 1301))
    assert stats["skipped"] == 0


def test_below_the_reserve_only_run_step_block_fact_and_alert_are_kept_and_the_rest_counted(tmp_path):
    warnings = []
    # A reserve of 2**62 B (4 EiB) is more than any disk has free: the recorder is below it from the start.
    recorder = Recorder(tmp_path, reserve_b=2**62, warn=warnings.append)
    logged = [
        records.RunStart(
            run_id="r",
            name="n",
            run_dir=str(tmp_path),
            command=["x"],
            cwd="/",
            tm_version="0",
            python="3",
            platform="p",
        ),
        records.Hello(protocol=1, agent_version="0", python="3", executable="python", argv=[], ppid=1),
        records.Step(step=1),
        steady_block(2, 2),  # steps, with their losses and data waits: one line, kept whole
        records.Metric(values={"loss": 1.0}),
        records.SampleGpu(index=0),
        records.Fact(name="gpus", value=1, provenance="detected", origin="nvml"),
        records.Tick(n=1, interval_s=1.0),
        records.Alert(rule="stall", state="fired", message="m"),
        records.Notice(topic="t", message="m"),
        records.RunEnd(status=0, reason="exited", elapsed_s=1.0),
    ]
    seq = 0
    for record in logged:
        seq += record.rows if isinstance(record, records.Block) else 1  # a block is numbered as its rows
        if isinstance(
            record, records.SampleGpu
        ):  # as the job hub takes one: typed, its line made on the hub's thread
            assert recorder.put_record(typed_sample(records.encode(record)), "sample.gpu", seq)
        else:
            recorder.put(_data(record, seq))
    recorder.start()
    recorder.close()
    kept = [records.kind_of(r) for r in read_log(tmp_path, blocks=True)]
    assert kept == ["run.start", "step", "block", "fact", "alert", "run.end"]
    # hello, metric, sample.gpu, tick and notice: 5 skipped.
    assert recorder.reserve_skipped == 5
    assert recorder.reserve_active is True
    assert len(warnings) == 1 and "free space" in warnings[0]
    assert (
        recorder.flushed_seq == 16
    )  # the skipped ones count as handled (the block is 6 rows: 11 records, 16 seqs)


def test_the_end_is_flushed_and_fsynced_and_flushed_seq_is_the_last_seq(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    recorder = Recorder(tmp_path, reserve_b=0)
    recorder.start()
    for seq in range(1, 51):
        recorder.put(_data(records.Step(step=seq), seq))
    recorder.close()
    assert recorder.flushed_seq == 50
    assert synced and synced[-1] == str(tmp_path / "events-0001.jsonl")
    assert len((tmp_path / "events-0001.jsonl").read_bytes().splitlines()) == 50


def test_a_full_queue_drops_and_counts_without_blocking(tmp_path):
    recorder = Recorder(tmp_path, reserve_b=0, queue_limit=5)
    taken = [recorder.put(_data(records.Step(step=i), i)) for i in range(1, 9)]
    # 8 offered to a queue of 5 that nobody drains yet: 5 taken, 3 dropped.
    assert taken == [True] * 5 + [False] * 3
    assert recorder.queue_dropped == 3
    recorder.start()
    recorder.close()
    assert [r.step for r in read_log(tmp_path)] == [1, 2, 3, 4, 5]


def test_a_block_weighs_its_rows_in_the_queue_and_a_dropped_one_counts_them(tmp_path):
    recorder = Recorder(tmp_path, reserve_b=0, queue_limit=10)
    first, second, third = steady_block(1, 3), steady_block(4, 1), steady_block(5, 1)
    first.seq, second.seq, third.seq = 9, 12, 15
    # 9 rows in a queue of 10: the next block still goes in (12 rows), the one after finds the queue full.
    assert recorder.put_block(first) and recorder.put_block(second)
    assert not recorder.put_block(third) and recorder.queue_dropped == 3
    assert not recorder.put(_data(records.Step(step=9), 16)) and recorder.queue_dropped == 4
    recorder.start()
    recorder.close()
    assert [r.seq for r in read_log(tmp_path, blocks=True)] == [9, 12]
    assert recorder.put(_data(records.Step(step=9), 16))  # written: the queue is empty again


def test_nonfinite_metric_values_are_written_as_text_and_read_back_as_floats(tmp_path):
    recorder = Recorder(tmp_path, reserve_b=0)
    recorder.start()
    recorder.put(_data(records.Metric(values={"loss": math.nan, "scale": math.inf}), 1))
    recorder.close()
    line = (tmp_path / "events-0001.jsonl").read_text()
    assert '"values":{"loss":"NaN","scale":"Infinity"}' in line
    (metric,) = read_log(tmp_path)
    assert math.isnan(metric.values["loss"]) and metric.values["scale"] == math.inf


def test_a_block_is_one_line_of_number_arrays_ending_with_its_last_seq_its_nan_loss_as_text(tmp_path):
    block = steady_block(1, 3)
    block.loss[1] = math.nan
    recorder = Recorder(tmp_path, reserve_b=0)
    recorder.start()
    recorder.put(_data(block, 9))  # 9 rows, numbered 1 .. 9
    recorder.close()
    (line,) = (tmp_path / "events-0001.jsonl").read_bytes().splitlines()
    assert line.startswith(b'{"kind":"block"') and line.endswith(b',"seq":9}')
    assert b'"step":[1,2,3]' in line and b'"loss":[3.0,"NaN",' in line
    (back,) = read_log(tmp_path, blocks=True)
    assert back.seq == 9 and back.step == [1, 2, 3] and math.isnan(back.loss[1])
    assert recorder.flushed_seq == 9


@pytest.mark.parametrize("where", ["finite", "nan loss", "inf loss", "nan metric", "huge losses", "no loss"])
def test_a_typed_blocks_line_is_the_line_of_the_mapping_it_came_from(where):
    block = steady_block(1, 3)
    if where == "nan loss":
        block.loss[0] = math.nan
    elif where == "inf loss":
        block.loss[2] = -math.inf
    elif where == "huge losses":
        block.loss = [1e308, 1e308, 1e308]  # finite, though their sum is not
    elif where == "no loss":
        block.loss, block.loss_t, block.rows = [None] * 3, [None] * 3, 6
    elif where == "nan metric":
        block.order += "m"
        block.rows += 1
        block.metric_t, block.metric_values = [101.0], [{"lr": 0.1, "grad_norm": math.nan}]
        block.metric_step, block.metric_origin = [3], ["emit"]
    records.block.validate(block)
    expected = records.to_log_line(_data(block, 42))
    block.seq = 42  # as the hub numbers a block it decoded typed (Recorder.put_block)
    assert block_line(block) == expected
    assert block.seq == 42  # left as it was


def test_a_typed_block_is_written_beside_mappings_in_seq_order(tmp_path):
    recorder = Recorder(tmp_path, reserve_b=0)
    recorder.start()
    recorder.put(_data(records.Step(step=1), 1))
    block = steady_block(2, 2)
    block.seq = 7  # its 6 rows: 2 .. 7
    assert recorder.put_block(block)
    recorder.put(_data(records.Step(step=4), 8))
    recorder.close()
    assert [r.seq for r in read_log(tmp_path, blocks=True)] == [1, 7, 8]
    assert recorder.flushed_seq == 8


def test_a_typed_block_leaves_its_line_in_the_queue_and_is_free_as_soon_as_it_is_put(tmp_path):
    # The queue keeps the block's line, not the block (its lists would stay in the garbage collector's lists for as
    # long as it waits): a change to the block after put_block is not in the log, and nothing holds it.
    recorder = Recorder(tmp_path, reserve_b=0)
    block = steady_block(1, 2)
    block.seq = 6
    expected = block_line(block)
    references = sys.getrefcount(block)
    assert recorder.put_block(block)
    assert sys.getrefcount(block) == references
    block.step[0], block.loss[1] = 99, 7.5
    recorder.start()
    recorder.close()
    assert (tmp_path / "events-0001.jsonl").read_bytes() == expected
    assert recorder.flushed_seq == 6


def test_a_flush_asked_for_writes_everything_queued_at_once_instead_of_at_the_next_batch(
    tmp_path, monkeypatch
):
    from trainmeter_core.runlog import recorder as recorder_mod

    monkeypatch.setattr(recorder_mod, "FLUSH_EVERY_S", 3600.0)  # batches that never come due by themselves
    recorder = Recorder(tmp_path, reserve_b=0)
    recorder.start()
    try:
        for seq in (1, 2, 3):
            recorder.put(_data(records.Step(step=seq), seq))
        assert recorder.flush(timeout_s=30.0)
        assert recorder.flushed_seq == 3
        # flushed means in the file, where a reader sees it
        assert [r.step for r in read_log(tmp_path)] == [1, 2, 3]
    finally:
        recorder.close()


def test_a_flush_of_nothing_queued_returns_at_once_and_one_without_a_writer_says_so(tmp_path):
    recorder = Recorder(tmp_path, reserve_b=0)
    assert recorder.flush(timeout_s=0.0)  # nothing was queued
    recorder.put(_data(records.Step(step=1), 1))
    assert not recorder.flush(timeout_s=0.0)  # never started: nothing will write it
