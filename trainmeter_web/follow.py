"""Filling a RunModel: from the engine's checkpoint and the log (``tm view``, a restarted web process), then live.

The hand-over from log to bus is the engine component's: records up to the first one received live come from the log,
the rest from the bus, so nothing is lost or counted twice. It only reads the run directory, never writes to it.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from pathlib import Path

from trainmeter_core import records as rec
from trainmeter_core.engine_component import load_checkpoint
from trainmeter_core.logread import read_log, segments
from trainmeter_web.model import RunModel

#: How long to wait for the recorder to write what the bus already delivered (it flushes every 100 ms).
LOG_CATCH_UP_WAIT_S = 30.0
#: How long a stopping follower keeps reading what the bus already delivered.
DRAIN_ON_STOP_S = 0.3
_TAIL_B = 256 * 1024


def read_meta(run_dir: Path) -> dict:
    try:
        meta = json.loads((Path(run_dir) / "meta.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def open_run(run_dir: Path) -> tuple[RunModel, int]:
    """A model with the engine restored from the run's checkpoint, and the last sequence number it reflects."""
    engine, through_seq = load_checkpoint(Path(run_dir))
    return RunModel(run_dir, read_meta(run_dir), engine), through_seq


def replay(model: RunModel, run_dir: Path, after_seq: int = 0, before_seq: int | None = None) -> int:
    """Feed the log to the model: the engine gets records after ``after_seq`` (the checkpoint holds the rest), the
    model's own parts (alerts, the run's start and end, tm's overhead) every record; stops before ``before_seq``.
    Returns the last sequence number read."""
    last = after_seq
    for record in read_log(Path(run_dir)):
        seq = record.seq
        if before_seq is not None and seq is not None and seq >= before_seq:
            break
        if seq is not None and seq <= after_seq:
            model.feed_outside_engine(record)
        else:
            model.feed(record)
        if seq is not None:
            last = seq
    return last


def log_last_seq(run_dir: Path) -> int | None:
    """The sequence number of the last complete line of the run log (read from its tail, not the whole log)."""
    paths = segments(Path(run_dir))
    if not paths:
        return None
    path = paths[-1]
    try:
        if path.suffix == ".gz":  # a closed segment: whole, and bounded by the recorder's size limit
            with gzip.open(path, "rb") as f:
                tail = f.read()[-_TAIL_B:]
        else:
            with open(path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - _TAIL_B))
                tail = f.read()
    except (OSError, EOFError, zlib.error):
        return None
    lines = tail.split(b"\n")
    # The last piece has no newline (cut, or empty); the first may be cut by the seek.
    for line in reversed(lines[1:-1] if len(tail) == _TAIL_B else lines[:-1]):
        if not line.strip():
            continue
        try:
            record = rec.from_log_line(line + b"\n")
        except rec.MalformedRecord:
            continue
        if record.seq is not None:
            return record.seq
    return None


class Follower:
    """Catches a model up from the log to the bus, then feeds it live; ``changed`` is called after each change."""

    def __init__(
        self,
        model: RunModel,
        recv: Callable[[float], rec.Record | rec.Unknown | None],
        stopping: threading.Event,
        after_seq: int = 0,
    ) -> None:
        self.model = model
        self.recv = recv
        self.stopping = stopping
        self.after_seq = after_seq
        self._pending: deque = deque()

    def catch_up(self) -> bool:
        """Read the log up to the first record that came live. False when asked to stop before any came."""
        run_dir = self.model.run_dir
        assert run_dir is not None
        first_live = None
        while first_live is None and not self.stopping.is_set():
            record = self.recv(0.5)
            if record is None:
                continue
            self._pending.append(record)
            if rec.kind_of(record) != "snapshot" and record.seq is not None:
                first_live = record.seq
        if first_live is None:
            return False
        deadline = time.monotonic() + LOG_CATCH_UP_WAIT_S
        while not self.stopping.is_set() and time.monotonic() < deadline:
            last = log_last_seq(run_dir)
            if last is not None and last >= first_live - 1:
                break
            self.stopping.wait(0.05)
        replay(self.model, run_dir, self.after_seq, before_seq=first_live)
        while self._pending:
            self._feed(self._pending.popleft())
        return True

    def _feed(self, record) -> bool:
        seq = record.seq
        if seq is not None and seq <= self.model.through_seq and rec.kind_of(record) != "snapshot":
            return False  # already read from the log
        return self.model.feed(record)

    def run_live(self, changed: Callable[[], None], until_run_end: bool = False) -> None:
        """Feed live records until asked to stop (or, with ``until_run_end``, until the run ends)."""
        changed()
        while not self.stopping.is_set():
            record = self.recv(0.5)
            if record is None:
                continue
            if self._feed(record):
                changed()
            if until_run_end and rec.kind_of(record) == "run.end":
                return
        # Asked to stop: what already arrived (the run's end, just before tm stops its components) still counts.
        deadline = time.monotonic() + DRAIN_ON_STOP_S
        fed = False
        while time.monotonic() < deadline:
            record = self.recv(0.0)
            if record is None:
                break
            fed = self._feed(record) or fed
        if fed:
            changed()
