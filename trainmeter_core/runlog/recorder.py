"""The recorder: the only writer of a run's log, on its own thread behind a bounded queue.

The log is JSON Lines in segments (``events-0001.jsonl``, ...), rotated at a size limit and gzip-compressed once
closed. A ``block`` is one line of number arrays, with its last row's ``seq``. Flushes are batched and reported as the
last flushed sequence number; the end of a run is fsynced. Below a free-space reserve only ``run.*``, ``step`` (and the
``block`` that carries steps), ``fact`` and ``alert`` records are kept, so tm never fills the disk the
checkpoints need. A slow disk never stalls the hub: a full queue drops and counts.
"""

from __future__ import annotations

import gzip
import math
import os
import shutil
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import msgspec

from trainmeter_core.model import records

SEGMENT_LIMIT_B = int(os.environ.get("TM_LOG_SEGMENT_B", 128 * 1024 * 1024))
RESERVE_B = int(os.environ.get("TM_LOG_RESERVE_B", 2 * 1024 * 1024 * 1024))
#: Records queued, a block counting its rows (so its weight, not its line, fills the queue).
QUEUE_LIMIT = 2_000_000
FLUSH_EVERY_S = 0.1
#: Records that arrive within this long of the writer's wake wait for the rest of it, to be written together.
BATCH_S = 0.01
SPACE_CHECK_EVERY_S = 1.0
#: A block keeps its losses, phases and metrics with its steps: they are one line, and splitting it would cost per row.
KEPT_IN_RESERVE = frozenset({"run.start", "run.end", "step", "block", "fact", "alert"})

_json_encoder = msgspec.json.Encoder()


def segment_name(n: int) -> str:
    return f"events-{n:04d}.jsonl"


class Recorder:
    """Takes checked records (mappings carrying their ``seq``) from the hub and writes them to the run log."""

    def __init__(
        self,
        run_dir: Path,
        *,
        segment_limit_b: int = SEGMENT_LIMIT_B,
        reserve_b: int = RESERVE_B,
        queue_limit: int = QUEUE_LIMIT,
        warn=None,
        first_segment: int = 1,
    ) -> None:
        """``first_segment`` > 1 goes on with a log already written (a resumed run, or a finished run's log reopened by
        ``tm import``): its segments stay as they are."""
        self.run_dir = Path(run_dir)
        self.first_segment = first_segment
        self.segment_limit_b = segment_limit_b
        self.reserve_b = reserve_b
        self.queue_limit = queue_limit
        # Records queued and records taken off the queue, each counted by one thread alone (the hub's, the writer's):
        # the queue holds the difference.
        self._queued_records = 0
        self._taken_records = 0
        self.warn = warn or (lambda msg: print(f"tm: {msg}", file=sys.stderr))
        # Records (checked mappings), and blocks as (line, seq, rows)
        self._queue: deque[dict[str, Any] | tuple[bytes, int, int]] = deque()
        self.queue_dropped = 0
        self.flushed_seq: int | None = None
        self.queued_seq: int | None = None  # the last sequence number put in the queue
        self._flush_to: int | None = None  # a flush asked for, up to this sequence number
        self._flushed = threading.Condition()
        self.bytes_written = 0
        self.segments = 0  # segments this recorder opened
        self.reserve_active = False
        self.reserve_skipped = 0
        self.error: str | None = None
        self._segment_bytes = 0
        self._file = None
        self._stop = threading.Event()
        # Set by the first record put into an empty queue, a flush or the close asked for: the writer stops waiting
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tm-recorder", daemon=True)
        self._compressors: list[threading.Thread] = []
        self._last_space_check = 0.0

    # -- the hub's side --------------------------------------------------------------------------------------------

    def put(self, data: dict[str, Any]) -> bool:
        """Queue one record; never blocks. False (counted) when the queue is full."""
        if self._queued_records - self._taken_records >= self.queue_limit:
            self.queue_dropped += 1
            return False
        self._queued_records += 1
        queue = self._queue
        queue.append(data)
        seq = data.get("seq")
        if isinstance(seq, int):
            self.queued_seq = seq
        if len(queue) == 1:
            self._wake.set()  # the writer waits on an empty queue (_run)
        return True

    def put_block(self, block: records.Block) -> bool:
        """Queue a block the hub decoded typed and numbered (its ``seq`` set), as its line (``block_line``, written
        as ``put`` writes its mapping). Never blocks; False (its rows counted) when the queue is full.

        The line is made here, on the caller's thread, so the queue holds bytes: a decoded block is a score of lists
        the garbage collector looks through element by element as long as they live, and a job hub's queue under load
        holds thousands (collections took 12 to 16% of its time, ``bench/bench_jobhub.py``). Made on the writer's
        thread, the line would cost the same, later."""
        rows = block.rows
        if not self._room(rows):
            return False
        return self._queue_line(block_line(block), block.seq, rows, True)

    def put_record(self, record: msgspec.Struct, kind: str, seq: int) -> bool:
        """Queue a record of ``kind`` the hub decoded typed (``bus/sample_intake.py``), numbered ``seq``, as its line
        (``record_line``: what ``put`` writes of the mapping the general check would have made). Never blocks; False
        (counted) when the queue is full. Like ``put_block``, the line is made on the caller's thread."""
        if not self._room(1):
            return False
        return self._queue_line(record_line(record, seq), seq, 1, kind in KEPT_IN_RESERVE)

    def _room(self, rows: int) -> bool:
        """Whether the queue takes ``rows`` more records; else they are counted as dropped."""
        if self._queued_records - self._taken_records >= self.queue_limit:
            self.queue_dropped += rows
            return False
        return True

    def _queue_line(self, line: bytes, seq: int, rows: int, kept: bool) -> bool:
        """A line made on the caller's thread into the queue: the records it stands for, and whether the free-space
        reserve keeps it."""
        self._queued_records += rows
        queue = self._queue
        queue.append((line, seq, rows, kept))
        self.queued_seq = seq
        if len(queue) == 1:
            self._wake.set()  # the writer waits on an empty queue (_run)
        return True

    def flush(self, timeout_s: float) -> bool:
        """Write and flush everything queued so far, now rather than at the next batch; True once ``flushed_seq``
        reached it, False after ``timeout_s`` (a disk that fails, or a writer that is not running)."""
        target = self.queued_seq
        if target is None:
            return True
        with self._flushed:
            if not self._thread.is_alive():
                return (self.flushed_seq or 0) >= target
            self._flush_to = target
            self._wake.set()
            return self._flushed.wait_for(
                lambda: self.flushed_seq is not None and self.flushed_seq >= target, timeout_s
            )

    def start(self) -> None:
        self._open_segment()
        self._thread.start()

    def close(self, timeout_s: float = 30.0) -> None:
        """Write everything queued, fsync, close. Compression of older segments finishes in the background."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        for thread in self._compressors:
            thread.join(timeout_s)

    # -- the writer thread -----------------------------------------------------------------------------------------

    def _segment_path(self) -> Path:
        return self.run_dir / segment_name(self.first_segment + self.segments - 1)

    def _open_segment(self) -> None:
        self.segments += 1
        path = self._segment_path()
        self._file = open(path, "ab", buffering=1024 * 1024)  # noqa: SIM115 - closed on rotation and at the end
        self._segment_bytes = 0

    def _rotate(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        closed = self._segment_path()
        thread = threading.Thread(target=compress_segment, args=(closed,), name="tm-compress", daemon=True)
        thread.start()
        self._compressors.append(thread)
        self._open_segment()

    def _check_space(self, now: float) -> None:
        self._last_space_check = now
        try:
            st = os.statvfs(self.run_dir)
        except OSError:
            return
        avail_b = st.f_bavail * st.f_frsize
        low = avail_b < self.reserve_b
        if low and not self.reserve_active:
            self.warn(
                f"free space on the run's disk is below {self.reserve_b / 2**30:.1f} GiB: the run log now keeps only "
                "run.*, step, fact and alert records"
            )
        elif not low and self.reserve_active:
            self.warn("free space is back above the reserve: the run log keeps every record again")
        self.reserve_active = low

    def _run(self) -> None:
        """The writer. It sleeps while there is nothing to write: woken by the first record put into an empty queue
        (a put into a queue that holds records finds the writer awake, or about to take them), a flush or the close
        asked for, the next flush of what it wrote, or the free space's check once a second. What arrives within
        ``BATCH_S`` of its last wake waits for the rest of that time, so a stream of records is written in batches
        and wakes it at most 1 / ``BATCH_S`` times a second. Before, it looked at the queue every 10 ms, 100 wakes a
        second of an idle run: the most of tm's processes' CPU while nothing happens (docs/performance.md)."""
        queue = self._queue
        last_flush = time.monotonic()
        pending_seq = None
        while True:
            # Cleared before the queue is looked at: a record put after this sets it again
            self._wake.clear()
            stopping = self._stop.is_set()
            now = time.monotonic()
            if now - self._last_space_check >= SPACE_CHECK_EVERY_S:
                self._check_space(now)
            try:
                while queue:
                    data = queue.popleft()
                    if type(data) is tuple:
                        # A line made on the hub's thread (a block's, a typed sample's), and whether the reserve keeps
                        # its kind
                        line, seq, rows, kept = data
                        self._taken_records += rows
                        if self.reserve_active and not kept:
                            self.reserve_skipped += 1
                            pending_seq = seq
                            continue
                    elif self.reserve_active and data.get("kind") not in KEPT_IN_RESERVE:
                        self._taken_records += 1
                        self.reserve_skipped += 1
                        pending_seq = data.get("seq", pending_seq)
                        continue
                    else:
                        self._taken_records += 1
                        line = records.to_log_line(data)
                        seq = data.get("seq", pending_seq)
                    self._file.write(line)
                    self._segment_bytes += len(line)
                    self.bytes_written += len(line)
                    pending_seq = seq
                    if self._segment_bytes >= self.segment_limit_b:
                        self._rotate()
                now = time.monotonic()
                flush_to = self._flush_to
                asked = flush_to is not None and pending_seq is not None and pending_seq >= flush_to
                unflushed = pending_seq is not None and pending_seq != self.flushed_seq
                if pending_seq is not None and (
                    stopping or asked or (unflushed and now - last_flush >= FLUSH_EVERY_S)
                ):
                    self._file.flush()
                    with self._flushed:
                        self.flushed_seq = pending_seq
                        if asked:
                            self._flush_to = None
                        self._flushed.notify_all()
                    last_flush = now
            except OSError as exc:
                if self.error is None:
                    self.warn(f"cannot write the run log in {self.run_dir}: {exc}")
                self.error = str(exc)
                time.sleep(0.5)
            if stopping and not queue:
                break
            if not queue:
                now = time.monotonic()
                due = self._last_space_check + SPACE_CHECK_EVERY_S
                if pending_seq is not None and pending_seq != self.flushed_seq:
                    due = min(due, last_flush + FLUSH_EVERY_S)
                if due > now:
                    self._wake.wait(due - now)
                woken = time.monotonic()
                if woken < now + BATCH_S and not (self._stop.is_set() or self._flush_to is not None):
                    time.sleep(now + BATCH_S - woken)  # what else comes within BATCH_S, written with it
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
        except OSError as exc:
            self.warn(f"cannot finish the run log in {self.run_dir}: {exc}")


def block_line(block: records.Block) -> bytes:
    """A typed block's log line, as ``records.to_log_line`` writes the mapping it came from, ``seq`` last: encoded
    from the Struct, its ``seq`` put at the end. A loss or metric value that is not a finite number (JSON would write
    null) takes the mapping's way, which writes the log's texts for them."""
    seq = block.seq
    unnumbered = msgspec.structs.replace(block, seq=None)
    # A sum is finite when every term is (one that overflows takes the careful way, which looks at each).
    if math.isfinite(sum(filter(None, block.loss))) and all(
        math.isfinite(sum(values.values())) for values in block.metric_values
    ):
        return record_line(unnumbered, seq)
    data = records.to_builtins(unnumbered)
    data["seq"] = seq
    return records.to_log_line(data)


def record_line(record: msgspec.Struct, seq: int) -> bytes:
    """A typed record's log line, as ``records.to_log_line`` writes the mapping it came from, ``seq`` last: encoded
    from the Struct (which, as the producer's, leaves out every field at its default; its own ``seq`` left out, which
    this sets to None), its ``seq`` put at the end. For a record with no number the log writes as text (a sample's
    non-finite numbers are ``null`` either way; a block with any takes ``block_line``'s careful way)."""
    if record.seq is not None:
        record.seq = None
    return b'%s,"seq":%d}\n' % (_json_encoder.encode(record)[:-1], seq)


#: gzip's fastest level: on the real H200 logs 226 MB/s and 5.8 times smaller, against 68 MB/s and 7.3 times at level
#: 6 (zlib, one core of the team's machine). A job hub writes every node's samples and steps, about 27 KB a second a
#: node of 8 GPUs: at level 6 a thousand nodes would keep 40% of a core of the job hub's node compressing.
COMPRESS_LEVEL = 1


def compress_segment(path: Path) -> None:
    """Gzip a closed segment next to itself, then remove the plain one (readers prefer the plain one if both exist)."""
    tmp = path.with_name(path.name + ".gz.tmp")
    try:
        with open(path, "rb") as src, gzip.open(tmp, "wb", compresslevel=COMPRESS_LEVEL) as dst:
            shutil.copyfileobj(src, dst, 1024 * 1024)
        os.replace(tmp, path.with_name(path.name + ".gz"))
        os.unlink(path)
    except OSError as exc:
        print(f"tm: could not compress {path}: {exc}", file=sys.stderr)
        tmp.unlink(missing_ok=True)
