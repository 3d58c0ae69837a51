"""A run log's end: its last complete lines and records and its last sequence number, read from the last segment's end
(or the one before it, just after a rotation) without reading the whole log."""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

from trainmeter_core.model import records
from trainmeter_core.runlog.reader import segments

#: How much of a log's end is read to find its last record.
TAIL_B = 256 * 1024


def _segment_tail(path: Path, tail_b: int) -> list[bytes]:
    """The complete, non-blank lines (newline stripped) in the last ``tail_b`` bytes of one segment, or in as many more
    as its last complete line needs (a block of many steps is one long line)."""
    while True:
        try:
            if path.suffix == ".gz":
                with gzip.open(path, "rb") as f:
                    data = f.read()
                tail, cut = data[-tail_b:], len(data) > tail_b
            else:
                with open(path, "rb") as f:
                    size = f.seek(0, os.SEEK_END)
                    f.seek(max(0, size - tail_b))
                    tail, cut = f.read(), size > tail_b
        except (OSError, EOFError, zlib.error):
            return []
        lines = tail.split(b"\n")[:-1]  # the piece after the last newline is cut (or empty)
        if cut:
            lines = lines[1:]  # the first piece may start inside a line
        lines = [line for line in lines if line.strip()]
        if lines or not cut or tail.count(b"\n") > 1:
            return lines
        tail_b *= 4  # no line ends inside the tail but the last: it started before it


def tail_lines(run_dir: Path, tail_b: int = TAIL_B) -> list[bytes]:
    """The log's last complete lines, undecoded, oldest first: from the last segment's end, or the one before it
    when the last holds none yet (it was just opened by a rotation)."""
    for path in reversed(segments(Path(run_dir))[-2:]):
        lines = _segment_tail(path, tail_b)
        if lines:
            return lines
    return []


def tail_records(
    run_dir: Path, tail_b: int = TAIL_B, *, blocks: bool = False
) -> list[records.Record | records.Unknown]:
    """The complete records in the last ``tail_b`` bytes of the log, oldest first: what a reader waiting for the
    recorder, or asking how the log ends, needs, without reading the whole log. A block comes as its rows, each with
    its own ``seq`` (as it is with ``blocks`` true).

    The last segment is read from its end; if it holds no record yet (it was just opened by a rotation), the one
    before it is read (whole, when it is already compressed: rare, and bounded by the recorder's segment size).
    """
    for path in reversed(segments(Path(run_dir))[-2:]):
        out: list[records.Record | records.Unknown] = []
        for line in _segment_tail(path, tail_b):
            try:
                record = records.from_log_line(line + b"\n")
            except records.MalformedRecord:
                continue
            if type(record) is not records.Block:
                out.append(record)
                continue
            try:
                records.block.validate(record)
            except records.MalformedRecord:  # columns that disagree with its rows: no record, as a bad line
                continue
            if blocks:
                out.append(record)
            else:
                out.extend(records.block.expand(record))
        if out:
            return out
    return []


def last_seq(run_dir: Path) -> int | None:
    """The sequence number of the log's last complete record, read from its tail; None for an empty log."""
    for record in reversed(tail_records(run_dir, blocks=True)):  # a block's seq is its last row's
        if record.seq is not None:
            return record.seq
    return None
