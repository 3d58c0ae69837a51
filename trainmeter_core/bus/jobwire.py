"""The link between a node's forwarder and the job hub: the verbs, their frames, and the socket options both ends share.

A node's DEALER speaks to the job hub's ROUTER over tcp with CURVE. Node to hub: ``hello`` (who it is, how far it
got), ``recs`` (records numbered by the node's own forwarding sequence, consecutive, several per message), ``pong``
(the answer to a ping, for the clock mapping), ``gap`` (records it can no longer resend) and ``bye``. Hub to node:
``want`` (send from this number on), ``ack`` (everything up to this number arrived) and ``ping``. This module holds no
state and does no I/O beyond setting socket options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    import zmq

HELLO, RECS, PONG, GAP, BYE = b"hello", b"recs", b"pong", b"gap", b"bye"
WANT, ACK, PING = b"want", b"ack", b"ping"
#: A record group on the wire: a MessagePack array32 header, then the producers' bytes unchanged (the hub's own format).
GROUP_MAX = 1000
GROUP_MAX_B = 1 << 20
#: A bigger message disconnects its sender (the hub's limit for local producers too).
MAX_MESSAGE_B = 64 * 1024 * 1024
#: ZeroMQ's own heartbeats on the link: a peer silent this long is disconnected, so a link that went down is noticed
#: and the node reconnects as soon as it is back.
HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 5000
ZAP_DOMAIN = b"trainmeter-job"


class Hello(msgspec.Struct, array_like=True):
    node_rank: int
    host: str
    run: str
    pid: int
    t: float  # the node's monotonic clock when it said hello
    wall: float
    head: int  # the last forwarding sequence number the node has assigned (0: none yet)
    first: int  # the oldest it still holds (head + 1 when it holds none)


class Pong(msgspec.Struct, array_like=True):
    hub_t: float  # the ping's time, echoed
    t: float
    wall: float
    head: int


class Gap(msgspec.Struct, array_like=True):
    start: int  # the first forwarding sequence number that is lost
    stop: int  # the first one the node still holds


class Bye(msgspec.Struct, array_like=True):
    head: int


_enc = msgspec.msgpack.Encoder()
DECODERS = {
    HELLO: msgspec.msgpack.Decoder(Hello),
    PONG: msgspec.msgpack.Decoder(Pong),
    GAP: msgspec.msgpack.Decoder(Gap),
    BYE: msgspec.msgpack.Decoder(Bye),
}


def pack(message: msgspec.Struct) -> bytes:
    return _enc.encode(message)


def number(value: int) -> bytes:
    return value.to_bytes(8, "big")


def group(payloads: list) -> bytes:
    """Payloads as one MessagePack array, without re-encoding them."""
    return b"".join([b"\xdd" + len(payloads).to_bytes(4, "big"), *payloads])


def tune(sock: zmq.Socket) -> None:
    """The options both ends of the link set: heartbeats, a size limit, no lingering at close."""
    import zmq

    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_B)
    sock.setsockopt(zmq.LINGER, 0)


def handshake_failure(event: int) -> str | None:
    """What a socket monitor's handshake-failure event says, in words; None for any other event."""
    import zmq

    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return "its key is not one of this job's (refused by the job hub's allow-list)"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return "the handshake broke the protocol (a wrong key, or no CURVE at all)"
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        return "the handshake failed (a wrong key, or not a tm job hub)"
    return None
