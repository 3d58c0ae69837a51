"""The hub's XPUB side: records leave in groups, and the subscriptions decide which records may share one.

Consecutive records leave as one message, a MessagePack array of the producers' bytes with the first one's sequence
number: a send costs ~2 µs, so a burst would otherwise cap the hub near 80k/s. A group holds one kind, under that
kind's topic, or several kinds that no subscriber filters for, under ``MIXED_TOPIC``: a training loop's step, loss
and data wait interleave, and would otherwise leave as three messages per iteration, each sent here and taken off the
socket by every subscriber of every kind (docs/bus.md, "Messages"). A ``block`` stands for many records numbered
consecutively: it leaves alone, under its own topic, with its first row's number, so that a subscriber numbers its
rows as the hub did. Only the hub's thread sends and takes in
subscriptions; ``listening`` is also asked from the launcher's other threads (it reads a copy of the topics).
"""

from __future__ import annotations

import zmq

from trainmeter_core.bus.client import MIXED_TOPIC
from trainmeter_core.model import records

PUBLISH_GROUP_MAX = 1000
_SEND_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
_SEND_LAST = int(zmq.NOBLOCK)
_send_frame = zmq.backend.Socket.send
_BLOCK_TOPIC = records.topic("block")
#: Derived kinds the hub neither decodes nor checks while no subscriber receives them (``Publication.unheard``): never
#: written or forwarded, so read by no one. The engine's history delta, mostly: a tight loop's are 225 KB a second,
#: whose check (a decode to Python objects, then a typed one) took the hub 1 ms, against 1 µs for a look at its tag,
#: while no dashboard was open (docs/performance.md, "A history delta nobody receives"). Not the snapshot: the hub
#: keeps the last one for the run's summary.
UNREAD_WHEN_UNHEARD = records.DERIVED_KINDS - {"snapshot"}


class Publication:
    """Groups records for the XPUB socket ``pub`` and keeps the topic prefixes its subscribers hold."""

    def __init__(self, pub) -> None:
        self.pub = pub
        self.published = 0
        # The topic prefixes subscribers hold (XPUB tells the first and the last subscription of each).
        self.topics: set[bytes] = set()
        self._out: list = []
        self._kind = ""  # the kind of the group's first record
        self._mixed = False  # the group may hold several kinds (none of them filtered for)
        self._several = False  # ... and does
        self._first_seq = 0
        # kind -> whether no subscriber filters for it, worked out once per kind while the subscriptions stay the same
        self._mixable: dict[str, bool] = {}

    def drain_subscriptions(self) -> None:
        """Take in the (un)subscriptions XPUB has queued."""
        while True:
            try:
                message = self.pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            # b"\x01" + prefix subscribes, b"\x00" + prefix unsubscribes (the last subscriber of that prefix left).
            if message[:1] == b"\x01":
                self.topics.add(message[1:])
            elif message[:1] == b"\x00":
                self.topics.discard(message[1:])
            self._mixable = {}

    def listening(self, kind: str) -> bool:
        """Whether a subscriber receives records of this kind now (so publishing one is worth waiting for)."""
        topic = records.topic(kind)
        return any(topic.startswith(prefix) for prefix in list(self.topics))

    def unheard(self, kind: str | None) -> str | None:
        """``kind`` (a record's, read from its tag alone by ``records.leading_kind``) when it is one of
        ``UNREAD_WHEN_UNHEARD`` that no subscriber receives now (a look, not a check: the hub numbers and counts the
        record as if published, so that neither depends on who listens, and drops it unread); None for any other. The
        hub asks for its own node's records only: a node of a job never sends a derived kind, and the job hub refuses
        one it sends."""
        if kind in UNREAD_WHEN_UNHEARD and not self.listening(kind):
            return kind
        return None

    def publish(self, kind: str, payload, seq: int) -> None:
        """Add the record numbered ``seq`` to the group, or send the group and start the next one with it. An empty
        group starts afresh even for the same kind: the last one was sent with its own first seq."""
        self.published += 1
        out = self._out
        if out and len(out) < PUBLISH_GROUP_MAX:
            if kind == self._kind:
                out.append(payload)
                return
            if self._mixed and self._may_mix(kind):
                self._several = True
                out.append(payload)
                return
        self.flush()
        self._kind, self._mixed, self._several, self._first_seq = kind, self._may_mix(kind), False, seq
        self._out.append(payload)

    def publish_block(self, payload, first_seq: int, rows: int) -> None:
        """Send a block alone (topic ``block``, frame 2 its first row's number), after the group before it: grouped,
        its rows would shift the numbers of every record after it in the group. Counted as its rows."""
        self.flush()
        self.published += rows
        pub, send = self.pub, _send_frame
        try:
            send(pub, _BLOCK_TOPIC, _SEND_MORE)
            send(pub, first_seq.to_bytes(8, "big"), _SEND_MORE)
            send(pub, payload, _SEND_LAST)
        except zmq.Again:  # as for a group: a slow subscriber sees a gap
            pass

    def _may_mix(self, kind: str) -> bool:
        """Whether no subscriber holds a filter that lets this kind through (all-kinds subscriptions aside)."""
        mixable = self._mixable.get(kind)
        if mixable is None:
            topic = records.topic(kind)
            mixable = not any(prefix and topic.startswith(prefix) for prefix in self.topics)
            self._mixable[kind] = mixable
        return mixable

    def flush(self) -> None:
        """Send the group, if any (the hub calls it at the end of every poll pass: a lone record is never delayed)."""
        out = self._out
        if not out:
            return
        if len(out) == 1:
            body = out[0]
        else:
            body = b"".join([b"\xdd" + len(out).to_bytes(4, "big"), *out])
        topic = MIXED_TOPIC if self._several else self._kind.encode()
        # Frame by frame with plain int flags, through pyzmq's own send under the wrapper that only adds routing ids and
        # groups: send_multipart's per-frame flag arithmetic (enum objects) costs twice the sends themselves, and the
        # wrapper a third of each. ZeroMQ still delivers the three frames together or not at all.
        pub, send = self.pub, _send_frame
        try:
            send(pub, topic, _SEND_MORE)
            send(pub, self._first_seq.to_bytes(8, "big"), _SEND_MORE)
            send(pub, body, _SEND_LAST)
        except zmq.Again:  # XPUB drops for a slow subscriber instead of blocking; the subscriber sees a gap
            pass
        self._out = []
