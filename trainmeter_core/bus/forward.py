"""A node's forwarder: every record its hub accepts (the node's own log keeps them all) goes on to the job hub over tcp
with CURVE, numbered by this node's forwarding sequence, and is kept until the job hub acknowledges it. A record here
is a payload as the hub took it, its bytes unchanged: a ``block`` of many rows is one, numbered, held and counted as
one (the rows are the job hub's to count, docs/bus.md "Blocks").

It runs in a thread of the node's launcher and never blocks the hub: while the link is down records wait in a bounded
resend buffer (``TM_JOB_RESEND_MAX`` records, a million by default, and ``TM_JOB_RESEND_MAX_B`` bytes, 512 MiB: a
block of a thousand steps weighs what a few hundred records do; minutes of a busy node), and whatever falls out of it is counted and told to the job hub as a gap, never dropped silently. Nothing here may stop the node's own run, whatever the network does.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import zmq

from trainmeter_core.bus import jobkeys
from trainmeter_core.bus import jobwire as wire
from trainmeter_core.bus.client import HOSTNAME, poll_ms
from trainmeter_core.model import records

RESEND_MAX = int(os.environ.get("TM_JOB_RESEND_MAX", "1000000"))
RESEND_MAX_B = int(os.environ.get("TM_JOB_RESEND_MAX_B", str(512 * 1024 * 1024)))
KEYS_POLL_S = 0.5
SEND_EVERY_S = 0.01
SAY_EVERY_S = 60.0
_DOUBLE = struct.Struct(">d")


class Forwarder:
    """Forwards records to the job hub at ``endpoint`` as node ``node_rank`` of the job whose keys are in ``keys_dir``.

    ``put`` is called on the hub's thread for every record to forward; ``say`` prints a line and ``notice`` records
    one in this node's own log (both thread-safe).
    """

    def __init__(
        self,
        endpoint: str,
        keys_dir: Path,
        node_rank: int,
        run: str,
        *,
        say: Callable[[str], None] = lambda line: None,
        notice: Callable[[records.Record], None] = lambda record: None,
        max_records: int = RESEND_MAX,
        max_bytes: int = RESEND_MAX_B,
        host: str = HOSTNAME,
    ) -> None:
        self.endpoint = endpoint
        self.host = host
        self.keys_dir = keys_dir
        self.node_rank = node_rank
        self.run = run
        self.say = say
        self.notice = notice
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._held_b = 0  # the bytes of the records held (in flight or unsent), on the forwarder's thread
        self.head = 0  # the last forwarding sequence number given (on the hub's thread)
        # The last one moved from the inbox to the forwarder's thread (``head`` may be ahead of it)
        self._taken = 0
        self.acked = 0
        self.overflowed = 0  # records that fell out of the resend buffer before the job hub acknowledged them
        self.sent_messages = 0
        self.connected = False
        self.refusals = 0
        self._inbox: deque[tuple[int, object]] = deque()
        self._unsent: deque[tuple[int, object]] = deque()
        self._inflight: deque[tuple[int, object]] = deque()
        self._awake = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_lock = threading.Lock()
        self._stopped = False
        self._finishing = threading.Event()
        self._finish_within_s = 10.0
        self._done = threading.Event()
        self._said: dict[str, float] = {}
        self._keys: jobkeys.JobKeys | None = None
        self._thread = threading.Thread(target=self._loop, name="tm-forward", daemon=True)
        self.error: str | None = None

    # -- the hub's side ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def put(self, payload) -> None:
        self.head += 1
        if self._stopped:
            self.overflowed += (
                1  # the thread is gone (a bug it reported): counted, never held without a bound
            )
            return
        self._inbox.append((self.head, payload))
        if not self._awake:
            self._awake = True
            self._wake()

    def pending(self) -> int:
        """Records given to the forwarder that the job hub has not acknowledged yet."""
        return self.head - self.acked

    def finish(self, timeout_s: float) -> bool:
        """Let the job hub acknowledge everything (at most ``timeout_s``), say bye, stop. True when nothing is left."""
        self._finish_within_s = timeout_s
        self._finishing.set()
        self._wake()
        self._done.wait(timeout_s + 1.0)
        return self.pending() == 0

    def _wake(self) -> None:
        with (
            self._wake_lock
        ):  # the thread closes the pipe under this lock: never a write to a reused descriptor
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"w")
            except OSError:  # full: the thread is awake already
                pass

    # -- the forwarder's thread --------------------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._serve()
        except Exception as exc:  # a bug here must not take the node's run down: its own log has every record
            self.error = f"{type(exc).__name__}: {exc}"
            self.say(f"forwarding to the job hub stopped: {self.error}")
        finally:
            self._stopped = True
            self._done.set()

    def _serve(self) -> None:
        ctx = zmq.Context(io_threads=1)
        sock = monitor = None
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        finish_deadline: float | None = None
        next_keys = 0.0
        last_send = 0.0
        try:
            while True:
                now = time.monotonic()
                if self._finishing.is_set() and finish_deadline is None:
                    finish_deadline = now + self._finish_within_s
                if sock is None and now >= next_keys:
                    next_keys = now + KEYS_POLL_S
                    if self._load_keys():
                        sock, monitor = self._connect(ctx)
                        poller.register(sock, zmq.POLLIN)
                        poller.register(monitor, zmq.POLLIN)
                waiting = self.connected and bool(self._unsent or self._inbox)
                ready = dict(poller.poll(poll_ms(last_send + SEND_EVERY_S - now) if waiting else 100))
                if self._wake_r in ready:
                    try:
                        os.read(self._wake_r, 4096)
                    except OSError:
                        pass
                self._take_inbox()
                if monitor is not None and monitor in ready:
                    if self._read_monitor(monitor):
                        # The job hub refused this node's key: a new job may have written new keys since.
                        poller.unregister(sock)
                        poller.unregister(monitor)
                        monitor.close(0)
                        sock.close(0)
                        sock = monitor = None
                        self.connected = False
                        self._rewind(self.acked + 1)
                        continue
                if sock is not None and sock in ready:
                    self._read(sock)
                now = time.monotonic()
                if sock is not None and self.connected:
                    # Records leave in groups, at most every SEND_EVERY_S unless a group is full: a node stepping a
                    # thousand times a second wakes this thread a hundred times, not three thousand.
                    due = now - last_send >= SEND_EVERY_S or finish_deadline is not None
                    if self._hello_due or (self._unsent and (due or len(self._unsent) >= wire.GROUP_MAX)):
                        self._send(sock)
                        last_send = now
                # While a timed send is due the hub need not wake this thread for each record it puts.
                self._awake = self.connected and bool(self._unsent)
                if finish_deadline is not None:
                    if self.pending() == 0 or now >= finish_deadline:
                        if sock is not None and self.connected:
                            try:
                                sock.send_multipart(
                                    [wire.BYE, wire.pack(wire.Bye(head=self.head))], zmq.NOBLOCK
                                )
                                # let the io thread put it on the wire before the socket closes
                                time.sleep(0.05)
                            except zmq.ZMQError:
                                pass
                        return
        finally:
            for s in (monitor, sock):
                if s is not None:
                    s.close(0)
            ctx.term()
            self._stopped = True
            with self._wake_lock:
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_w = -1

    def _load_keys(self) -> bool:
        try:
            keys = jobkeys.load(self.keys_dir)
        except jobkeys.JobKeysError as exc:
            self._tell("keys", str(exc))
            return False
        if keys is None:
            return False
        self._keys = keys
        return True

    def _connect(self, ctx: zmq.Context):
        assert self._keys is not None
        sock = ctx.socket(zmq.DEALER)
        public, secret = self._keys.node_pair(self.node_rank)
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.curve_serverkey = self._keys.hub_pair()[0]
        sock.setsockopt(zmq.ROUTING_ID, f"{self.node_rank}:{self.run}".encode())
        sock.setsockopt(
            zmq.IMMEDIATE, 1
        )  # nothing queues on a link that is not up: the resend buffer holds it
        sock.setsockopt(zmq.SNDHWM, 64)
        sock.setsockopt(zmq.RECONNECT_IVL, 200)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
        wire.tune(sock)
        events = (
            zmq.EVENT_HANDSHAKE_SUCCEEDED
            | zmq.EVENT_DISCONNECTED
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        )
        # A fresh name each time: the socket a refusal closed frees its monitor's name only later (jobhub.py)
        monitor = sock.get_monitor_socket(events, addr=f"inproc://tm-forward-monitor-{os.urandom(8).hex()}")
        sock.connect(self.endpoint)
        return sock, monitor

    def _read_monitor(self, monitor: zmq.Socket) -> bool:
        """Connection events; True when the job hub refused this node (its socket is then made anew)."""
        from zmq.utils.monitor import parse_monitor_message

        refused = False
        while True:
            try:
                event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))["event"]
            except zmq.Again:
                return refused
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected = True
                self._hello_due = True
            elif event == zmq.EVENT_DISCONNECTED:
                self.connected = False
            else:
                why = wire.handshake_failure(event)
                if why is not None:
                    self.refusals += 1
                    self.connected = False
                    self._tell(
                        "refused", f"the job hub at {self.endpoint} refused node {self.node_rank}: {why}"
                    )
                    refused = self._keys_changed()

    def _keys_changed(self) -> bool:
        try:
            mtime = jobkeys.keys_path(self.keys_dir).stat().st_mtime_ns
        except OSError:
            return False
        return self._keys is not None and mtime != self._keys.mtime_ns

    def _tell(self, what: str, line: str) -> None:
        # Logged on the node's side: stderr and the node's own log, the first time and then once a minute.
        now = time.monotonic()
        if now - self._said.get(what, -1e9) < SAY_EVERY_S:
            return
        self._said[what] = now
        self.say(line)
        self.notice(records.Notice(level="warning", topic="job", message=line, source="forwarder"))

    def _take_inbox(self) -> None:
        inbox, unsent = self._inbox, self._unsent
        while inbox:
            item = inbox.popleft()
            unsent.append(item)
            self._taken = item[0]
            self._held_b += len(item[1])  # type: ignore[arg-type]
        excess = len(self._inflight) + len(unsent) - self.max_records
        # Past either bound the oldest goes (the newest always stays): the job hub learns of it as a gap when it asks.
        while (excess > 0 or self._held_b > self.max_bytes) and len(self._inflight) + len(unsent) > 1:
            _, payload = (self._inflight or unsent).popleft()
            self._held_b -= len(payload)  # type: ignore[arg-type]
            self.overflowed += 1
            excess -= 1

    def _floor(self) -> int:
        """The oldest forwarding sequence number still held. With nothing held, the one after the last taken from the
        inbox, never ``head + 1``: the hub may have numbered records this thread has not taken yet, and a want answered
        from ``head`` would tell them lost as a gap while they wait in the inbox."""
        if self._inflight:
            return self._inflight[0][0]
        if self._unsent:
            return self._unsent[0][0]
        return self._taken + 1

    def _read(self, sock: zmq.Socket) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2:
                continue
            verb, body = frames
            if verb == wire.ACK and len(body) == 8:
                self._ack(int.from_bytes(body, "big"))
            elif verb == wire.WANT and len(body) == 8:
                want = int.from_bytes(body, "big")
                floor = self._floor()
                if want < floor:
                    self._send_frames(sock, [wire.GAP, wire.pack(wire.Gap(start=want, stop=floor))])
                self._ack(want - 1)
                self._rewind(max(want, floor))
            elif verb == wire.PING and len(body) == 8:
                (hub_t,) = _DOUBLE.unpack(body)
                pong = wire.Pong(hub_t=hub_t, t=time.monotonic(), wall=time.time(), head=self.head)
                self._send_frames(sock, [wire.PONG, wire.pack(pong)])
        # (unknown verbs from the hub are ignored: a newer hub may say more)

    def _ack(self, through: int) -> None:
        if through <= self.acked:
            return
        self.acked = min(through, self.head)
        for queue in (self._inflight, self._unsent):
            while queue and queue[0][0] <= through:
                self._held_b -= len(queue.popleft()[1])  # type: ignore[arg-type]

    def _rewind(self, start: int) -> None:
        """Send again from ``start``: what was in flight from there goes back in front of the unsent records."""
        back = [item for item in self._inflight if item[0] >= start]
        self._inflight.clear()
        self._unsent.extendleft(reversed(back))

    def _send_frames(self, sock: zmq.Socket, frames: list[bytes]) -> bool:
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            return False

    _hello_due = False

    def _send(self, sock: zmq.Socket) -> None:
        if self._hello_due:
            hello = wire.Hello(
                node_rank=self.node_rank,
                host=self.host,
                run=self.run,
                pid=os.getpid(),
                t=time.monotonic(),
                wall=time.time(),
                head=self.head,
                first=self._floor(),
            )
            if not self._send_frames(sock, [wire.HELLO, wire.pack(hello)]):
                return
            self._hello_due = False
            # Everything unacknowledged goes again in order; the job hub skips what it has and asks (``want``) for
            # anything it misses.
            self._rewind(self.acked + 1)
        unsent = self._unsent
        while unsent:
            batch: list[tuple[int, object]] = []
            size = 0
            while unsent and len(batch) < wire.GROUP_MAX and size < wire.GROUP_MAX_B:
                item = unsent.popleft()
                batch.append(item)
                size += len(item[1])  # type: ignore[arg-type]
            frames = [wire.RECS, wire.number(batch[0][0]), wire.group([p for _, p in batch])]
            if not self._send_frames(sock, frames):
                unsent.extendleft(reversed(batch))
                return
            self._inflight.extend(batch)
            self.sent_messages += 1
