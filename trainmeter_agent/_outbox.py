"""The agent's outbox: steps, losses, phases and metrics are written as rows into preallocated columns, and leave a
window at a time as one ``batch`` message: the rows as ``records.Block`` s, with the whole records queued between them
(facts, notices, general steps) in the order they came.

A window leaves at the first multiple of ``window_s`` on the monotonic clock after its first row (``ALIGNED_MAX_S``;
checked at the loop's next row or record, or by the one flush thread once the loop has gone quiet), when it holds
``max_records`` rows and records, before a fork, and at exit. A send costs more than everything else the agent does in
an iteration, so a tight loop pays for one send per window.
SIGKILL (and a default SIGTERM) cannot flush: such a process loses at most the window that was open, and the launcher
says how many steps that was (the step page, ``trainmeter_core.bus.step_page``). It never installs a signal handler (a Python handler
would delay a signal meant to kill a process stuck in native code) and never raises into the loop.

Why one module: the puts, the cut, the token and the flush thread all read and write the same few attributes (the
cells, the row counts, the window's due time and limit), and a put is on the loop's path every iteration, where each
object it reaches costs (docs/performance.md, "What the agent's time is spent on"): split, a put would reach into
another object's state or call it.
"""

from __future__ import annotations

import os
import threading
import time

from trainmeter_agent._reasons import NO_TOKENS  # not _module_probe's module: it imports inspect (6 ms)
from trainmeter_core.bus.step_page import COUNTED, HANDED, WINDOWS, StepPage

#: A window leaves at most this long after its first row (run/child.py's FLUSH_S: why this long) ...
WINDOW_S = float(os.environ.get("TM_AGENT_FLUSH_S", "1"))
#: ... or once it holds this many rows and records (a step and its loss are one row, two records).
MAX_RECORDS = int(os.environ.get("TM_AGENT_FLUSH_RECORDS", "16000"))
#: A process's first windows are shorter, unless the command's environment chose the window: the first steps reach
#: the dashboard within 50 ms, and what starts at a process's first window (the collective probe times ``Work.wait``
#: from then on) starts as soon as it did with 50 ms windows. Twenty windows are about a second of a loop that fills
#: them; a loop that steps once a second has one step a window either way.
START_WINDOW_S, START_RECORDS = 0.05, 1000


def start_windows(environ) -> int:
    """How many of a process's first windows are short (START_WINDOW_S, START_RECORDS): 20, none where ``environ`` (the
    process's environment) chose the window."""
    return 0 if "TM_AGENT_FLUSH_S" in environ or "TM_AGENT_FLUSH_RECORDS" in environ else 20


START_WINDOWS = start_windows(os.environ)
#: The flush thread's longest sleep while the loop closes its own windows: a loop that goes quiet has its open window
#: sent at most this long (plus one window) later. Each wake that finds the loop has flushed doubles the sleep, from
#: one window up to this; a wake that finds a window due resets it. Measured on the tight loop at 50 ms windows
#: (bench/bench_agent_rows.py, last line): 5 sleeps in 5 s while the loop sent 99 windows itself; a floor thread that
#: wakes once a second instead of never (bench/bench_agent.py, "waking thread") added +1.2, +0.5 and -0.5 µs per
#: iteration in three runs, within their noise. The cost of a look: the lock and the token, two attributes, one clock
#: read.
QUIET_MAX_S = 1.0
#: A thread that waits for the columns' token (``Outbox._hold``, holding ``_lock``) looks again after this long.
TOKEN_WAIT_S = 0.00005
#: A window of at most this long closes at the first row after a multiple of its length on the monotonic clock (the
#: same clock in every process of a machine), not its length after its own first row: the ranks of a machine then send
#: the same stretch of steps at the same moment, and the hub ticks half a second after it (bus/tick_clock.py), so each
#: snapshot compares every rank at the same step. With windows of a second, unaligned, a rank's blocks could reach the
#: engine up to a second before another's, and on a loaded machine the straggler rule, which compares the ranks'
#: recent collective waits, named a rank of a clean run (tests/e2e/test_straggler_e2e.py, 2 runs of 3). A longer window
#: (a test's 3600 s, to close by count alone) keeps its length from its first row.
ALIGNED_MAX_S = 1.0

# The row letters of a block's ``order`` (records.block: STEP, PHASE, METRIC).
_STEP, _PHASE, _METRIC = "s", "p", "m"
# The block's columns of each kind of row (records.Block's fields): the outbox keeps each as a list ``_<name>``.
_STEP_COLUMNS = (
    "step",
    "step_t",
    "step_time_s",
    "optimizers",
    "agent_us",
    "micro_batches",
    "tokens",
    "loss",
    "loss_t",
)
_PHASE_COLUMNS = ("phase", "phase_start_t", "phase_end_t", "phase_step", "phase_probe")
_METRIC_COLUMNS = ("metric_t", "metric_values", "metric_step", "metric_origin")
# A row's cells lie side by side in one list per kind of row, each row ``len(<kind>_COLUMNS)`` cells after the one before:
# a put stores into one list, not one per field. What a steady iteration costs the loop is mostly the objects it
# touches that torch's work pushed out of the caches (docs/performance.md, "What the agent's time is spent on"): a
# row's nine stores into nine lists cost it more than nine stores into one.
_STEP_WIDTH, _PHASE_WIDTH, _METRIC_WIDTH = len(_STEP_COLUMNS), len(_PHASE_COLUMNS), len(_METRIC_COLUMNS)


def _sleeps(window_s: float) -> tuple[float, ...]:
    """The flush thread's sleeps: a window (an hour at most: a window of no deadline is looked at hourly), then each
    twice the one before, up to QUIET_MAX_S."""
    sleep_s = min(window_s, 3600.0)
    sleeps = [sleep_s]
    while sleep_s < QUIET_MAX_S:
        sleep_s = min(2 * sleep_s, QUIET_MAX_S)
        sleeps.append(sleep_s)
    return tuple(sleeps)


class Outbox:
    """Rows in columns and whole records, in arrival order; ``send(batch, steps)`` is the agent's, called by whichever
    thread closes the window, with the records of the window (blocks among them) and the steps they hold.

    The loop's rows are stores into lists allocated once (``_columns``), one per field: a row keeps the values the
    loop made anyway until its window is cut, which hands them to the block and empties the slots, so nothing a row
    stored outlives its window. Every put and flush holds the columns' token, so that the loop, another thread that
    emits and the flush thread never interleave: a list that holds one item while nobody writes, taken with ``pop()``
    and given back with ``append()`` (each atomic under the GIL, and under a free-threaded build's per-list lock). A
    ``threading.Lock`` did the same; its ``acquire()`` parses its arguments in C code that torch's work between two
    rows leaves cold, and cost the loop 1.0 µs a put against 0.2 µs for the two list calls (docs/performance.md,
    "The columns' token instead of a lock"). Whoever may hold the token for longer than a put (a flush, the flush
    thread, a thread's whole record) holds ``_lock`` too, and a put that finds the token gone waits there (``_take``).
    """

    def __init__(
        self, send, window_s: float = WINDOW_S, max_records: int = MAX_RECORDS, start_windows: int = 0
    ) -> None:
        """``window_s`` and ``max_records`` bound a window once the process has sent ``start_windows`` windows; each of
        those first windows is bounded by START_WINDOW_S and START_RECORDS, or by ``window_s`` and ``max_records`` where
        they are smaller."""
        self._send = send
        self._steady = (window_s, max_records)
        self._start_windows = start_windows
        self.page = StepPage()
        self._reset()

    def _reset(self) -> None:
        window_s, max_records = self._steady
        if self._start_windows:
            window_s, max_records = min(window_s, START_WINDOW_S), min(max_records, START_RECORDS)
        self.window_s, self.max_records = window_s, max_records
        self.steps = 0  # steps queued by this process (rows and whole step records)
        # The columns' token (the class's docstring): one item at most, so the list never reallocates.
        self._token = [True]
        self._lock = threading.Lock()
        self._due = threading.Event()
        self._timer: threading.Thread | None = None
        self._idle = True  # the flush thread sleeps without a deadline: the next row wakes it
        self._loop_flushed = False  # a window left since the flush thread last looked
        self._pid = os.getpid()
        self._slots = self.page.slots
        self._columns(max(1, self.max_records))
        self._batch: list = []  # whole records and cut blocks, in order
        # What the open window holds besides the columns' rows: its whole records and the rows already cut into blocks
        # (``_queued``: rows and records in all). The puts count rows alone (``_rows``) and compare them with
        # ``_row_limit``, the rows the columns may still take before the window is full (``_limits``).
        self._before_rows = 0
        self._limits()
        # When the open window is due to leave; 0.0 while nothing is queued, so that a window's first row or record
        # goes the way that opens it (``_arrived``) by the same comparison a put makes for a due window.
        self._due_t = 0.0
        self.ready = False  # the flush thread flushes only once the agent may send (hello went out)

    def _columns(self, capacity: int) -> None:
        """The columns, room for ``capacity`` rows of each kind (a window holds at most that many rows in all): one
        list of cells per kind (``_step_cells``, ``_phase_cells``, ``_metric_cells``), a row's cells side by side in
        the order of its ``_COLUMNS``, filled from the front and emptied at each cut."""
        self._capacity = capacity
        self._nones = [None] * (capacity * _STEP_WIDTH)  # what a cut writes back over the cells it took
        self._order = [None] * capacity
        self._rows = 0
        # Rows of each kind so far, and what a block says once for its steps. A phase's name and probe are the probe's
        # own constant strings; a metric's values are the caller's dict until it leaves.
        self._s = self._p = self._m = 0
        self._tokens_source: str | None = None
        self._dp: int | None = None
        # A step row's loss is always the one passed to backward() (``_loss.ORIGIN``: the steady step's only source).
        self._loss_origin = "backward"
        self._step_cells = [None] * (capacity * _STEP_WIDTH)
        self._phase_cells = [None] * (capacity * _PHASE_WIDTH)
        self._metric_cells = [None] * (capacity * _METRIC_WIDTH)
        # The columns' names and cells of steps, phases and metrics, for the cut
        self._kinds = (
            (_STEP_COLUMNS, self._step_cells),
            (_PHASE_COLUMNS, self._phase_cells),
            (_METRIC_COLUMNS, self._metric_cells),
        )

    def open_page(self, window_records: int) -> None:
        """Map this process's step page (``trainmeter_core.bus.step_page``): the slots the rows write from now on."""
        self.page.open(window_records)
        self._slots = self.page.slots

    @property
    def windows(self) -> int:
        """The windows this process sent. Kept in the step page alone: a count held as an attribute would be a new
        object at each window once past CPython's cached small numbers (256), which the allocation test would see."""
        return self._slots[WINDOWS]

    def __len__(self) -> int:
        return self._queued

    @property
    def max_records(self) -> int:
        """The most rows and records a window holds before it leaves."""
        return self._max_records

    @max_records.setter
    def max_records(self, value: int) -> None:
        self._max_records = value
        if "_row_limit" in self.__dict__:
            self._limits()

    @property
    def _queued(self) -> int:
        """Rows and whole records in the open window."""
        return self._before_rows + self._rows

    def _limits(self) -> None:
        """The rows after which a put closes the window: it holds ``max_records`` rows and records, or the columns are
        full. Recomputed wherever its terms change (a whole record, a cut, a window's end, new bounds)."""
        self._row_limit = min(self._max_records - self._before_rows, self._capacity)

    # -- the loop's rows --------------------------------------------------------------------------------------------
    # Each row is a store per field into its list, with the token, and the window's bookkeeping written out in place:
    # on a tight loop every call and line of an iteration shows, and a store into a list runs in the interpreter's own
    # loop, where a packed row (``Struct.pack_into``, which the rows were until issue 42's last stops) or an
    # ``array`` store calls C code that torch's work between two rows has pushed out of the caches: 1.6 µs more a row
    # in the loop (``bench/bench_hook_parts.py``), against 0.2 µs in a bare microbenchmark.

    def put_step(
        self,
        step: int,
        t: float,
        step_time_s: float,
        optimizers: int,
        agent_us: float | None,
        micro_batches: int,
        tokens: int | None,
        tokens_source: str | None,
        dp: int,
        loss: float | None,
        loss_t: float | None,
    ) -> None:
        """A steady step's row (and the ``train_loss`` metric before it, when ``loss`` is not None: the loss passed to
        ``backward()``, and ``loss_t`` its time, None without it). ``tokens`` and ``tokens_source`` are None for a step
        whose model saw no token ids: its block has no tokens column and says why (``NO_TOKENS``); a step with a count
        and one without are never in one block."""
        token = self._token
        try:
            token.pop()
        except IndexError:
            self._take()  # another thread writes or flushes: wait for it
        except BaseException:
            # A signal's exception, raised as the pop returned (with the token): it goes back.
            token.append(True)
            raise
        try:
            s = self._s
            if s and (tokens_source != self._tokens_source or dp != self._dp):
                self._cut()  # what a block says once for its steps changed: the next rows are another block
                s = 0
            if not s:
                self._tokens_source, self._dp = tokens_source, dp
            cells = self._step_cells
            at = s * 9  # _STEP_WIDTH, in _STEP_COLUMNS' order
            cells[at] = step
            cells[at + 1] = t
            cells[at + 2] = step_time_s
            cells[at + 3] = optimizers
            cells[at + 4] = agent_us
            cells[at + 5] = micro_batches
            cells[at + 6] = tokens
            cells[at + 7] = loss
            cells[at + 8] = loss_t
            self._s = s + 1
            steps = self.steps + 1
            self.steps = steps
            self._slots[COUNTED] = steps  # a plain store into the mapped page: no syscall
            rows = self._rows
            self._order[rows] = _STEP
            rows += 1
            self._rows = rows
            if t >= self._due_t or rows >= self._row_limit:
                self._arrived(t)  # the window's first row, or the window is due or full
        finally:
            token.append(True)

    def put_phase(self, phase: str, start_t: float, end_t: float, step: int | None, probe: str) -> None:
        """A phase's row (a phase with no other field: a DataLoader batch's data wait)."""
        token = self._token
        try:
            token.pop()
        except IndexError:
            self._take()
        except BaseException:
            token.append(True)
            raise
        try:
            p = self._p
            cells = self._phase_cells
            at = p * 5  # _PHASE_WIDTH, in _PHASE_COLUMNS' order
            cells[at] = phase
            cells[at + 1] = start_t
            cells[at + 2] = end_t
            cells[at + 3] = step
            cells[at + 4] = probe
            self._p = p + 1
            rows = self._rows
            self._order[rows] = _PHASE
            rows += 1
            self._rows = rows
            if end_t >= self._due_t or rows >= self._row_limit:
                self._arrived(end_t)
        finally:
            token.append(True)

    def put_metric(self, t: float, values: dict, step: int | None, origin: str) -> None:
        """A metric's row: the values (already real numbers), the step that labels them, who sent them."""
        self._take()
        try:
            m = self._m
            at = m * _METRIC_WIDTH
            self._metric_cells[at : at + _METRIC_WIDTH] = (t, values, step, origin)  # _METRIC_COLUMNS' order
            self._m = m + 1
            rows = self._rows
            self._order[rows] = _METRIC
            self._rows = rows + 1
            self._arrived(t)
        finally:
            self._token.append(True)

    def put(self, record, now: float, steps: int = 0) -> None:
        """Queue one whole record (already stamped) after every row before it; ``steps`` is 1 for a step record."""
        self._hold()
        try:
            if self._rows:
                self._cut()
            self._batch.append(record)
            if steps:
                self.steps += steps
                self._slots[COUNTED] = self.steps
            self._before_rows += 1
            self._limits()
            self._arrived(now)
        finally:
            self._let_go()

    def _arrived(self, now: float) -> None:
        """After a row or a whole record: open the window if it is the first, and send the window if it is due or
        full (``_row_limit``; a window of one row or record is full at once)."""
        if self._before_rows + self._rows == 1:
            self._opened(now)
            if self._rows < self._row_limit:
                return
        elif now < self._due_t and self._rows < self._row_limit:
            return
        self._flush()

    def _opened(self, now: float) -> None:
        """The first row or record of a window: when it is due (ALIGNED_MAX_S), and the flush thread watches it if it
        slept."""
        window_s = self.window_s
        self._due_t = now - now % window_s + window_s if window_s <= ALIGNED_MAX_S else now + window_s
        if self._idle:
            self._wake()

    # -- leaving ----------------------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Send everything queued so far as one batch (nothing when empty)."""
        self._hold()
        try:
            self._flush()
        finally:
            self._let_go()

    def discard(self) -> None:
        """Drop what is queued (the bus is gone: nothing queued is kept to grow)."""
        self._hold()
        try:
            if self._rows:
                self._cut()
            self._batch = []
            self._before_rows = 0
            self._limits()
            self._due_t = 0.0
            self._slots[HANDED] = self.steps  # handed to nobody, but no kill can lose them now
        finally:
            self._let_go()

    # -- the columns' token -------------------------------------------------------------------------------------------

    def _take(self) -> None:
        """The token for a put, at once or after a long holder (``_hold``). ``put_step`` and ``put_phase`` (a row each
        an iteration) take it inline: this call would cost them about half of what the token saves over a lock."""
        token = self._token
        try:
            token.pop()
            return
        except IndexError:
            pass
        except BaseException:
            token.append(True)  # raised as the pop returned with the token (put_step says why)
            raise
        self._hold()
        self._lock.release()

    def _hold(self) -> None:
        """``_lock`` and the token, for whoever may keep them for longer than a put (it may flush)."""
        self._lock.acquire()
        token = self._token
        try:
            while True:
                try:
                    token.pop()
                except IndexError:
                    time.sleep(TOKEN_WAIT_S)  # gives the GIL to the put that holds it
                    continue
                except BaseException:
                    token.append(True)  # raised as the pop returned with the token (put_step says why)
                    raise
                return
        except BaseException:
            self._lock.release()
            raise

    def _let_go(self) -> None:
        self._token.append(True)
        self._lock.release()

    def _flush(self) -> None:
        if not self._queued:
            return
        if self._rows:
            self._cut()
        batch, self._batch = self._batch, []
        self._before_rows = 0
        self._due_t = 0.0  # keeps no clock reading of the window alive past it (and opens the next: _arrived)
        self._loop_flushed = True  # (or the flush thread, which clears it next)
        slots = self._slots
        slots[WINDOWS] += 1
        if slots[WINDOWS] == self._start_windows:  # the process's first windows are over: the steady bounds
            self.window_s, self.max_records = self._steady
        if self.max_records > self._capacity:
            self._columns(self.max_records)  # a larger window asked for since (tests, benches)
        self._limits()
        slots[HANDED] = self.steps
        self._send(batch)

    def _cut(self) -> None:
        """The rows written so far become one block at the end of the batch; the columns start over, emptied (they
        keep no value of a window that left alive)."""
        from trainmeter_core.model import records

        s, p, m, rows = self._s, self._p, self._m, self._rows
        nones = self._nones
        taken: dict[str, list] = {}
        for count, (names, cells) in zip((s, p, m), self._kinds, strict=True):
            width = len(names)
            end = count * width
            for index, name in enumerate(names):
                taken[name] = cells[index:end:width]
            cells[:end] = nones[:end]  # the block holds them now: no value of a window outlives it here
        losses = s - taken["loss"].count(None)  # a step's row stands for two records when it holds a loss
        tokens_absent = None
        if s and self._tokens_source is None:
            taken["tokens"] = []  # its steps' Nones: a block of steps without a count has no tokens column
            tokens_absent = NO_TOKENS
        block = records.Block(
            rows=rows + losses,
            order="".join(self._order[:rows]),
            tokens_source=self._tokens_source if s else None,
            tokens_absent=tokens_absent,
            dp=self._dp if s else None,
            loss_origin=self._loss_origin,
            **taken,
        )
        self._order[:rows] = nones[:rows]
        self._batch.append(block)
        self._s = self._p = self._m = self._rows = 0
        self._before_rows += rows
        self._limits()

    # -- the flush thread ---------------------------------------------------------------------------------------------

    def _wake(self) -> None:
        """A window opened while the flush thread sleeps without a deadline (the first row of a process, or the
        first after a quiet spell): it starts, or wakes, to watch this window."""
        self._idle = False
        if self._timer is None:
            self._timer = threading.Thread(target=self._run, name="tm-agent-flush", daemon=True)
            self._timer.start()
        else:
            self._due.set()

    def _run(self) -> None:
        """Sleep a window, or longer while the loop closes its windows itself (doubling up to QUIET_MAX_S); send a
        window the loop left open once it is due; sleep without a deadline once nothing is queued."""
        # It sleeps only for durations made once, before its first sleep, and keeps no clock reading or count of the
        # loop's while it sleeps (a flag says the loop flushed): tests/e2e/test_agent_steady_alloc.py sees what is
        # alive, and would see a number the thread made in a wake-up held through its next sleep.
        # The lock is taken by _hold, not a with block: a thread waiting for it there holds the lock's bound __exit__,
        # an object the test would see if it looked while the loop held the lock.
        window_s = self.window_s
        sleeps = _sleeps(window_s)
        last = len(sleeps) - 1
        level = 0
        while True:
            self._loop_flushed = False
            # The process's first windows are over (once a process): the steady window's sleeps from here
            if self.window_s != window_s:
                window_s = self.window_s
                sleeps = _sleeps(window_s)
                last = len(sleeps) - 1
                level = min(level, last)
            time.sleep(sleeps[level])
            self._hold()
            try:
                if self._loop_flushed and self._queued:
                    # The loop closed the window itself and opened another: it is busy, look again later.
                    if level < last:
                        level += 1
                    continue
                level = 0
                if self._queued and self.ready and time.monotonic() >= self._due_t:
                    try:
                        self._flush()
                    except Exception:
                        pass  # the send path says its own errors; the thread stays
                if self._queued:
                    continue  # not due yet, or not ready: look again a window later
                self._idle = True
                self._due.clear()
            finally:
                self._let_go()
            self._due.wait()

    # -- fork -----------------------------------------------------------------------------------------------------

    def before_fork(self) -> None:
        """What the parent queued leaves before the fork, so the child starts with nothing of it."""
        try:
            if self.ready and self._pid == os.getpid():
                self.flush()
        except Exception:
            pass

    def after_fork_child(self) -> None:
        """A fork child: no flush thread (threads do not survive a fork), no lock held by one, nothing queued, and a
        step page of its own once it steps (the parent's mapping is left alone)."""
        self.page = self.page.after_fork()
        self._reset()
