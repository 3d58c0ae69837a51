"""Reopening a run's log to write more of it: where the log ends (its last sequence number, tick and segment), so the
next writer numbers on after it in a segment of its own, and the checkpoints the run wrote, so a command can be
matched to it. It only reads: the segments already written are never opened for writing, nor rewritten.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

from trainmeter_core.model import records
from trainmeter_core.runlog.checkpoint import checkpoint_through_seq
from trainmeter_core.runlog.reader import SEGMENT_RE, read_segment, segments
from trainmeter_core.runlog.tail import tail_records


@dataclass(frozen=True)
class LogEnd:
    """Where a run's log ends: the next writer numbers from ``last_seq + 1``, ticks from ``last_tick + 1``, and
    writes ``events-<next_segment>.jsonl``. ``ended`` is True when the log's tail holds ``run.end``."""

    last_seq: int
    last_tick: int
    next_segment: int
    ended: bool


def log_end(run_dir: Path) -> LogEnd:
    """Read from the log's tail and the engine's checkpoint (which may reflect records the recorder had not written
    when the run was killed: numbering goes on after those too, so the checkpoint never covers a later record)."""
    run_dir = Path(run_dir)
    tail = tail_records(run_dir)
    last_seq = max((r.seq for r in tail if r.seq is not None), default=0)
    last_seq = max(last_seq, checkpoint_through_seq(run_dir) or 0)
    ticks = [r.n for r in tail if isinstance(r, records.Tick)]
    numbers = [int(m.group(1)) for p in segments(run_dir) if (m := SEGMENT_RE.match(p.name))]
    ended = any(records.kind_of(r) == "run.end" for r in tail)
    return LogEnd(
        last_seq=last_seq,
        last_tick=max(ticks, default=0),
        next_segment=max(numbers, default=0) + 1,
        ended=ended,
    )


#: How many segments, from the last, are searched for the run's checkpoints (a segment holds hours of a run).
CHECKPOINT_SEGMENTS = 3


def checkpoint_paths(run_dir: Path, max_segments: int = CHECKPOINT_SEGMENTS) -> list[str]:
    """The files the run's latest checkpoints went to (the agent's checkpoint phases), newest last; read from the last
    segment that holds one, among the last ``max_segments``, so that a long run's log is never read whole (this runs
    whenever a run of the same name is unfinished)."""
    for path in reversed(segments(Path(run_dir))[-max_segments:]):
        found: list[str] = []
        try:
            for record in read_segment(path, kinds={"phase"}):
                if isinstance(record, records.Phase) and record.phase == "checkpoint":
                    found.extend(p for p in record.paths if p not in found)
        except (OSError, EOFError, zlib.error):
            continue
        if found:
            return found
    return []
