"""The agent's outbox: step records, metrics and phases wait here and leave a few at a time, in the order they came.

A batch leaves when its window has been open ``window_s`` (checked by the loop's next record, and by a timer thread
when the loop goes quiet), when it holds ``max_records``, before a fork, and at exit. A send through the bus costs more
than everything else the agent does in an iteration, so a tight loop pays for one send per window instead of one per
step. SIGKILL (and a default SIGTERM) cannot flush: such a process loses at most the window that was open, and the
launcher says so. It never installs a signal handler (a Python handler would delay a signal meant to kill a process
stuck in native code) and never raises into the loop.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

#: A batch leaves at most this long after its first record ...
WINDOW_S = float(os.environ.get("TM_AGENT_FLUSH_S", "0.05"))
#: ... or once it holds this many entries (a steady step and its loss are one entry, two records).
MAX_RECORDS = int(os.environ.get("TM_AGENT_FLUSH_RECORDS", "1000"))


# The loop's hottest records wait in the outbox as plain tuples and leave as they are: the hub builds the records they
# stand for (``trainmeter_core.model.agent_batch``, whose codes these are: ``tests/e2e/test_agent.py`` checks they match).
#: ``(STEADY_STEP, step, t, step_time_s, optimizers, agent_us, micro_batches, tokens, tokens_source, dp, loss, loss_t,
#: loss_origin)``: a steady iteration's step record, after its ``train_loss`` metric from backward() when ``loss`` is
#: a float.
STEADY_STEP = 1
#: Where a steady step's ``loss`` lies in its tuple.
STEADY_LOSS = 10
#: ``(PHASE, phase, start_t, end_t, step, probe)``: a phase record with no other field (a DataLoader batch's data wait).
PHASE = 2
#: ``(METRIC, t, values, step, origin)``: a metric record.
METRIC = 3


def records_in(batch: list) -> int:
    """The records a batch stands for: one an item, two a steady step with its loss (counted here, from the items the
    batch holds, so a window's count is its own whichever thread closed it and whenever)."""
    return len(batch) + sum(
        1
        for item in batch
        if type(item) is tuple and item[0] == STEADY_STEP and item[STEADY_LOSS] is not None
    )


class Outbox:
    """Records in arrival order; ``send(batch, records)`` is the agent's, called by whichever thread closes the window.

    ``put`` is the only call the loop makes per record: a deque append (thread-safe without a lock), a length and a
    clock comparison. Flushes take a lock so that the loop's thread and the timer never interleave two batches.
    """

    def __init__(self, send, window_s: float = WINDOW_S, max_records: int = MAX_RECORDS) -> None:
        self._send = send
        self.window_s = window_s
        self.max_records = max_records
        self.windows = 0  # batches sent by this process
        self._reset()

    def _reset(self) -> None:
        self._items: deque = deque()
        self._opened_t = 0.0
        self._lock = threading.Lock()
        self._due = threading.Event()
        self._timer: threading.Thread | None = None
        self._pid = os.getpid()
        self.ready = False  # the timer flushes only once the agent may send (hello went out)

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item, now: float) -> None:
        """Queue one item (a record, or what the send turns into one); close the window when it is due."""
        items = self._items
        items.append(item)
        if len(items) == 1:  # the first of a window
            self._opened_t = now
            if self._timer is None:
                self._start_timer()
            self._due.set()  # after the append: the timer that wakes finds the item
        elif now - self._opened_t >= self.window_s or len(items) >= self.max_records:
            self.flush()

    def flush(self) -> None:
        """Send everything queued so far as one batch (nothing when empty), with the number of records it holds."""
        with self._lock:
            items = self._items
            n = len(items)
            if not n:
                return
            batch = [items.popleft() for _ in range(n)]
            self.windows += 1
            self._send(batch, records_in(batch))

    # -- the timer ------------------------------------------------------------------------------------------------

    def _start_timer(self) -> None:
        self._timer = threading.Thread(target=self._run, name="tm-agent-flush", daemon=True)
        self._timer.start()

    def _run(self) -> None:
        due, items = self._due, self._items
        while True:
            due.wait()
            due.clear()
            while items:
                wait_s = self._opened_t + self.window_s - time.monotonic()
                if wait_s > 0:
                    time.sleep(wait_s)  # the loop may close the window meanwhile: look again
                    continue
                if self.ready:
                    try:
                        self.flush()
                    except Exception:
                        pass  # the send path says its own errors; the timer stays
                break

    # -- fork -----------------------------------------------------------------------------------------------------

    def before_fork(self) -> None:
        """What the parent queued leaves before the fork, so the child starts with nothing of it."""
        try:
            if self.ready and self._pid == os.getpid():
                self.flush()
        except Exception:
            pass

    def after_fork_child(self) -> None:
        """A fork child: no timer thread (threads do not survive a fork), no lock held by one, nothing queued."""
        self._reset()
