"""The hub in the launcher: PULL -> validate -> sequence number -> recorder -> XPUB.

Every record accepted gets the next sequence number, goes to the recorder, and is republished as the bytes the
producer sent (never re-encoded), grouped with the records around it (``bus/publish.py``). A ``block`` (a training
process's steps, losses, phases and metrics as columns) is taken in bulk: checked once, numbered as the records it
stands for (its ``seq`` the last of them), written as one line and published alone; nothing here is done per row.
Once a second the hub publishes a ``tick`` (the engine's and the alert rules' only clock) and every few seconds
``bus.stats``. Malformed frames are counted and dropped; kinds and fields from a newer writer are kept and counted as
unknown; nothing a producer sends can stop the hub. A GPU sample from a node of a job is taken typed too
(``bus/sample_intake.py``): one decode, the same line.

Why one module: every way in (a record, a block, a GPU sample, a record after the end) takes the next sequence number
and feeds the same counts, recorder, publication and forwarder, on the hub's one thread; split, each part would take
that state as an argument and change it behind the others' backs.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from trainmeter_core.bus import block_intake, sample_intake, tick_clock
from trainmeter_core.bus.client import BATCH_TOPIC, HOSTNAME, poll_ms
from trainmeter_core.bus.publish import Publication
from trainmeter_core.model import records
from trainmeter_core.runlog.recorder import Recorder

RCVHWM = 1_000_000
FINAL_FLUSH_WAIT_S = 2.0
#: The agent's fact naming a folder torch.profiler wrote traces to (the launcher imports them at the run's end).
PROFILER_DIR_FACT = "profiler.trace_dir"
#: A bigger frame disconnects its sender rather than eating the launcher's memory.
MAX_FRAME_B = 64 * 1024 * 1024
#: Kinds a node of a job never forwards, and the job hub never takes from one: its clock and counters are its own, the
#: derived kinds are recomputed, and only the job hub speaks of nodes and clocks.
NOT_FORWARDED = records.DERIVED_KINDS | {"tick", "bus.stats", "node", "clock"}
_SAMPLE_GPU = sample_intake.KIND


class Hub:
    def __init__(
        self,
        in_endpoint: str,
        out_endpoint: str,
        recorder: Recorder | None,
        *,
        tick_s: float = 1.0,
        stats_every_s: float = 5.0,
        child_alive: Callable[[], bool] = lambda: True,
        after_seq: int = 0,
        after_tick: int = 0,
    ) -> None:
        """``after_seq`` and ``after_tick`` go on with a log already written (a resumed run): the first record gets
        ``after_seq + 1`` and the first tick ``after_tick + 1``, so sequence numbers and ticks never repeat in a log."""
        self.in_endpoint = in_endpoint
        self.out_endpoint = out_endpoint
        self.recorder = recorder
        self.tick_s = tick_s
        self.stats_every_s = stats_every_s
        self.child_alive = child_alive
        self.ctx = zmq.Context(io_threads=1)
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.RCVHWM, RCVHWM)
        self.pull.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_B)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.SNDHWM, RCVHWM)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pull.bind(in_endpoint)
        self.pub.bind(out_endpoint)
        self.out = Publication(self.pub)
        # A log already written goes on: a resumed run, a finished run reopened by tm import.
        self.seq = after_seq
        self.received = self.malformed = self.unknown = 0
        self.last_malformed: str | None = None  # why the last malformed record was refused, in one line
        self.kinds: dict[str, int] = {}
        # Step records per rank, [steps, skipped]: the run's steps are its lowest rank's (rank 0 on the job's first
        # node; on another node of a job, its own first rank, not a 0 for the rank 0 it never hosts).
        self._rank_steps: dict[int, list[int]] = {}
        self.dropped: dict[str, int] = {}
        # Steps received from each producer of this node (source@host:pid), blocks' rows included: what the launcher
        # compares with a killed process's own count on its step page (trainmeter_core/bus/step_page.py).
        self.producer_steps: dict[str, int] = {}
        self.open_producers: set[str] = set()
        self.hello_pids: set[int] = set()  # processes whose agent said hello (the silence watch asks)
        self.last_snapshot: dict[str, Any] | None = None
        self.profiler_dirs: list[str] = []  # where torch.profiler wrote traces (imported at the end)
        self.ticks = after_tick
        self._inbox: deque[records.Record] = deque()
        self._finish: records.RunEnd | None = None
        self._before_end: Callable[[list[str]], list[records.Record]] | None = None
        self.ended_without_bye: list[str] = []  # producers that said hello and never bye, as the run ended
        self._ended = threading.Event()
        self._stop_requested = False
        self.seq_of_end = 0  # run.end's sequence number, once the run has ended
        self.late = 0  # records that arrived after run.end: published if snapshots, never written
        self.done_components: set[str] = set()  # done after run.end (ComponentContext.done): not written
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tm-hub", daemon=True)
        # Other threads wake the hub's poll through a pipe (zmq sockets may only be touched by the hub's thread).
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_lock = threading.Lock()
        self.error: str | None = None
        self.job: Any = None  # the job hub's tcp side (bus/jobhub.py), on node rank 0 of a job
        self.forwarder: Any = None  # the forwarder to the job hub (bus/forward.py), on every other node

    def listen_job(self, endpoint: str, keys, nnodes: int, say: Callable[[str], None]) -> str:
        """Take the records of a job's other nodes on ``endpoint`` (tcp, CURVE); returns the address bound. Call
        before ``start``."""
        from trainmeter_core.bus.jobhub import JobListener

        self.job = JobListener(self.ctx, endpoint, keys, nnodes, self._accept, self._own, say)
        return self.job.endpoint

    # -- control from other launcher threads ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def inject(self, record: records.Record) -> None:
        """Publish and record one of the launcher's own records (thread-safe; in hub order within 50 ms)."""
        self._inbox.append(record)
        self._wake()

    def end(
        self,
        run_end: records.RunEnd,
        timeout_s: float = 10.0,
        before_end: Callable[[list[str]], list[records.Record]] | None = None,
    ) -> None:
        """Drain what producers already sent, then record and publish the final ``bus.stats`` and ``run.end``.

        ``before_end``, given the producers that said hello and never bye, returns records to log before the end (the
        launcher's notice that their last records were lost).

        After the end only derived kinds and alerts still pass: the engine's final snapshot and its last history delta,
        computed from ``run.end`` (published, never written), and alerts computed from that snapshot, such as the
        training process having died (published and written, after ``run.end``). Anything else arriving late is counted
        in ``late`` and dropped.
        """
        self._before_end = before_end
        self._finish = run_end
        self._wake()
        self._ended.wait(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the hub's thread and close its sockets (after ``end``); every record injected before the call is
        recorded and published first."""
        self._stop_requested = True
        self._wake()
        self._finished.wait(timeout_s)

    def finish(self, run_end: records.RunEnd, timeout_s: float = 10.0) -> None:
        """``end`` then ``stop``: for a run with no engine to wait for."""
        self.end(run_end, timeout_s)
        self.stop(timeout_s)

    def _wake(self) -> None:
        with self._wake_lock:
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"w")
            except OSError:  # the pipe is full: the hub is already awake
                pass

    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    # -- the loop --------------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._serve()
        except Exception as exc:  # a bug here must not take the training down: the launcher reports it
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            if self.job is not None:
                self.job.close()
            self.pull.close(0)
            self.pub.close(0)
            self.ctx.term()
            with self._wake_lock:
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_w = -1
            self._ended.set()
            self._finished.set()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        poller.register(self.pub, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        job = self.job
        if job is not None:
            for sock in job.sockets():
                poller.register(sock, zmq.POLLIN)
        now = time.monotonic()
        next_tick = tick_clock.first_tick(now, self.tick_s)
        next_stats = now + self.stats_every_s
        while True:
            due = (
                min(next_tick, next_stats) if job is None else min(next_tick, next_stats, job.next_timer(now))
            )
            events = dict(poller.poll(poll_ms(due - time.monotonic())))
            if self._wake_r in events:
                try:
                    os.read(self._wake_r, 4096)
                except OSError:
                    pass
            if self.pub in events:
                self.out.drain_subscriptions()
            if self.pull in events:
                self._drain_pull(limit=20_000)
            while self._inbox:
                self._own(self._inbox.popleft())
            now = time.monotonic()
            if job is not None and self._ended.is_set():
                # The job's run has ended: what a node sends from now on can no longer be recorded, so it is neither
                # read nor acknowledged. Acknowledged, the node would take it as delivered; unacknowledged, the node
                # says how many of its records did not reach the job hub (its own log has them all).
                for sock in job.sockets():
                    poller.unregister(sock)
                job = None
            if job is not None:
                job.handle({sock for sock in job.sockets() if sock in events})
                job.tick(now)
            if self._ended.is_set():
                next_tick = next_stats = now + 3600  # the run is over: no more clock, no more stats
            if now >= next_tick:
                self.ticks += 1
                self._own(
                    records.Tick(n=self.ticks, interval_s=self.tick_s, child_alive=bool(self.child_alive()))
                )
                next_tick += self.tick_s
                if next_tick < now:  # the machine stalled: skip the missed ticks instead of bursting them
                    next_tick = tick_clock.next_tick(now, self.tick_s)
            if now >= next_stats:
                self._own(self.stats())
                next_stats = now + self.stats_every_s
            if self._finish is not None and not self._ended.is_set():
                self._drain_pull(limit=None)
                while self._inbox:
                    self._own(self._inbox.popleft())
                # Everything sent is in: a producer still open now will never say goodbye (its process is gone).
                self.ended_without_bye = sorted(self.open_producers)
                if self._before_end is not None:
                    for record in self._before_end(self.ended_without_bye):
                        self._own(record)
                if self.recorder is not None:
                    # The final stats report the flush of everything before them (a disk that fails gets a bound).
                    self.recorder.flush(FINAL_FLUSH_WAIT_S)
                self._own(self.stats(final=True))
                self._own(self._finish)
                self.seq_of_end = self.seq
                if job is not None:
                    job.ack_recorded()  # every record a node sent so far is in the log: the nodes may know it
                self.out.flush()
                self._ended.set()
            self.out.flush()
            if self._stop_requested:
                # What was injected before ``stop`` is recorded: an append that landed after this pass's look at the
                # inbox would otherwise be lost with the thread (seen with ``tm import``: 5 of 6 records written).
                while self._inbox:
                    self._own(self._inbox.popleft())
                self.out.flush()
                return

    def listening(self, kind: str) -> bool:
        """Whether a subscriber receives records of this kind now (so publishing one is worth waiting for)."""
        return self.out.listening(kind)

    @property
    def topics(self) -> set[bytes]:
        """The topic prefixes subscribers hold now."""
        return self.out.topics

    @property
    def published(self) -> int:
        """Records published so far (``bus.stats``)."""
        return self.out.published

    def _drain_pull(self, limit: int | None) -> None:
        n = 0
        while limit is None or n < limit:
            try:
                frames = self.pull.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            n += 1
            if len(frames) != 2:
                self.malformed += 1
                continue
            if frames[0] == BATCH_TOPIC:
                try:
                    items = records.split_batch(frames[1])
                except records.MalformedRecord:
                    self.malformed += 1
                    continue
                self._accept_batch(frames[1], items)
            else:
                self._accept(frames[1])

    def _accept_batch(self, payload: bytes, items: list) -> None:
        """A producer's batch, in order: its blocks each in one typed decode (``bus/block_intake.py``), its other
        records checked together (``check_batch``: two decodes of their array, one Checked per item, or None)."""
        blocks = [block_intake.looks_like_block(raw) for raw in items]
        others = [raw for raw, block in zip(items, blocks, strict=True) if not block]
        if len(others) < len(items):
            payload = b"".join([b"\xdd" + len(others).to_bytes(4, "big"), *others])
        # None for every record once check_batch found a bad one: each is then checked alone.
        checked = iter(records.check_batch(payload) or ()) if len(others) > 1 else iter(())
        for raw, block in zip(items, blocks, strict=True):
            self._accept(raw, checked=None if block else next(checked, None))

    def _own(self, record: records.Record) -> None:
        record.v = records.SCHEMA_VERSION
        record.t = record.t or time.monotonic()
        record.wall = record.wall or time.time()
        record.source = record.source or "hub"
        record.host = record.host or HOSTNAME
        record.pid = record.pid or os.getpid()
        self._accept(records.encode(record))

    def _accept(self, payload, node_host: str | None = None, checked: records.Checked | None = None) -> bool:
        """Check, number, record and publish one record; ``node_host`` names the node that forwarded it, on the job
        hub; ``checked``, what ``check_batch`` already learned of it. False when it is malformed."""
        if self._ended.is_set():
            self._late(payload)
            return True
        self.received += 1
        if checked is None:
            lead = records.leading_kind(payload)
            if node_host is None and (unread := self.out.unheard(lead)) is not None:
                self.seq, self.kinds[unread] = self.seq + 1, self.kinds.get(unread, 0) + 1
                return True
            # A block, or a GPU sample, in one typed decode; anything it refuses takes the general check below
            if lead == "block":
                block = block_intake.decode_block(payload)
                if block is not None:
                    return self._accept_block(payload, block, None, node_host)
            elif lead == sample_intake.KIND:
                sample = sample_intake.decode_sample(payload)
                if sample is not None:
                    return self._accept_sample(payload, sample, node_host)
            try:
                checked = records.check(payload)
            except records.MalformedRecord as exc:
                return self._refuse(exc)
        kind = checked.kind
        if kind == "block":
            return self._accept_block(payload, checked.record, checked.data, node_host, checked.unknown)
        if node_host is not None and (kind in NOT_FORWARDED or checked.data.get("host") != node_host):
            # A node speaks for itself only: never for the hub's host, another node, or in the hub's own kinds.
            self.malformed += 1
            return False
        self.seq += 1
        data = checked.data
        data["seq"] = self.seq
        if checked.unknown:
            self.unknown += 1
        if kind in records.DERIVED_KINDS:  # published, never written: replay recomputes them
            if kind == "snapshot":
                self.last_snapshot = data
        elif self.recorder is not None:
            self.recorder.put(data)
        self.out.publish(kind, payload, self.seq)
        self._observe(kind, data, node_host is not None)
        if self.forwarder is not None and kind not in NOT_FORWARDED:
            self.forwarder.put(payload)
        return True

    def _accept_block(
        self, payload, block: records.Block, data: dict[str, Any] | None, node_host: str | None, unknown=False
    ) -> bool:
        """A block, typed: checked, numbered as its rows (its ``seq`` the last), recorded as one line (from ``data``,
        the checked mapping, when its check decoded one: it keeps fields this version does not know), published alone
        and counted as its rows. Nothing here is done per row."""
        if node_host is not None and block.host != node_host:
            self.malformed += 1
            return False
        try:
            block_intake.check(block)
        except records.MalformedRecord as exc:
            return self._refuse(exc)
        rows = block.rows
        self.received += rows - 1
        self.seq += rows
        if self.recorder is not None:
            if data is None:
                block.seq = self.seq
                self.recorder.put_block(block)
            else:
                data["seq"] = self.seq
                self.recorder.put(data)
        self.out.publish_block(payload, self.seq - rows + 1, rows)
        self._observe_block(block, node_host is not None)
        self.unknown += unknown  # fields of a newer writer, kept in the log's line
        if self.forwarder is not None:
            self.forwarder.put(payload)
        return True

    def _accept_sample(self, payload, sample, node_host: str | None) -> bool:
        """A GPU sample decoded typed (``bus/sample_intake.py``), taken as ``_accept`` takes any record: its line (made
        from the typed record) is the one the general check's mapping makes, and it is counted the same."""
        if node_host is not None and sample.host != node_host:
            self.malformed += 1  # a node speaks for itself only
            return False
        self.seq += 1
        if self.recorder is not None:
            self.recorder.put_record(sample, _SAMPLE_GPU, self.seq)
        self.out.publish(_SAMPLE_GPU, payload, self.seq)
        kinds = self.kinds
        kinds[_SAMPLE_GPU] = kinds.get(_SAMPLE_GPU, 0) + 1
        self._note_dropped(records.producer_key(sample.source, sample.host, sample.pid), sample.dropped)
        if self.forwarder is not None:
            self.forwarder.put(payload)
        return True

    def _refuse(self, exc: records.MalformedRecord) -> bool:
        """Count a malformed record and keep its one line (``last_malformed``, for whoever reports on the hub)."""
        self.malformed += 1
        self.last_malformed = str(exc)
        return False

    def _late(self, payload) -> None:
        try:
            checked = records.check(payload)
        except records.MalformedRecord:
            return
        if checked.kind == "component" and checked.data.get("event") == "stopped":
            self.done_components.add(str(checked.data.get("name")))
            return
        if checked.kind not in records.DERIVED_KINDS and checked.kind != "alert":
            self.late += 1
            return
        self.seq += 1
        checked.data["seq"] = self.seq
        if checked.kind in records.DERIVED_KINDS:
            if checked.kind == "snapshot":
                self.last_snapshot = checked.data
        elif self.recorder is not None:
            # An alert computed from the final snapshot (the training process died) is written after run.end.
            self.recorder.put(checked.data)
            self.kinds["alert"] = self.kinds.get("alert", 0) + 1
        self.out.publish(checked.kind, payload, self.seq)

    def _observe(self, kind: str, data: dict[str, Any], remote: bool = False) -> None:
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        key = records.producer_key(data.get("source"), data.get("host"), data.get("pid"))
        self._note_dropped(key, data.get("dropped", 0))
        if remote:
            return  # another node's agents: its own launcher waits for them and watches their silence
        if kind == "step":
            self.producer_steps[key] = self.producer_steps.get(key, 0) + 1
            rank = data.get("rank")
            rank = rank if isinstance(rank, int) else 0
            counts = self._rank_steps.get(rank)
            if counts is None:
                counts = self._rank_steps[rank] = [0, 0]
            counts[0] += 1
            if data.get("skipped"):
                counts[1] += 1
        elif kind == "hello":
            self.open_producers.add(key)
            pid = data.get("pid")
            if isinstance(pid, int):
                self.hello_pids.add(pid)
        elif kind == "bye":
            self.open_producers.discard(key)
        elif kind == "fact" and data.get("name") == PROFILER_DIR_FACT:
            folder = data.get("value")
            if isinstance(folder, str) and folder not in self.profiler_dirs and len(self.profiler_dirs) < 64:
                self.profiler_dirs.append(folder)

    def _note_dropped(self, key: str, dropped: object) -> None:
        """Keep a producer's drop count from a record's header (the last one it sent is authoritative)."""
        if isinstance(dropped, int) and (dropped or key in self.dropped):
            self.dropped[key] = dropped

    def _observe_block(self, block: records.Block, remote: bool) -> None:
        """A block's counts, as its rows would have made them one by one; from its letters, never row by row."""
        kinds, per_kind = self.kinds, records.block.counts(block)
        for kind, count in per_kind.items():
            if count:
                kinds[kind] = kinds.get(kind, 0) + count
        steps = per_kind["step"]
        key = records.producer_key(block.source, block.host, block.pid)
        self._note_dropped(key, block.dropped)
        if remote or not steps:
            return  # another node's agents: its own launcher counts their steps
        self.producer_steps[key] = self.producer_steps.get(key, 0) + steps
        counts = self._rank_steps.setdefault(block.rank if block.rank is not None else 0, [0, 0])
        counts[0] += steps  # a block's steps are steady: none of them skipped

    @property
    def steps(self) -> int:
        """Steps of the run so far: the step records of its lowest rank on this node."""
        return self._rank_steps[min(self._rank_steps)][0] if self._rank_steps else 0

    @property
    def skipped_steps(self) -> int:
        """Steps that rank's optimizer skipped (GradScaler found inf or NaN gradients)."""
        return self._rank_steps[min(self._rank_steps)][1] if self._rank_steps else 0

    def stats(self, final: bool = False) -> records.BusStats:
        recorder = self.recorder
        return records.BusStats(
            received=self.received,
            published=self.published,
            malformed=self.malformed,
            unknown=self.unknown,
            dropped=dict(self.dropped),
            dropped_total=self.dropped_total(),
            flushed_seq=recorder.flushed_seq if recorder else None,
            log_bytes=recorder.bytes_written if recorder else 0,
            log_segments=recorder.segments if recorder else 0,
            log_queue_dropped=recorder.queue_dropped if recorder else 0,
            log_reserve_active=recorder.reserve_active if recorder else False,
            log_reserve_skipped=recorder.reserve_skipped if recorder else 0,
            final=final,
        )
