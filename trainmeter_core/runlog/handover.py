"""The one hand-over from the run log to the live bus, for every reader that joins a run late (the engine after a
restart, the dashboard, ``tm view`` of a live run): records up to the first one received live come from the log, the
rest from the bus, so nothing is lost and nothing counted twice.

Waiting for the recorder to write what the bus already delivered reads only the log's tail, never the whole log; the
log part itself starts after the reader's checkpoint. It never writes into the run directory.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from trainmeter_core.model import records
from trainmeter_core.runlog.reader import read_log
from trainmeter_core.runlog.tail import last_seq, tail_records

#: How long to wait for the recorder to write what the bus already delivered (it flushes every 100 ms).
LOG_CATCH_UP_WAIT_S = 30.0
# The log's end is small after run.end: only alerts computed from the final snapshot follow it.
_END_TAIL_B = 16 * 1024

Receive = Callable[[float], "records.Record | records.Unknown | None"]


def log_has_ended(run_dir: Path) -> bool:
    """True when the log's tail holds ``run.end`` (only late alerts are written after it) and no ``run.start`` after
    it (a resumed run's next attempt)."""
    ends = [records.kind_of(r) for r in tail_records(Path(run_dir), _END_TAIL_B, blocks=True)]
    ends = [kind for kind in ends if kind in ("run.start", "run.end")]
    return bool(ends) and ends[-1] == "run.end"


class HandOver:
    """Joins one reader to a run: ``wait_first_live``, then ``wait_for_log``, then ``from_log``, then ``next``.

    ``recv`` is the reader's subscriber (every kind, or the kinds it needs plus a steady one such as ``tick``).
    Derived kinds (snapshots, history) never mark the hand-over: they are not in the log to hand over from.
    """

    def __init__(
        self,
        run_dir: Path,
        recv: Receive,
        stopping: threading.Event,
        *,
        wait_s: float = LOG_CATCH_UP_WAIT_S,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.recv = recv
        self.stopping = stopping
        self.wait_s = wait_s
        self.first_live: int | None = None
        self.log_complete = False
        self._pending: deque[records.Record | records.Unknown] = deque()

    def wait_first_live(self, idle: Callable[[], bool] | None = None, timeout_s: float = 0.5) -> bool:
        """Receive (and keep) records until the first one that is not derived. ``idle``, asked whenever nothing came,
        may end the wait (the engine, when the run already ended). False when it ended before any came."""
        while self.first_live is None and not self.stopping.is_set():
            record = self.recv(timeout_s)
            if record is None:
                if idle is not None and idle():
                    return False
                continue
            self._pending.append(record)
            if records.kind_of(record) not in records.DERIVED_KINDS and record.seq is not None:
                # A block received as it is (its seq its last row's) starts with its first row.
                is_block = type(record) is records.Block
                self.first_live = record.seq - record.rows + 1 if is_block else record.seq
        return self.first_live is not None

    def wait_for_log(self) -> bool:
        """Wait (at most ``wait_s``) until the log holds everything before the first live record; True once it does.

        The log's last record tells (the recorder writes in hub order); so does a ``bus.stats`` received meanwhile,
        whose ``flushed_seq`` counts what the recorder left out below its free-space reserve too.
        """
        assert self.first_live is not None, "wait_first_live first"
        wanted = self.first_live - 1
        deadline = time.monotonic() + self.wait_s
        while not self.stopping.is_set():
            last = last_seq(self.run_dir)
            if last is not None and last >= wanted:
                self.log_complete = True
                return True
            if any(
                isinstance(r, records.BusStats) and r.flushed_seq is not None and r.flushed_seq >= wanted
                for r in self._pending
            ):
                self.log_complete = True
                return True
            if time.monotonic() >= deadline:
                return False
            record = self.recv(
                0.05
            )  # keep receiving: the socket's queue stays short and a bus.stats may come
            if record is not None:
                self._pending.append(record)
        return False

    def from_log(
        self,
        after_seq: int = 0,
        kinds: set[str] | None = None,
        stats: dict | None = None,
        *,
        blocks: bool = False,
    ) -> Iterator[records.Record | records.Unknown]:
        """The logged records with ``after_seq < seq <`` the first live one (those after a checkpoint at
        ``after_seq``), in order; ``kinds`` keeps only those kinds (others are not even decoded). A block comes as
        its rows, or as it is with ``blocks`` true (as its rows inside the bounds when they cut it: ``read_log``)."""
        assert self.first_live is not None, "wait_first_live first"
        yield from read_log(
            self.run_dir, kinds, stats, after_seq=after_seq, before_seq=self.first_live, blocks=blocks
        )

    def next(self, timeout_s: float) -> records.Record | records.Unknown | None:
        """The next live record: those kept while handing over first, then the bus's."""
        if self._pending:
            return self._pending.popleft()
        return self.recv(timeout_s)
