"""The job hub's side of a job of several nodes: a CURVE ROUTER on tcp that takes each node's forwarded records into
the hub of node rank 0, in order, exactly once, with the node's clock mapped and its state told as ``node`` records.

It runs inside the hub's thread (the hub polls its sockets) and never blocks: a node that sends garbage has it counted
as malformed, a node that falls silent is declared lost after the heartbeat timeout, and nothing a node does can stop
the hub. Only keys derived from the job's secret get through the ZAP handler; every refusal is logged, never silent.
"""

from __future__ import annotations

import os
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import zmq

from trainmeter_core.bus import jobwire as wire
from trainmeter_core.bus.client import HOSTNAME
from trainmeter_core.bus.jobkeys import JobKeys
from trainmeter_core.model import records

HEARTBEAT_TIMEOUT_S = float(os.environ.get("TM_JOB_HEARTBEAT_TIMEOUT_S", "10"))
PING_EVERY_S = 1.0
ACK_EVERY_S = 0.05
WANT_AGAIN_S = 0.5
CLOCK_WINDOW = 16  # the best round trip among the latest pings gives the offset
REFUSAL_LOG_EVERY_S = 60.0
_DOUBLE = struct.Struct(">d")
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks a context's ZAP handler (RFC 27)


@dataclass
class NodeLink:
    """What the job hub knows of one node's forwarding stream."""

    identity: bytes
    node_rank: int
    host: str
    run: str
    pid: int
    expect: int = 1  # the next forwarding sequence number the hub takes
    head: int = 0  # the last one the node says it has
    acked: int = 0
    acked_t: float = 0.0
    want_t: float = -1e9
    heard_t: float = 0.0  # the hub's clock when the node was last heard from (any message)
    state: str = "live"
    catch_up_to: int | None = None
    last_kind: str | None = None
    last_t: float | None = None  # the node's clock
    last_wall: float | None = None
    offset_s: float | None = None
    clock_basis: str | None = None
    clock_emitted: tuple[float, float | None] | None = None
    trips: deque = field(default_factory=lambda: deque(maxlen=CLOCK_WINDOW))
    trips_seen: int = 0
    received: int = 0  # records forwarded, a block counting one (the hub counts its rows)
    malformed: int = 0


class JobListener:
    """The job hub's tcp endpoint. ``accept(payload, host)`` takes one node record into the hub (False: malformed);
    ``own(record)`` records the hub's own word (``node``, ``clock``, ``notice``); both run on the hub's thread."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        keys: JobKeys,
        nnodes: int,
        accept: Callable[[object, str], bool],
        own: Callable[[records.Record], None],
        say: Callable[[str], None] = lambda line: None,
        heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        host: str = HOSTNAME,
    ) -> None:
        self.host = host
        self.accept = accept
        self.own = own
        self.say = say
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.allowed = keys.allowed(nnodes)
        self.links: dict[bytes, NodeLink] = {}
        self.malformed = 0
        self.refused = 0
        self._refusals_said: dict[str, float] = {}
        self.zap = ctx.socket(zmq.REP)
        self.zap.setsockopt(zmq.LINGER, 0)
        self.zap.bind(ZAP_ENDPOINT)
        self.router = ctx.socket(zmq.ROUTER)
        public, secret = keys.hub_pair()
        self.router.curve_server = True
        self.router.curve_publickey = public
        self.router.curve_secretkey = secret
        self.router.setsockopt(zmq.ZAP_DOMAIN, wire.ZAP_DOMAIN)
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a node that reconnects takes its stream over at once
        self.router.setsockopt(zmq.RCVHWM, 100_000)
        self.router.setsockopt(zmq.SNDHWM, 10_000)
        wire.tune(self.router)
        events = (
            zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        )
        # A fresh name each time: a closed monitor frees its inproc name only later, and id() of a listener that
        # failed to bind comes back for the next one (whose monitor then failed with "Address already in use").
        self.monitor = self.router.get_monitor_socket(
            events, addr=f"inproc://tm-job-monitor-{os.urandom(8).hex()}"
        )
        try:
            self.router.bind(endpoint)
        except zmq.ZMQError:
            self.close()  # so that the launcher can try the next address (the ZAP endpoint is free again)
            raise
        self.endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._next_ping = time.monotonic()

    def sockets(self) -> list[zmq.Socket]:
        return [self.router, self.zap, self.monitor]

    def close(self) -> None:
        # Unbound first: a closed socket frees its inproc name only later, and a next try needs the ZAP name now.
        try:
            self.zap.unbind(ZAP_ENDPOINT)
        except zmq.ZMQError:
            pass
        for sock in (self.monitor, self.router, self.zap):
            sock.close(0)

    def open_nodes(self) -> int:
        """Nodes still sending (neither ended nor lost): the launcher lets them finish before the job's run ends."""
        # list() copies the links in one step of the interpreter: the hub's thread may add one meanwhile.
        return sum(1 for link in list(self.links.values()) if link.state in ("live", "behind"))

    # -- events ------------------------------------------------------------------------------------------------------

    def handle(self, ready: set) -> None:
        if self.zap in ready:
            self._answer_zap()
        if self.monitor in ready:
            self._read_monitor()
        if self.router in ready:
            for _ in range(
                2000
            ):  # a bounded share of one pass: local producers and the clock go on meanwhile
                try:
                    frames = self.router.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._message(frames)

    def _answer_zap(self) -> None:
        while True:
            try:
                request = self.zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(request) < 6:
                continue
            version, request_id, _domain, address, _identity, mechanism = request[:6]
            credentials = request[6:]
            node = self.allowed.get(credentials[0]) if mechanism == b"CURVE" and credentials else None
            if node is not None:
                reply = [version, request_id, b"200", b"OK", f"node {node}".encode(), b""]
            else:
                self.refused += 1
                self._refusal(
                    address.decode("ascii", "replace"),
                    "its key is not one of this job's nodes (ZAP refused it)",
                )
                reply = [version, request_id, b"400", b"not a node of this job", b"", b""]
            self.zap.send_multipart(reply)

    def _read_monitor(self) -> None:
        from zmq.utils.monitor import parse_monitor_message

        while True:
            try:
                message = parse_monitor_message(self.monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            why = wire.handshake_failure(message["event"])
            if why is not None:
                self._refusal("a peer", f"the handshake failed: {why}")

    def _refusal(self, who: str, why: str) -> None:
        # Logged on the job hub's side: the first refusal of each kind from each peer, then once a minute.
        key = f"{who}|{why}"
        now = time.monotonic()
        if now - self._refusals_said.get(key, -1e9) < REFUSAL_LOG_EVERY_S:
            return
        self._refusals_said[key] = now
        line = f"job hub refused a connection from {who}: {why}"
        self.say(line)
        self.own(records.Notice(level="warning", topic="job", message=line, source="job"))

    def _message(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            self.malformed += 1
            return
        identity, verb = frames[0], frames[1]
        link = self.links.get(identity)
        if verb == wire.HELLO and len(frames) == 3:
            self._hello(identity, frames[2])
            return
        if link is None:
            self.malformed += 1  # a node must say hello first
            return
        now = time.monotonic()
        try:
            if verb == wire.RECS and len(frames) == 4 and len(frames[2]) == 8:
                self._heard(link, now)
                self._recs(link, int.from_bytes(frames[2], "big"), frames[3], now)
            elif verb == wire.PONG and len(frames) == 3:
                self._pong(link, wire.DECODERS[wire.PONG].decode(frames[2]), now)
            elif verb == wire.GAP and len(frames) == 3:
                self._heard(link, now)
                self._gap(link, wire.DECODERS[wire.GAP].decode(frames[2]))
            elif verb == wire.BYE and len(frames) == 3:
                bye = wire.DECODERS[wire.BYE].decode(frames[2])
                link.head = max(link.head, bye.head)
                self._event(link, "ended", through=link.expect - 1)
                link.state = "ended"
            else:
                self._bad(link)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, OverflowError):
            self._bad(link)

    def _bad(self, link: NodeLink) -> None:
        self.malformed += 1
        link.malformed += 1

    def _hello(self, identity: bytes, body: bytes) -> None:
        try:
            hello = wire.DECODERS[wire.HELLO].decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.malformed += 1
            return
        now = time.monotonic()
        if hello.host == self.host:
            # The engine tells nodes apart by host: a node with the hub's own host name would pass for the hub.
            self._refusal(
                f"node {hello.node_rank}",
                f"its host name {hello.host} is the job hub's own; give every node its own host name",
            )
            return
        link = self.links.get(identity)
        if link is None or link.run != hello.run:
            link = NodeLink(identity, hello.node_rank, hello.host, hello.run, hello.pid, heard_t=now)
            self.links[identity] = link
            # The first estimate of the node's clock, from the wall clocks, is recorded before any of its records.
            link.offset_s = (now - time.time()) - (hello.t - hello.wall)
            link.clock_basis = "wall"
            self._clock(link, None, None, None)
            self._event(link, "joined", through=0)
        link.head = max(link.head, hello.head)
        self._heard(link, now)
        self._check_behind(link)  # a reconnection: what the node holds beyond what arrived
        self._send(link, wire.WANT, wire.number(link.expect))
        link.want_t = now

    def _heard(self, link: NodeLink, now: float) -> None:
        link.heard_t = now
        if link.state == "lost":
            link.state = "live"
            self._event(link, "resumed", through=link.expect - 1)
            self._check_behind(link)

    def _check_behind(self, link: NodeLink) -> None:
        """After the node came back (or joined late): the records it kept meanwhile are a gap in the job's view until
        they have all arrived."""
        if link.state == "live" and link.catch_up_to is None and link.head > link.expect - 1:
            link.catch_up_to = link.head
            link.state = "behind"
            self._event(link, "behind", through=link.expect - 1, behind=link.head - (link.expect - 1))

    def _recs(self, link: NodeLink, first: int, body: bytes, now: float) -> None:
        try:
            payloads = records.split_batch(body)
        except records.MalformedRecord:
            self._bad(link)
            return
        if first > link.expect:
            # A hole: what came before was lost on the way (a connection dropped with messages in it). Ask again.
            if now - link.want_t > WANT_AGAIN_S:
                self._send(link, wire.WANT, wire.number(link.expect))
                link.want_t = now
            return
        skip = link.expect - first  # what this message repeats of what already arrived
        for payload in payloads[skip:] if skip > 0 else payloads:
            link.received += 1
            if not self.accept(payload, link.host):
                link.malformed += 1
                self.malformed += 1
            link.expect += 1
        if len(payloads) > skip:
            link.head = max(link.head, link.expect - 1)
            self._note_last(link, payloads[-1])
        if link.catch_up_to is not None and link.expect - 1 >= link.catch_up_to:
            link.catch_up_to = None
            link.state = "live"
            self._event(link, "caught_up", through=link.expect - 1)

    def _note_last(self, link: NodeLink, payload) -> None:
        # The last record seen, for a lost node's alert: kind and times, decoded from the header only.
        try:
            header = _HEADER.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        link.last_kind, link.last_t, link.last_wall = header.kind, header.t, header.wall

    def _gap(self, link: NodeLink, gap: wire.Gap) -> None:
        if gap.start != link.expect or gap.stop <= gap.start:
            return  # not about where the hub stands: a stale answer to an earlier want
        self._event(link, "gap", through=link.expect - 1, lost=gap.stop - gap.start)
        link.expect = gap.stop

    def _pong(self, link: NodeLink, pong: wire.Pong, now: float) -> None:
        link.head = max(link.head, pong.head)
        self._heard(link, now)
        rtt = now - pong.hub_t
        if not 0 <= rtt < 60:
            return
        mid = pong.hub_t + rtt / 2
        offset = mid - pong.t
        skew = pong.wall - (time.time() - (now - mid))
        link.trips.append((rtt, offset, skew))
        link.trips_seen += 1
        best = min(link.trips)
        previous = link.clock_emitted
        moved = previous is None or previous[1] is None or abs(best[1] - previous[0]) > max(best[0] / 2, 1e-3)
        if moved or best[0] < previous[1] / 2:  # type: ignore[index,operator]
            link.offset_s = best[1]
            link.clock_basis = "round_trip"
            self._clock(link, best[0], best[2], len(link.trips))

    def _clock(self, link: NodeLink, rtt: float | None, skew: float | None, samples: int | None) -> None:
        assert link.offset_s is not None
        link.clock_emitted = (link.offset_s, rtt)
        self.own(
            records.ClockMap(
                node_rank=link.node_rank,
                node_host=link.host,
                offset_s=link.offset_s,
                basis="wall" if rtt is None else "round_trip",
                uncertainty_s=None if rtt is None else rtt / 2,
                rtt_s=rtt,
                wall_skew_s=skew,
                samples=samples or 0,
                source="job",
            )
        )

    def _event(self, link: NodeLink, event: str, **fields) -> None:
        offset = link.offset_s or 0.0
        self.own(
            records.NodeEvent(
                node_rank=link.node_rank,
                node_host=link.host,
                event=event,  # type: ignore[arg-type]
                node_run=link.run,
                last_kind=link.last_kind,
                last_t=None if link.last_t is None else link.last_t + offset,
                last_wall=link.last_wall,
                source="job",
                **fields,
            )
        )

    def _send(self, link: NodeLink, verb: bytes, body: bytes) -> None:
        try:
            self.router.send_multipart([link.identity, verb, body], zmq.NOBLOCK)
        except zmq.ZMQError:  # gone, or its queue is full: it asks again when it comes back
            pass

    # -- the clock of the hub's loop ---------------------------------------------------------------------------------

    def ack_recorded(self) -> None:
        """Acknowledge to every node all it sent that the hub has taken, now (the job's run is ending: no later tick
        will)."""
        for link in self.links.values():
            if link.state != "ended" and link.expect - 1 > link.acked:
                link.acked = link.expect - 1
                self._send(link, wire.ACK, wire.number(link.acked))

    def tick(self, now: float) -> None:
        """Acks, pings and the heartbeat timeout; called on every pass of the hub's loop."""
        ping = now >= self._next_ping
        if ping:
            self._next_ping = now + PING_EVERY_S
        for link in self.links.values():
            if link.state == "ended":
                continue
            if link.expect - 1 > link.acked and now - link.acked_t >= ACK_EVERY_S:
                link.acked, link.acked_t = link.expect - 1, now
                self._send(link, wire.ACK, wire.number(link.acked))
            if ping:
                self._send(link, wire.PING, _DOUBLE.pack(time.monotonic()))
            silent = now - link.heard_t
            if link.state != "lost" and silent > self.heartbeat_timeout_s:
                link.state = "lost"
                link.catch_up_to = None
                self._event(link, "lost", through=link.expect - 1, silent_s=silent)

    def next_timer(self, now: float) -> float:
        return self._next_ping


class _Header(msgspec.Struct):
    kind: str = ""
    t: float = 0.0
    wall: float = 0.0


_HEADER = msgspec.msgpack.Decoder(_Header)
