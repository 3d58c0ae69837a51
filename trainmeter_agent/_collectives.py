"""The collective probe: which collectives this rank ran in each step (operation, process group, sequence number in
the group, bytes), when it arrived at them and how long it waited for them exposed; and, when the rank stops stepping,
where it waits, with its stacks.

The collectives are read from torch's flight recorder (on by default for Gloo and NCCL, DDP's C++ all_reduces
included) by the probe's own thread, never on the training thread; the step boundaries come from the step records as
they leave for the bus, and the training thread only pays two clock reads per ``backward()`` and per Python
``Work.wait()``. It never runs a collective, registers no communication hook and changes no process group
(docs/architecture.md, "The collective probe: sources measured").
"""

from __future__ import annotations

import collections
import os
import pickle
import sys
import threading
import time
import traceback

from trainmeter_agent._collective_rows import collective_bytes, op_name, step_rows, step_summaries

#: How often the probe's thread wakes: to see a rank that stopped stepping, and to read the recorder when due.
POLL_S = 1.0
#: How often the recorder's entries are read at most; and the share of the time reads may take, which spaces them
#: further apart (a read holds the GIL for 12-30 ms with the ring's 2000 entries: bench/bench_collectives.py).
READ_EVERY_S, READ_SHARE = 5.0, 0.002
#: No step for this long: the rank says where it waits, with its stacks (``TM_COLLECTIVE_STALL_S`` overrides it; the
#: hung rule's ``collective_floor_s`` judges the reports, so this only needs to be well under it).
STALL_S = 10.0
#: The fact a stalled rank sends (per rank), and sends again with ``stalled`` False once it steps again.
STALL_FACT = "collective.stall"
#: The metric rows' origin: ``collectives:<group name>``.
ORIGIN = "collectives"
#: The deepest frames kept per thread in a stall report, and the most characters of all stacks together.
STACK_FRAMES, STACK_CHARS = 40, 32_000


class CollectiveProbe:
    """Made when the user's code imports torch; its thread starts at the first step records that leave after
    ``torch.distributed`` has a process group."""

    def __init__(self, agent) -> None:
        self.agent = agent
        self.on = True
        self._dist = None
        self._c10d = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._reading = threading.Lock()  # the thread's reads and the last one at exit
        self._boundaries: collections.deque = collections.deque()  # emptied by each read but its last
        self._backwards: collections.deque = collections.deque()  # (start, end) of each outermost backward()
        # (start, end) of each Work.wait() Python makes outside backward
        self._waits: collections.deque = collections.deque()
        self._depth = 0
        self._last_step: int | None = None
        self._last_step_t = time.monotonic()
        self._cursor = -1  # the last recorder entry already counted in a step
        self._read_t = 0.0
        self._read_every_s = READ_EVERY_S
        self._stall_step: int | None = None  # the step a stall report went out at
        # Each process group's size by its name, kept from while the groups live: the last read, at exit, may come
        # after the loop destroyed them (saw_batch looks again when their number changes: one len() per batch; each
        # read looks too, for a group destroyed and another made between two batches).
        self._group_sizes: dict[str, int] = {}
        self._groups_seen = 0
        stall = os.environ.get("TM_COLLECTIVE_STALL_S")
        self.stall_s = float(stall) if stall else STALL_S

    # -- the agent's part -------------------------------------------------------------------------------------------

    def attach(self, torch) -> None:
        """Nothing to hook: the step boundaries come from the step records the agent sends (``saw_batch``)."""
        import torch.distributed as dist

        self._dist = dist

    def saw_batch(self, batch: list) -> None:
        """The step records of a batch leaving for the bus (the agent's ``_send_batch``): their boundaries, appended
        at C speed; the thread starts once ``torch.distributed`` has a process group."""
        try:
            if self._thread is None:
                if self._dist is None:
                    return
                self._start()
                if self._thread is None:
                    return  # not distributed (yet): no boundary is kept
            boundaries = self._boundaries
            for record in batch:
                kind = type(record).__name__
                if kind == "Block":
                    if record.step:
                        boundaries.extend(zip(record.step, record.step_t, strict=True))
                elif kind == "Step":
                    boundaries.append((record.step, record.t))
            if boundaries:
                self._last_step, self._last_step_t = boundaries[-1]
            world = getattr(sys.modules.get("torch.distributed.distributed_c10d"), "_world", None)
            names = getattr(world, "pg_names", None)
            if names is not None and len(names) != self._groups_seen:
                self._groups_seen = len(names)
                self._group_sizes.update(group_sizes())
        except Exception as exc:
            # The outbox's lock is held here, and saying so sends a notice: another thread says it once it is free.
            self.on = False
            self._stop.set()
            threading.Thread(target=self.agent.stop_probe, args=("collectives", exc), daemon=True).start()

    def _start(self) -> None:
        dist = self._dist
        if not (dist.is_available() and dist.is_initialized()):
            return  # not distributed (yet): asked again at the next step
        from torch._C import _distributed_c10d

        # Nothing is sent from here: the outbox's lock is held while a batch leaves (the thread says it instead).
        self._c10d = getattr(_distributed_c10d, "_dump_fr_trace", None) and _distributed_c10d
        if self._c10d is not None:
            self._time_backward()
        self._thread = threading.Thread(target=self._run, name="tm-agent-collectives", daemon=True)
        self._thread.start()

    def _time_backward(self) -> None:
        """Wrap ``torch.autograd.backward`` (outside the loss probe's wrapper) to note when each outermost call began
        and returned: two clock reads per backward(), on a distributed job only."""
        import torch.autograd as autograd

        original = autograd.backward
        probe = self
        spans = self._backwards
        clock = time.monotonic

        def backward(*args, **kwargs):
            if probe._depth or not probe.on:
                return original(*args, **kwargs)
            probe._depth = 1
            started = clock()
            try:
                return original(*args, **kwargs)
            finally:
                probe._depth = 0
                spans.append((started, clock()))

        backward._tm_wrapped = True  # the loss probe's mark: a second attach leaves it as it is
        backward.__wrapped__ = original
        autograd.backward = backward
        self._time_waits()

    def _time_waits(self) -> None:
        """Wrap ``Work.wait`` to note each wait Python makes outside backward (a synchronous collective waits there:
        ``torch.distributed``'s functions call it); DDP's reducer waits in C++, which this never sees."""
        from torch._C._distributed_c10d import Work

        original = Work.wait
        probe = self
        spans = self._waits
        clock = time.monotonic

        def wait(work, *args, **kwargs):
            if probe._depth or not probe.on:
                return original(work, *args, **kwargs)
            started = clock()
            try:
                return original(work, *args, **kwargs)
            finally:
                spans.append((started, clock()))

        wait.__wrapped__ = original
        Work.wait = wait

    def stop(self, exc: BaseException) -> None:
        """An internal error: the probe stops (its hook and thread), the agent says so once."""
        self.on = False
        self._stop.set()
        self.agent.stop_probe("collectives", exc)

    def after_fork(self) -> None:
        """A fork child (a DataLoader worker) runs no collective of the job: the probe stays off there."""
        self.on = False
        self._stop.set()

    # -- the probe's thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        if self._c10d is None:
            self.on = False  # no boundary is kept either
            self.agent.probe_state("collectives", "not attached: this torch has no flight recorder")
            return
        self.agent.probe_state("collectives", "attached")
        while not self._stop.wait(POLL_S):
            try:
                self.agent.check_fault("collectives")
                now = time.monotonic()
                if now - self._read_t >= self._read_every_s:
                    self._read_t = now
                    self.read_steps()
                    self._read_every_s = max(READ_EVERY_S, (time.monotonic() - now) / READ_SHARE)
                self._check_stall(now)
            except Exception as exc:
                self.stop(exc)
                return

    def _dump(self) -> dict:
        return pickle.loads(self._c10d._dump_fr_trace(includeStackTraces=False))

    def at_exit(self) -> None:
        """The process ends: the thread stops and the steps not read yet are read now (the agent flushed their step
        records just before)."""
        self._stop.set()
        if self.on and self._c10d is not None:
            self.read_steps()

    def read_steps(self) -> None:
        """Send the figures of the steps that ended since the last read, one metric row per step and group."""
        with self._reading:
            if self._boundaries:
                self._read_steps()

    def _read_steps(self) -> None:
        boundaries = list(self._boundaries)
        dump = self._dump()
        offset_s = clock_offset()
        entries = [e for e in dump.get("entries", ()) if e["record_id"] > self._cursor]
        if entries and self._cursor >= 0 and entries[0]["record_id"] > self._cursor + 1:
            # The recorder's ring turned over between two reads: the steps it dropped are left out, never undercounted.
            # The first step that ended after the oldest entry held is partial: its end is the next step's start.
            first_t = entries[0]["time_created_ns"] / 1e9 - offset_s
            boundaries = [b for b in boundaries if b[1] > first_t]
            if boundaries:
                start_ns = (boundaries[0][1] + offset_s) * 1e9
                partial = [e for e in entries if e["time_created_ns"] < start_ns]
                if partial:
                    self._cursor = max(self._cursor, max(e["record_id"] for e in partial))
                entries = entries[len(partial) :]
            self.agent.say(
                "agent collectives: the flight recorder's ring turned over between reads; some steps have no "
                "collective figures (raise TORCH_FR_BUFFER_SIZE)",
                once_key="collectives.ring",
            )
        backwards, waits = list(self._backwards), list(self._waits)
        rows, used = step_rows(entries, boundaries, offset_s, backwards, waits)
        if used >= 0:
            self._cursor = used
        # Every entry made before the last boundary read is counted: that boundary stays, as the next step's start
        # (the loop appends more meanwhile, at the right end).
        for _ in range(len(boundaries) - 1):
            self._boundaries.popleft()
        if boundaries:
            last_t = boundaries[-1][1]
            for spans in (self._backwards, self._waits):
                while spans and spans[0][1] <= last_t:
                    spans.popleft()
        for end_t, step, group, values in rows:
            self.agent._queue_metric(end_t, values, step, f"{ORIGIN}:{group}")
        # The step's row for the engine (the straggler, bus bandwidth): every group's collectives together.
        self._group_sizes.update(group_sizes())  # (none once the loop destroyed its groups: those kept stay)
        for end_t, step, values in step_summaries(rows, self._group_sizes):
            self.agent._queue_metric(end_t, values, step, ORIGIN)

    def _check_stall(self, now: float) -> None:
        """Say where this rank waits once it has gone ``stall_s`` without a step, and that it steps again once it
        has. The steps are learnt as their records leave (``saw_batch``), so a step made before the stall report may
        be learnt after it (its window left late, on a loaded machine): when the step learnt is itself ``stall_s`` or
        more ago, the rank is still stalled, and a new report takes the old one's place at once. Saying "stepping
        again" in between would leave the hub a moment with no report from this rank, which the hung rule reads as a
        rank that never entered the collective and sent no report: a second alert for the same hang."""
        step = self._last_step
        if step == self._stall_step:
            return  # said already for this step
        stalled = now - self._last_step_t >= self.stall_s
        if self._stall_step is not None and not stalled:
            self._stall_step = None
            self.agent.fact(STALL_FACT, {"stalled": False, "step": step}, "collectives")
            return
        if not stalled:
            return
        self._stall_step = step
        self.agent.fact(STALL_FACT, self.stall_report(now), "collectives")

    def stall_report(self, now: float) -> dict:
        """Where this rank is after ``stall_s`` with no step: each of its groups (global ranks, the last sequence
        number it entered and the last completed), the collectives it waits in, a phase tm knows it is in, and the
        Python stacks of all its threads."""
        dump = self._dump()
        status = dump.get("pg_status") or {}
        groups = {}
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        world = getattr(c10d, "_world", None)
        for pg, name in dict(getattr(world, "pg_names", {}) or {}).items():
            try:
                ranks = sorted(c10d.get_process_group_ranks(pg))
            except Exception:
                continue
            seen = status.get(name) or {}
            groups[name] = {
                "desc": getattr(pg, "group_desc", "") or "",
                "ranks": ranks,
                "entered": int(seen.get("last_enqueued_collective", 0) or 0),
                "completed": int(seen.get("last_completed_collective", 0) or 0),
            }
        waiting = []
        offset_s = time.time() - now  # the wall clock's lead over the monotonic one
        for entry in dump.get("entries", ()):
            group = str((entry.get("process_group") or ("?",))[0])
            known = groups.get(group)
            if known is None or entry.get("is_p2p"):
                continue
            seq = entry["collective_seq_id"]
            if known["completed"] < seq <= known["entered"]:
                waiting.append(
                    {
                        "group": group,
                        "op": op_name(entry),
                        "seq": seq,
                        "bytes": collective_bytes(entry),
                        "waiting_s": round(now - (entry["time_created_ns"] / 1e9 - offset_s), 3),
                    }
                )
        return {
            "stalled": True,
            "step": self._last_step,
            "since_step_s": round(now - self._last_step_t, 3),
            "groups": groups,
            "waiting": waiting,
            "phase": self._phase(),
            "stacks": all_stacks(),
        }

    def _phase(self) -> str | None:
        """A phase this rank is in that tm knows (a checkpoint being saved, an evaluation), else None."""
        from trainmeter_agent import _phases

        if _phases._CHECKPOINT_DEPTH[0] > 0:
            return "checkpoint"
        model = self.agent.model
        if model is not None and getattr(model, "framework_eval", 0) > 0:
            return "eval"
        return None


def clock_offset() -> float:
    """The wall clock's lead over the monotonic one, from the closest of three readings of the monotonic clock around
    the wall clock's: the recorder dates its entries by the wall clock, the steps and waits are monotonic, and a thread
    preempted between two plain reads would move every entry of a read by as long."""
    best = None
    for _ in range(3):
        before = time.monotonic()
        wall = time.time()
        after = time.monotonic()
        if best is None or after - before < best[0]:
            best = (after - before, wall - (before + after) / 2)
    return best[1]


def group_sizes() -> dict[str, int]:
    """The number of ranks of each process group this rank knows, by the name the flight recorder gives it."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    world = getattr(c10d, "_world", None)
    sizes = {}
    for pg, name in dict(getattr(world, "pg_names", {}) or {}).items():
        try:
            sizes[str(name)] = len(c10d.get_process_group_ranks(pg))
        except Exception:
            continue
    return sizes


def all_stacks() -> str:
    """The Python stacks of every thread of this process, innermost frame last, the way a traceback prints them."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        lines = traceback.format_stack(frame, limit=STACK_FRAMES)
        parts.append(f'Thread "{names.get(ident, "?")}" ({ident}):\n' + "".join(lines))
    text = "\n".join(parts)
    return text if len(text) <= STACK_CHARS else text[:STACK_CHARS] + "\n[cut]"
