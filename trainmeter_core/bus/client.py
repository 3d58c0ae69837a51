"""The bus client: a producer that never blocks or raises, and a subscriber with a plain iterator API.

Producers PUSH into the launcher's hub (a PUSH queues until connected; a PUB would drop the first records); the hub
republishes every record it accepted on an XPUB as three frames: topic (the kind), the hub's sequence number (8 bytes,
big-endian) and the producer's MessagePack bytes unchanged. This module is imported by the agent inside a training
process, so it imports zmq lazily and nothing heavy at import time.
"""

from __future__ import annotations

import math
import os
import socket as _socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainmeter_core.model import records

if TYPE_CHECKING:
    import zmq

#: Messages a producer queues while the hub is slow or gone; past that it drops and counts.
DEFAULT_HWM = 100_000
#: How long a closing producer lets queued messages reach a live hub.
DEFAULT_LINGER_MS = 2_000
BATCH_TOPIC = b"batch"
#: The topic of a group the hub publishes of consecutive records of several kinds (each record names its own): only
#: for kinds no subscriber filters for, so that it reaches the subscribers of every kind alone (docs/bus.md).
MIXED_TOPIC = b"*"
#: Messages a subscriber takes off its socket per poll.
RECV_AT_ONCE = 256
HOSTNAME = _socket.gethostname()

_ARRAY_MARKERS = frozenset([bytes([b]) for b in range(0x90, 0xA0)] + [b"\xdc", b"\xdd"])
_abandoned: list[Any] = []  # zmq objects inherited through fork: never touched again, never garbage-collected


def _zmq():
    import zmq

    return zmq


class Producer:
    """Sends records to the hub. Never blocks, never raises; counts exactly what it had to drop.

    The drop counter travels in every record's header (``dropped``), so the last record the hub receives from a producer
    is authoritative; ``close()`` sends a final ``bye`` after everything else. After ``fork`` the child gets a fresh
    socket (and a fresh identity: its own pid, counters from zero) the next time it sends.
    """

    def __init__(
        self,
        endpoint: str,
        source: str,
        *,
        rank: int | None = None,
        hwm: int = DEFAULT_HWM,
        linger_ms: int = DEFAULT_LINGER_MS,
    ) -> None:
        self.endpoint = endpoint
        self.source = source
        self.rank = rank
        self.hwm = hwm
        self.linger_ms = linger_ms
        self.sent = 0
        self.dropped = 0
        self.closed = False
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._error: str | None = None
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (p := ref()) is not None and p._after_fork())

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def _after_fork(self) -> None:
        # The parent's zmq context has no I/O threads in the child: abandon it untouched and start over.
        _abandoned.extend(x for x in (self._sock, self._ctx) if x is not None)
        self._sock = None
        self._ctx = None
        self._lock = threading.Lock()
        self.pid = os.getpid()
        self.sent = 0
        self.dropped = 0

    def _socket(self):
        if self._sock is None:
            zmq = _zmq()
            ctx = zmq.Context(io_threads=1)
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, self.hwm)
            sock.setsockopt(zmq.LINGER, self.linger_ms)
            sock.connect(self.endpoint)
            self._ctx, self._sock = ctx, sock
        return self._sock

    def stamp(self, record: records.Record, now_t: float, now_wall: float) -> None:
        """Fill the header of ``record``: schema version, times (when unset), source, host, pid, rank."""
        record.v = records.SCHEMA_VERSION
        if not record.t:
            record.t = now_t
        if not record.wall:
            record.wall = now_wall
        record.source = record.source or self.source
        record.host = record.host or HOSTNAME
        record.pid = self.pid
        if record.rank is None:
            record.rank = self.rank

    # -- sending ---------------------------------------------------------------------------------------------------

    def send(self, record: records.Record) -> bool:
        """Send one record now. False (and counted) when it had to be dropped."""
        return self._send_frames([record], single=True)

    def send_many(self, batch: list[records.Record]) -> bool:
        """Send records as one batch message; a dropped batch counts every record in it (a block counts as the rows
        it stands for, ``records.Block.rows``). Records stamped already keep their times; a block, whose own ``t`` and
        ``wall`` are unset, gets the two clocks read now."""
        if not batch:
            return True
        return self._send_frames(batch, single=False)

    def _count(self, batch: list[records.Record]) -> int:
        return sum(record.rows if type(record) is records.Block else 1 for record in batch)

    def _send_frames(self, batch: list[records.Record], single: bool) -> bool:
        def frames() -> list[bytes]:
            now_t, now_wall = time.monotonic(), time.time()
            for record in batch:
                self.stamp(record, now_t, now_wall)
                record.dropped = self.dropped
            if single:
                return [records.topic(batch[0].__struct_config__.tag), records.encode(batch[0])]
            return [BATCH_TOPIC, records.encode_many(batch)]

        return self._send_message(frames, self._count(batch))

    def _send_message(self, frames: Callable[[], list[bytes]], count: int) -> bool:
        """Send the message ``frames()`` makes, under the lock, as ``count`` records: counted sent, or dropped when the
        producer is closed, the hub's queue is full or anything fails (never raised into the caller)."""
        try:
            with self._lock:
                if self.closed:
                    self.dropped += count
                    return False
                message = frames()
                zmq = _zmq()
                try:
                    self._socket().send_multipart(message, flags=zmq.NOBLOCK, copy=True)
                except zmq.Again:
                    self.dropped += count
                    return False
                self.sent += count
                return True
        except Exception as exc:  # never raise into the caller: count, remember why, go on
            self.dropped += count
            self._error = f"{type(exc).__name__}: {exc}"
            return False

    def close(self, reason: str = "exit", linger_ms: int | None = None) -> None:
        """Send ``bye`` (carrying the final drop count) and close. Waits at most the linger time for a live hub."""
        try:
            with self._lock:
                if self.closed or self.pid != os.getpid():
                    self.closed = True
                    return
                self.closed = True
                if self._sock is None and not self.sent and not self.dropped:
                    return  # never used: nothing to say goodbye to
                zmq = _zmq()
                sock = self._socket()
                bye = records.Bye(sent=self.sent, reason=reason)
                self.stamp(bye, time.monotonic(), time.time())
                bye.dropped = self.dropped
                frames = [records.topic("bye"), records.encode(bye)]
                linger = self.linger_ms if linger_ms is None else linger_ms
                deadline = time.monotonic() + linger / 1000
                # The bye must follow everything else: when the queue is full, wait (bounded) for room.
                while True:
                    try:
                        sock.send_multipart(frames, flags=zmq.NOBLOCK)
                        break
                    except zmq.Again:
                        if time.monotonic() >= deadline:
                            break
                        time.sleep(0.005)
                sock.setsockopt(zmq.LINGER, max(0, int((deadline - time.monotonic()) * 1000)))
                sock.close()
                self._ctx.term()
                self._sock = self._ctx = None
        except Exception as exc:
            self._error = f"{type(exc).__name__}: {exc}"

    @property
    def error(self) -> str | None:
        """The last internal error, if any (the producer went on regardless)."""
        return self._error


# --------------------------------------------------------------------------------------------------------------------
# Subscribing


def read_endpoints(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The run's ``endpoints.json``: where its hub listens."""
    import json

    return json.loads((Path(run_dir) / "endpoints.json").read_text())


def poll_ms(timeout_s: float) -> int:
    """A zmq poll's timeout in whole milliseconds, rounded up. pyzmq truncates a float's, so a wait of less than a
    millisecond was a poll that returned at once, and a loop waiting for a due time polled in a spin through its last
    millisecond: the hub, 90 passes a second (docs/performance.md, "Polls that did not wait")."""
    return max(0, math.ceil(timeout_s * 1000))


class Subscriber:
    """A SUB socket on the hub's XPUB, filtered by kind. Records come back typed, with their ``seq`` set.

    A ``block`` (``records.Block``: many ``step``, ``metric`` and ``phase`` records of one producer as columns) reaches
    whoever asks for one of those kinds, or for every kind, as the records it stands for (of the kinds asked, each with
    its own ``seq``), exactly as if each had been sent alone. Only with ``blocks=True``, or when asked for the kind
    ``block`` by name, does it come as it is (its ``seq`` then its last row's): for whoever takes steps in bulk.
    """

    def __init__(
        self, endpoint: str, kinds: Iterable[str] | None = None, *, hwm: int = 1_000_000, blocks: bool = False
    ) -> None:
        zmq = _zmq()
        self.kinds = None if kinds is None else set(kinds)
        # The row kinds a block is expanded into for this subscriber (empty: it takes no block)
        self._row_kinds = (
            records.ROW_KINDS if self.kinds is None else frozenset(self.kinds & records.ROW_KINDS)
        )
        self._listened: set[str] = set()  # kinds listen_for added
        self.blocks = blocks or (self.kinds is not None and "block" in self.kinds)
        self._takes_blocks = self.blocks or bool(self._row_kinds)
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.RCVHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        if self.kinds is None:
            self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        else:
            # run.end always comes, so an iterator knows when the run is over.
            topics = self.kinds | {"run.end"} | ({"block"} if self._takes_blocks else set())
            for kind in topics:
                self._sock.setsockopt(zmq.SUBSCRIBE, records.topic(kind))
        self._sock.connect(endpoint)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._wake_pollers: dict[int, object] = {}  # recv's with a wake_fd: the socket and that fd
        self.malformed = 0
        self._pending: deque[records.Record | records.Unknown] = deque()
        self.last_seq: int | None = None
        self.gaps = 0
        # pyzmq's own recv, under the wrapper (see _receive)
        self._recv_frame = zmq.backend.Socket.recv

    def recv(
        self, timeout_s: float | None = None, wake_fd: int | None = None
    ) -> records.Record | records.Unknown | None:
        """The next record, or None if none came within the timeout, or as soon as ``wake_fd`` (a file descriptor:
        the read end of a pipe, say) is readable, which it is left."""
        poller = self._poller
        if wake_fd is not None:
            poller = self._wake_pollers.get(wake_fd)
            if poller is None:
                zmq = _zmq()
                poller = self._wake_pollers[wake_fd] = zmq.Poller()
                poller.register(self._sock, zmq.POLLIN)
                poller.register(wake_fd, zmq.POLLIN)
        while not self._pending:
            ready = poller.poll(None if timeout_s is None else poll_ms(timeout_s))
            if not ready:
                return None
            if wake_fd is not None and all(socket == wake_fd for socket, _ in ready):
                return None
            self._receive_waiting()
        return self._pending.popleft()

    def _receive_waiting(self) -> None:
        """Every message already queued (up to RECV_AT_ONCE), after a poll said one is: a poll per message would cost
        more than the message (a kind some subscriber filters for leaves in messages of its own, between the others)."""
        zmq = _zmq()
        try:
            for _ in range(RECV_AT_ONCE):
                self._receive(zmq.NOBLOCK)
        except zmq.Again:
            pass

    def _receive(self, flags: int = 0) -> None:
        # recv_multipart, at half its cost: it asks the socket for RCVMORE after each frame, and pyzmq turns that
        # option into an Enum on every call; a zmq.Frame carries the flag itself. The rest of a message is there
        # once its first frame is.
        sock, recv_frame = self._sock, self._recv_frame
        frame = recv_frame(sock, flags, False)
        frames = [frame.bytes]
        while frame.more:
            frame = recv_frame(sock, flags, False)
            frames.append(frame.bytes)
        if len(frames) != 3 or len(frames[1]) != 8:
            self.malformed += 1
            return
        kind = frames[0].decode("ascii", "replace")
        kinds = self.kinds
        # A SUB filter is a prefix match: "step" would also let "step.x" through. A group of several kinds (topic
        # "*") holds none that a filter asked for; its records are still checked one by one below.
        mixed = frames[0] == MIXED_TOPIC
        if kinds is not None and not mixed and kind not in kinds and kind != "run.end":
            if kind != "block" or not self._takes_blocks:
                return
        seq = int.from_bytes(frames[1], "big")
        body = frames[2]
        # A record is a MessagePack map; an array is a group of consecutive records of one kind.
        try:
            payloads = records.split_batch(body) if body[:1] in _ARRAY_MARKERS else [body]
        except records.MalformedRecord:
            self.malformed += 1
            return
        if self.last_seq is not None and seq > self.last_seq + 1:
            self.gaps += 1
        for payload in payloads:
            try:
                record = records.decode_published(payload)
            except records.MalformedRecord:
                self.malformed += 1
            else:
                if type(record) is records.Block:
                    # Numbered as its rows: frame 2 is its first row's number, its own seq its last row's.
                    seq = self._take_block(record, seq)
                    continue
                record.seq = seq
                if not mixed or kinds is None or records.kind_of(record) in kinds:
                    self._pending.append(record)
            seq += 1
        self.last_seq = seq - 1

    def _take_block(self, block: records.Block, first: int) -> int:
        """Queue a block numbered from ``first``: as it is, or as its rows of the kinds asked; the number after it."""
        if block.rows < 1:
            self.malformed += 1
            return first + 1  # one number, as the hub gave any record it could not read as rows
        block.seq = first + block.rows - 1
        if self.blocks:
            self._pending.append(block)
        elif self._row_kinds:
            kinds = None if self._row_kinds == records.ROW_KINDS else self._row_kinds
            try:
                self._pending.extend(records.block.expand(block, kinds))
            except (IndexError, TypeError, ValueError):  # columns shorter than the rows they say: not a block
                self.malformed += 1
        return block.seq + 1

    def listen_for(self, kind: str) -> bool:
        """Receive records of one more kind from now on; False when this subscriber has it already (every kind, or
        this one), and ``stop_listening`` then leaves it be. Messages come in the hub's order whatever their kind, so
        a record of this kind received says that every kind asked for before it reaches this subscriber from there."""
        if self.kinds is None or kind in self.kinds:
            return False
        self.kinds.add(kind)
        self._listened.add(kind)
        self._sock.setsockopt(_zmq().SUBSCRIBE, records.topic(kind))
        return True

    def stop_listening(self, kind: str) -> None:
        """Receive no more records of a kind ``listen_for`` added (any other stays)."""
        if kind in self._listened:
            self._listened.discard(kind)
            self.kinds.discard(kind)  # type: ignore[union-attr]  # listen_for added it: kinds is a set
            self._sock.setsockopt(_zmq().UNSUBSCRIBE, records.topic(kind))

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def subscribe(
    run: str | os.PathLike | None,
    kinds: Iterable[str] | None = None,
    *,
    idle_check_s: float = 1.0,
) -> Iterator[records.Record | records.Unknown]:
    """Iterate over a live run's records as they happen, filtered by kind.

    ``run`` is a run directory, a name or prefix under the runs directory, or None for the latest run. The iterator
    ends after the run's ``run.end`` (yielded when asked for) — or, when snapshots are wanted, after the final snapshot
    that follows it — or when the launcher is gone (its lock on the run is free).
    """
    from trainmeter_core.runlog import rundir

    run_dir = rundir.resolve_run(None if run is None else str(run))
    endpoints = read_endpoints(run_dir)
    wanted = None if kinds is None else set(kinds)
    # The engine's final snapshot is computed from run.end, so it comes after it: a subscriber that wants snapshots
    # waits for it (or for the launcher to be gone).
    wants_final = wanted is None or "snapshot" in wanted
    subscribed = None if wanted is None else wanted | ({"snapshot"} if wants_final else set())
    ended = False
    with Subscriber(endpoints["out"], subscribed) as sub:
        while True:
            record = sub.recv(idle_check_s)
            if record is None:
                if not rundir.is_live(run_dir):
                    return
                continue
            kind = records.kind_of(record)
            if wanted is None or kind in wanted:
                yield record
            if kind == "run.end":
                ended = True
                if not wants_final:
                    return
            elif kind == "snapshot" and getattr(record, "final", False) and ended:
                return
