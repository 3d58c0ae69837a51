"""Replay from the engine's checkpoint: ``tm view --json`` of a million-record log decodes only the records after the
checkpoint, and prints what the engine fed every record would show.

The log is written here line by line, as the recorder writes it (the hub's ``seq`` last, closed segments gzipped), in
small segments so the reader has whole segments to skip; the engine at the checkpoint is fed the same records in
memory.
"""

from __future__ import annotations

import gzip
import json

import msgspec
import pytest

from trainmeter_core.commands.cli import main as tm
from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.runlog import reader
from trainmeter_core.runlog.checkpoint import save_checkpoint

RECORDS = 1_000_000
PER_SEGMENT = 100_000
CHECKPOINT_SEQ = 899_000  # in segment 9 (seq 800,001 to 900,000): the tail starts in a compressed segment
WALL0 = 1_700_000_000.0


TICK = b'{"v":2,"kind":"tick","t":%r,"wall":%r,"source":"hub","host":"h","pid":1,"n":%d,"interval_s":1.0,"seq":%d}\n'
STEP = b'{"v":2,"kind":"step","t":%r,"wall":%r,"source":"agent","host":"h","pid":7,"step":%d,"tokens_global":1024,"seq":%d}\n'  # noqa: E501
LOSS = b'{"v":2,"kind":"metric","t":%r,"wall":%r,"source":"agent","host":"h","pid":7,"values":{"train_loss":%r},"step":%d,"seq":%d}\n'  # noqa: E501


def line_of(seq: int) -> bytes:
    """Line ``seq`` of the log as the recorder writes it (the hub appends ``seq`` last): a step and its loss in turn,
    and a tick after every 200 records (100 steps)."""
    t, wall = seq * 0.005, WALL0 + seq * 0.005
    if seq % 200 == 0:
        return TICK % (t, wall, seq // 200, seq)
    if seq % 2:
        return STEP % (t, wall, seq // 2 + 1, seq)
    return LOSS % (t, wall, 10.0 / seq, seq // 2, seq)


@pytest.mark.xdist_group("heavy")
def test_tm_view_json_of_a_million_records_from_its_checkpoint_decodes_only_the_tail(
    tmp_path, capsys, monkeypatch
):
    run_dir = tmp_path / "20260101T000000Z-host-long"
    run_dir.mkdir()
    (run_dir / "meta.json").write_text(
        json.dumps({"run_id": run_dir.name, "name": "long", "command": ["x.py"]})
    )
    engine = Engine()
    for k in range(RECORDS // PER_SEGMENT):
        first = k * PER_SEGMENT + 1
        lines = []
        for seq in range(first, first + PER_SEGMENT):
            line = line_of(seq)
            lines.append(line)
            # The engine at the checkpoint is fed the same records; the last one (a tick) makes the last snapshot.
            made = engine.feed(records.from_log_line(line), snapshots=seq == RECORDS)
            if seq == CHECKPOINT_SEQ:
                save_checkpoint(run_dir, engine, seq)
        name = f"events-{k + 1:04d}.jsonl"
        if k < RECORDS // PER_SEGMENT - 1:
            (run_dir / (name + ".gz")).write_bytes(gzip.compress(b"".join(lines), compresslevel=1))
        else:
            (run_dir / name).write_bytes(b"".join(lines))
    expected = json.loads(msgspec.json.encode(records.to_builtins(made[-1])))

    decoded, opened = [], []
    real_decode, real_open = records.from_log_line, reader._open
    monkeypatch.setattr(records, "from_log_line", lambda line: decoded.append(1) or real_decode(line))
    real_batch = reader._typed_batch

    class CountingBatch:
        def decode(self, data: bytes):  # lines decoded together: each ends with its newline
            decoded.extend([1] * data.count(b"\n"))
            return real_batch.decode(data)

    monkeypatch.setattr(reader, "_typed_batch", CountingBatch())
    monkeypatch.setattr(reader, "_open", lambda path: opened.append(path.name) or real_open(path))
    assert tm(["view", "--json", str(run_dir)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == expected and printed["steps"] == RECORDS // 2
    # The 101,000 records after seq 899,000, and two lines more: the first of segment 10 (seq 900,001 > 899,001,
    # so the tail starts before it) and of segment 9 (seq 800,001: it starts there). Segments 1 to 8 (800,000
    # records) are never opened, and segment 9's 99,000 lines up to the checkpoint are passed by their last key.
    assert len(decoded) == (RECORDS - CHECKPOINT_SEQ) + 2 == 101_002
    assert sorted(set(opened)) == ["events-0009.jsonl.gz", "events-0010.jsonl"]
