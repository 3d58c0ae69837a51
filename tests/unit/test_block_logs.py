"""A run log holding blocks: whoever reads ``step``, ``metric`` or ``phase`` records gets them as if each had been
logged alone (each once, in order, with its own seq), bounded reads cut a block at their bounds, the log's tail and
last sequence number read through a block line, and a log of old records and blocks replays to the snapshots of the
same log with every block replaced by its rows.

Logs are written here as the recorder writes them (the tag first, the hub's ``seq`` last), from ``tests/blocks.py``'s
synthetic run; a block's ``seq`` is its last row's.
"""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path

import msgspec
import pytest
from blocks import block_of, blockify, expanded, log_line, same, training_run
from test_replay_unchanged import LOGS

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.runlog import replay
from trainmeter_core.runlog.checkpoint import save_checkpoint
from trainmeter_core.runlog.handover import HandOver
from trainmeter_core.runlog.reader import read_log, read_segment
from trainmeter_core.runlog.tail import TAIL_B, last_seq, tail_records


def write_log(run_dir: Path, log: list, per_segment: int | None = None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    per_segment = per_segment or len(log)
    for n, at in enumerate(range(0, len(log), per_segment), start=1):
        (run_dir / f"events-{n:04d}.jsonl").write_bytes(
            b"".join(log_line(r) for r in log[at : at + per_segment])
        )
    return run_dir


@pytest.fixture
def run(tmp_path):
    """A 300-step run (a NaN loss at step 40) logged with its rows in blocks of at most 50 records, the same log with
    every block as its rows, and the two run directories."""
    rows = training_run(300, nan_at=40)
    blocked = blockify(rows, at_most=50)
    assert sum(type(item) is records.Block for item in blocked) >= 20 and expanded(blocked) == rows
    return rows, blocked, write_log(tmp_path / "blocks", blocked), write_log(tmp_path / "rows", rows)


def seqs(got) -> list[int]:
    return [record.seq for record in got]


def test_a_reader_of_steps_gets_each_step_of_a_block_log_once_in_order_with_its_seq(run):
    rows, _, blocks_dir, _ = run
    steps = list(read_log(blocks_dir, kinds={"step"}))
    assert [s.step for s in steps] == list(range(1, 301))
    assert seqs(steps) == [r.seq for r in rows if type(r) is records.Step]
    assert steps == [r for r in rows if type(r) is records.Step]


@pytest.mark.parametrize(
    "kinds", [None, {"step"}, {"metric"}, {"phase"}, {"step", "tick"}, {"metric", "run.end"}, {"tick"}]
)
def test_every_kind_asked_for_comes_from_a_block_log_as_from_the_log_of_rows(run, kinds):
    _, _, blocks_dir, rows_dir = run
    stats_blocks: dict = {}
    stats_rows: dict = {}
    assert same(read_log(blocks_dir, kinds, stats_blocks), read_log(rows_dir, kinds, stats_rows))
    assert stats_blocks["last_seq"] == stats_rows["last_seq"]
    assert stats_blocks["skipped"] == stats_blocks["unknown"] == 0


def test_asking_for_blocks_gets_them_as_they_are(run):
    _, blocked, blocks_dir, _ = run
    assert same(read_log(blocks_dir, blocks=True), blocked)
    assert same(read_log(blocks_dir, kinds={"block"}), [b for b in blocked if type(b) is records.Block])
    # The engine's kinds include "block": a replay takes them whole.
    assert same(read_log(blocks_dir, replay.FED_KINDS), blocked)


def straddling(blocked: list) -> records.Block:
    return next(item for item in blocked if type(item) is records.Block and item.seq > 400 and item.rows > 10)


@pytest.mark.parametrize("kinds", [None, {"step"}, {"metric", "tick"}])
@pytest.mark.parametrize("inside", ["after", "before", "both"])
def test_a_read_bounded_inside_a_block_gets_only_its_rows_inside_the_bounds(run, kinds, inside):
    rows, blocked, blocks_dir, _ = run
    block = straddling(blocked)
    first = block.seq - block.rows + 1
    after = first + 3 if inside in ("after", "both") else first - 40
    before = block.seq - 2 if inside in ("before", "both") else block.seq + 40
    want = [r for r in rows if after < r.seq < before and (kinds is None or records.kind_of(r) in kinds)]
    got = list(read_log(blocks_dir, kinds, after_seq=after, before_seq=before))
    assert same(got, want) and seqs(got) == sorted(set(seqs(got)))


@pytest.mark.parametrize("inside", ["after", "before"])
def test_a_bulk_read_gets_a_block_cut_by_its_bounds_as_its_rows_inside_them_and_the_others_whole(run, inside):
    rows, blocked, blocks_dir, _ = run
    block = straddling(blocked)
    first = block.seq - block.rows + 1
    after, before = (first + 5, block.seq + 200) if inside == "after" else (first - 200, first + 5)
    got = list(read_log(blocks_dir, after_seq=after, before_seq=before, blocks=True))
    assert not any(type(item) is records.Block and item.seq == block.seq for item in got)
    assert same(expanded(got), [r for r in rows if after < r.seq < before])
    assert any(type(item) is records.Block for item in got)


def test_a_bounded_read_that_starts_in_a_later_segment_finds_a_block_that_straddles_its_first_line(tmp_path):
    rows = training_run(200)
    blocked = blockify(rows, at_most=50)
    # Small segments, so the read skips whole ones by their first sequence number.
    run_dir = write_log(tmp_path, blocked, per_segment=5)
    for item in blocked:
        if type(item) is records.Block and item.seq > 300:
            after = item.seq - item.rows + 2  # its second row
            break
    stats: dict = {}
    assert same(read_log(run_dir, after_seq=after, stats=stats), [r for r in rows if r.seq > after])


def test_the_logs_tail_reads_a_block_as_its_rows_and_its_last_seq_is_the_blocks_last_row(run):
    rows, blocked, blocks_dir, _ = run
    last_block = [b for b in blocked if type(b) is records.Block][-1]
    tail = tail_records(blocks_dir)
    assert same(tail, rows[-len(tail) :])
    assert same([b for b in tail_records(blocks_dir, blocks=True) if b.seq == last_block.seq], [last_block])
    assert last_seq(blocks_dir) == rows[-1].seq


def test_a_block_line_longer_than_the_tail_read_still_gives_the_last_seq(tmp_path):
    rows = [r for r in training_run(3000) if records.kind_of(r) in records.ROW_KINDS]
    for seq, row in enumerate(rows, start=1):
        row.seq = seq
    big = block_of(rows)  # 3,000 steps in one line
    assert len(log_line(big)) > TAIL_B
    write_log(tmp_path, [big])
    assert last_seq(tmp_path) == rows[-1].seq == big.seq
    assert same(tail_records(tmp_path), expanded([big]))


def test_a_segment_read_for_its_phases_gets_those_of_its_blocks(run):
    rows, _, blocks_dir, _ = run
    got = list(read_segment(blocks_dir / "events-0001.jsonl", kinds={"phase"}))
    assert same(got, [r for r in rows if type(r) is records.Phase])


def test_a_log_of_old_records_and_blocks_replays_to_the_snapshots_of_the_same_log_of_rows(run):
    rows, _, blocks_dir, rows_dir = run
    by_block = [records.encode(s) for s in replay.snapshots(blocks_dir)]
    by_row = [records.encode(s) for s in replay.snapshots(rows_dir)]
    assert by_block == by_row and len(by_block) == 300 // 25 + 1
    engine_block, last_block = replay.replay_engine(blocks_dir)
    engine_row, last_row = replay.replay_engine(rows_dir)
    assert records.encode(last_block) == records.encode(last_row)
    assert engine_block.state_bytes() == engine_row.state_bytes()
    assert engine_block.state.loss_nonfinite == 1  # step 40's NaN, kept through the log's "NaN" text


def test_a_replay_from_a_checkpoint_inside_a_block_feeds_only_the_rows_after_it(run):
    rows, blocked, blocks_dir, rows_dir = run
    block = straddling(blocked)
    through = block.seq - block.rows // 2
    engine = Engine()
    for row in rows:
        if row.seq <= through:
            engine.feed(row)
    save_checkpoint(blocks_dir, engine, through)
    resumed, last = replay.replay_engine(blocks_dir)
    whole, last_whole = replay.replay_engine(rows_dir, use_checkpoint=False)
    assert records.encode(last) == records.encode(last_whole)
    assert resumed.state_bytes() == whole.state_bytes()


def test_a_hand_over_to_a_live_block_reads_the_log_up_to_its_first_row(run):
    rows, blocked, blocks_dir, _ = run
    block = straddling(blocked)
    later = deque(blocked[blocked.index(block) :])
    handover = HandOver(blocks_dir, lambda timeout_s: later.popleft() if later else None, threading.Event())
    assert handover.wait_first_live() and handover.first_live == block.seq - block.rows + 1
    assert handover.wait_for_log()
    logged = list(handover.from_log(after_seq=100, blocks=True))
    assert same(expanded(logged), [r for r in rows if 100 < r.seq < handover.first_live])


def test_a_hand_over_to_a_live_row_inside_a_block_reads_the_blocks_rows_before_it(run):
    rows, blocked, blocks_dir, _ = run
    block = straddling(blocked)
    live_steps = deque(r for r in records.block.expand(block) if type(r) is records.Step)
    handover = HandOver(
        blocks_dir, lambda timeout_s: live_steps.popleft() if live_steps else None, threading.Event()
    )
    assert handover.wait_first_live() and handover.first_live > block.seq - block.rows + 1
    assert handover.wait_for_log()
    assert same(handover.from_log(after_seq=100), [r for r in rows if 100 < r.seq < handover.first_live])


@pytest.mark.parametrize("name", sorted(LOGS))
def test_a_fixture_logs_rows_in_blocks_replay_to_the_snapshots_of_the_same_rows(tmp_path, name):
    logged = list(read_log(LOGS[name]))
    # Exactly: the rows whose walls a block's one shift gives back (the H200 logs hold some), so the log of blocks
    # stands for the fixture itself and replays to its snapshots.
    exact = blockify(logged)
    assert same(expanded(exact), logged)
    write_log(tmp_path / "exact", exact)
    want = [records.encode(s) for s in replay.snapshots(LOGS[name])]
    assert [records.encode(s) for s in replay.snapshots(tmp_path / "exact")] == want
    # Every steady row in a block, its wall moved onto its block's shift: replays as the same rows logged alone.
    rewalled = blockify(logged, rewall=True)
    rows = expanded(rewalled)
    assert sum(b.rows for b in rewalled if type(b) is records.Block) * 2 > sum(
        records.kind_of(r) in records.ROW_KINDS for r in rows
    )
    write_log(tmp_path / "blocks", rewalled)
    write_log(tmp_path / "rows", rows)
    by_block = [records.encode(s) for s in replay.snapshots(tmp_path / "blocks")]
    assert by_block == [records.encode(s) for s in replay.snapshots(tmp_path / "rows")] and len(by_block) > 1


def test_the_live_engine_fed_blocks_makes_the_snapshots_a_replay_of_their_log_makes(run):
    from trainmeter_core.components.engine import LiveEngine

    _, blocked, blocks_dir, _ = run
    live = LiveEngine()
    published = [out for item in blocked for out in live.feed(item) if type(out) is records.Snapshot]
    replayed = list(replay.snapshots(blocks_dir))
    assert [records.encode(s) for s in published] == [records.encode(s) for s in replayed]
    assert published[-1].final and live.through_seq == blocked[-1].seq


def test_a_block_whose_columns_disagree_with_its_rows_is_skipped_and_counted_and_the_rest_read(tmp_path):
    rows = training_run(60)
    blocked = blockify(rows, at_most=30)
    bad = [i for i, item in enumerate(blocked) if type(item) is records.Block][1:3]
    lying = msgspec.structs.replace(blocked[bad[0]], rows=blocked[bad[0]].rows + 1)
    short = msgspec.structs.replace(blocked[bad[1]], step_t=blocked[bad[1]].step_t[:-1])
    log = list(blocked)
    log[bad[0]], log[bad[1]] = lying, short
    write_log(tmp_path, log)
    kept = [row for i, item in enumerate(blocked) if i not in bad for row in expanded([item])]
    for blocks in (False, True):
        stats: dict = {}
        assert same(expanded(read_log(tmp_path, stats=stats, blocks=blocks)), kept)
        assert stats["skipped"] == 2 and stats["reasons"] == {"block": 2}
    stats = {}
    engine, last = replay.replay_engine(tmp_path, stats)
    assert stats["skipped"] == 2 and last is not None and last.final
