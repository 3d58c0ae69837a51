"""A Chrome trace read as a stream: its top-level keys one by one, and its ``traceEvents`` in batches of typed events.

Memory stays bounded by the chunk size (4 MiB) and the largest single value (64 MiB), whatever the file's size.
A batch ends at a ``}`` followed by ``,`` or ``]``; msgspec decodes the batch in one C call, which also proves the cut
was right (a cut inside a string or a nested value leaves invalid JSON, and an earlier cut is tried). A file that is
not one JSON object or array, is cut short, or holds invalid JSON raises ``TraceError`` with one line; nothing here
guesses past damage. Why this and not ijson: docs/performance.md ("Profiler import").
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator
from typing import IO, Any

import msgspec

CHUNK_B = 4 * 1024 * 1024
MAX_VALUE_B = 64 * 1024 * 1024
_WS = b" \t\r\n"
# Tries for a batch's end: from the end of the buffer back, then from the batch's start on.
_BACK_TRIES = 4
_FORWARD_TRIES = 8
# Where msgspec says malformed JSON went wrong: "JSON is malformed: invalid character (byte 17)".
_FAILED_AT = re.compile(r"\(byte (\d+)\)$")


class TraceError(ValueError):
    """The file is not a readable Chrome trace; the message is one line naming where and why."""


def open_trace(path) -> IO[bytes]:
    """The file's bytes, decompressed when it is gzip (by its first two bytes, whatever its name)."""
    f = open(path, "rb")  # noqa: SIM115 - the caller closes it
    head = f.read(2)
    f.seek(0)
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    return f


class TraceReader:
    """Yields ``("key", name, value)`` for each top-level key but the events, and ``("events", [event, ...])`` for
    each batch of ``traceEvents`` (decoded as ``event_type``); ``skipped`` counts events of the wrong shape."""

    def __init__(
        self, stream: IO[bytes], event_type: type, chunk_b: int = CHUNK_B, max_value_b: int = MAX_VALUE_B
    ) -> None:
        self.stream = stream
        self.chunk_b = chunk_b
        self.max_value_b = max_value_b
        self.buf = b""
        self.pos = 0
        self.offset = 0  # bytes of the file before buf[0]
        self.eof = False
        self.bytes_read = 0
        self.skipped = 0
        self.event_type = event_type
        self._typed = msgspec.json.Decoder(list[event_type])
        self._any = msgspec.json.Decoder()
        self.saw_events = False
        self.decodes = 0  # batches tried (``_decode`` calls): what reading a damaged trace costs
        self._failed_at: int | None = None  # where in its items msgspec found the last batch tried malformed
        self._damaged = False  # and whether that byte is in the file's own bytes, not the cut's (``_decode``)

    # -- the buffer ------------------------------------------------------------------------------------------------

    def _fill(self, at_least: int = 0) -> bool:
        """Read more (at least ``at_least`` bytes when the file has them); False at the end of the file."""
        if self.eof:
            return False
        want = max(self.chunk_b, at_least)
        try:
            chunk = self.stream.read(want)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise TraceError(f"the compressed file is cut short or damaged ({exc})") from None
        except OSError as exc:
            raise TraceError(f"cannot read it: {exc}") from None
        if not chunk:
            self.eof = True
            return False
        self.bytes_read += len(chunk)
        if self.pos:
            self.offset += self.pos
            self.buf = self.buf[self.pos :] + chunk
            self.pos = 0
        else:
            self.buf += chunk
        return True

    def _skip_ws(self) -> int | None:
        """The next byte that is not white space (not consumed), or None at the end of the file."""
        while True:
            buf = self.buf
            pos = self.pos
            n = len(buf)
            while pos < n and buf[pos] in _WS:
                pos += 1
            self.pos = pos
            if pos < n:
                return buf[pos]
            if not self._fill():
                return None

    def _where(self) -> str:
        return f"at byte {self.offset + self.pos:,}"

    def _expect(self, char: bytes, what: str) -> None:
        c = self._skip_ws()
        if c is None:
            raise TraceError(f"the file ends before {what} (cut short?)")
        if c != char[0]:
            raise TraceError(f"expected {what} {self._where()}, found {bytes([c])!r}")
        self.pos += 1

    # -- reading ---------------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple]:
        first = self._skip_ws()
        if first is None:
            raise TraceError("the file is empty")
        if self.buf.startswith(b"\xef\xbb\xbf", self.pos):
            self.pos += 3
            first = self._skip_ws()
        if first == ord("["):  # the JSON Array Format: the events alone
            self.pos += 1
            self.saw_events = True
            yield from self._events()
            self._end()
            return
        if first != ord("{"):
            raise TraceError(f"not a Chrome trace: it starts with {bytes([first])!r}, not {{ or [")
        self.pos += 1
        members = 0
        while True:
            c = self._skip_ws()
            if c is None:
                raise TraceError("the file ends inside its top-level object (cut short?)")
            if c == ord("}"):
                self.pos += 1
                self._end()
                return
            if members:
                self._expect(b",", "a comma between top-level keys")
                self._skip_ws()
            key = self._string()
            self._expect(b":", "a colon after a key")
            members += 1
            if key == "traceEvents" and self._skip_ws() == ord("["):
                self.pos += 1
                self.saw_events = True
                yield from self._events()
            else:
                yield ("key", key, self._value())

    def _end(self) -> None:
        if self._skip_ws() is not None:
            raise TraceError(f"more after the end of the JSON document {self._where()}")

    def _string(self) -> str:
        if self._skip_ws() != ord('"'):
            raise TraceError(f"expected a key {self._where()}")
        start = self.pos
        search = start + 1
        while True:
            end = self.buf.find(b'"', search)
            if end < 0:
                searched = len(self.buf) - start  # the buffer moves when it grows: keep offsets from the key
                if searched > self.max_value_b or not self._fill():
                    raise TraceError(f"a key that never ends {self._where()}")
                start = self.pos
                search = start + searched
                continue
            backslashes = 0
            i = end - 1
            while i > start and self.buf[i] == 0x5C:
                backslashes += 1
                i -= 1
            if backslashes % 2:
                search = end + 1
                continue
            try:
                key = msgspec.json.decode(self.buf[start : end + 1])
            except msgspec.DecodeError:
                raise TraceError(f"a key that is not a JSON string {self._where()}") from None
            self.pos = end + 1
            return key

    def _value(self) -> Any:
        """One top-level value other than the events: decoded whole (they are small; a huge one is refused)."""
        decoder = json.JSONDecoder()
        if self._skip_ws() is None:
            raise TraceError("the file ends before a top-level value (cut short?)")
        while True:
            text = self.buf[self.pos :].decode("utf-8", "surrogateescape")
            try:
                value, end = decoder.raw_decode(text)
            except (json.JSONDecodeError, RecursionError):
                if len(self.buf) - self.pos > self.max_value_b:
                    raise TraceError(
                        f"a top-level value over {self.max_value_b >> 20} MiB {self._where()}"
                    ) from None
                if not self._fill(len(self.buf) - self.pos):
                    raise TraceError(f"a top-level value that is not valid JSON {self._where()}") from None
                continue
            if end == len(text) and not self.eof and self._fill(len(self.buf) - self.pos):
                continue  # a number that reaches the buffer's end may go on in the next chunk
            self.pos += len(text[:end].encode("utf-8", "surrogateescape"))
            return value

    def _events(self) -> Iterator[tuple]:
        """Batches of the events array, ending after its closing bracket."""
        while True:
            c = self._skip_ws()
            if c is None:
                raise TraceError("the file ends inside traceEvents (cut short?)")
            if c == ord("]"):
                self.pos += 1
                return
            if c == ord(","):
                self.pos += 1
                c = self._skip_ws()
                if c is None:
                    raise TraceError("the file ends inside traceEvents (cut short?)")
            batch = self._batch()
            if batch:
                yield ("events", batch)

    def _batch(self) -> list:
        damage: int | None = None  # the first byte of the file found malformed after this batch's start
        while True:
            buf = self.buf
            start = self.pos
            tried = set()
            end = len(buf)
            for _ in range(_BACK_TRIES):
                cut = self._cut_back(buf, start, end)
                if cut is None:
                    break
                k, after = cut
                tried.add(k)
                events = self._decode(buf[start : k + 1])
                if events is not None:
                    self.pos = after
                    return events
                # The next cut ends before the byte that made this one malformed: damage there refuses every cut
                # after it, and stepping back over one event a try would decode the same bytes again for each event
                # in front of it (a trace damaged at its 868 KB took 22 s to refuse, 3,566 batches of one event).
                # A cut inside a string says nothing of where ("truncated"): one event back, as before.
                end = k if self._failed_at is None else min(k, start + self._failed_at)
                damage = self._damage(damage, start)
            for cut, after in self._cuts_forward(buf, start, tried):
                tried.add(cut)
                events = self._decode(buf[start : cut + 1])
                if events is not None:
                    self.pos = after
                    return events
                damage = self._damage(damage, start)
            if damage is not None:
                # Bytes of the file itself break the JSON there: no more of the file mends them, so no batch ends
                # after them. A batch that ends before them is one of the cuts in front (the last tries): else the
                # events array is damaged at this event, whatever the file's size.
                for cut, after in self._cuts_before(buf, start, damage - self.offset, tried):
                    events = self._decode(buf[start : cut + 1])
                    if events is not None:
                        self.pos = after
                        return events
                raise TraceError(
                    f"invalid JSON in traceEvents {self._where()}: the event that starts there breaks at byte "
                    f"{damage:,}"
                )
            if len(buf) - start > self.max_value_b:
                raise TraceError(
                    f"no event ends within {self.max_value_b >> 20} MiB {self._where()}: not a trace"
                )
            if not self._fill(len(buf) - start):
                raise TraceError(
                    f"invalid JSON in traceEvents {self._where()}, or the file is cut short there"
                )

    def _boundary(self, buf: bytes, k: int) -> int | None:
        """Where the next item or the closing bracket starts, if ``}`` at ``k`` ends an item of the events array."""
        j = k + 1
        n = len(buf)
        while j < n and buf[j] in _WS:
            j += 1
        if j >= n:
            return None
        if buf[j] == 0x5D:  # ]
            return j
        if buf[j] != 0x2C:  # ,
            return None
        # "}," inside a string (a C++ kernel name: "{lambda()#1}, at::...") is common; "}, {" much less.
        i = j + 1
        while i < n and buf[i] in _WS:
            i += 1
        return j if i < n and buf[i] == 0x7B else None

    def _cut_back(self, buf: bytes, start: int, end: int) -> tuple[int, int] | None:
        """The last place before ``end`` where an item of the events array may end: its ``}`` and what follows it."""
        while True:
            k = buf.rfind(b"}", start, end)
            if k < 0:
                return None
            after = self._boundary(buf, k)
            if after is not None:
                return k, after
            end = k

    def _cuts_forward(self, buf: bytes, start: int, tried: set[int]) -> list[tuple[int, int]]:
        cuts = []
        at = start
        while len(cuts) < _FORWARD_TRIES:
            k = buf.find(b"}", at)
            if k < 0:
                break
            after = self._boundary(buf, k)
            if after is not None and k not in tried:
                cuts.append((k, after))
            at = k + 1
        return cuts

    def _damage(self, damage: int | None, start: int) -> int | None:
        """The file's first byte known to break its JSON after the batch's ``start``: ``damage`` or the byte the last
        try failed at, where that byte is the file's fault (``_decode``)."""
        if not self._damaged:
            return damage
        at = self.offset + start + self._failed_at  # type: ignore[operator]  # damaged: msgspec named a byte
        return at if damage is None else min(damage, at)

    def _cuts_before(self, buf: bytes, start: int, end: int, tried: set[int]) -> list[tuple[int, int]]:
        """Every place before ``end`` where an item of the events array may end that no try took yet, last first."""
        cuts = []
        while (cut := self._cut_back(buf, start, end)) is not None:
            if cut[0] not in tried:
                cuts.append(cut)
            end = cut[0]
        return cuts

    def _decode(self, items: bytes) -> list | None:
        """The events of ``items`` (JSON values separated by commas), or None when they are not valid JSON.

        When they are not, ``_failed_at`` is the byte of ``items`` msgspec named (None: it named none, as for a cut
        inside a string), and ``_damaged`` whether that byte is the file's own fault: a byte of ``items`` that cannot
        follow the bytes before it, which is the same byte in the file (the bytes from an item's start on read the
        same there, one array deeper). Not so for the byte after the items (the "]" the try added, where a cut left a
        value open) or for trailing characters (a cut past the events array's own "]", into a later key)."""
        text = b"[" + items + b"]"
        self.decodes += 1
        self._failed_at = None
        self._damaged = False
        try:
            return self._typed.decode(text)
        except msgspec.ValidationError:
            pass  # valid so far, but some event has a field of the wrong type: take the others one by one
        except msgspec.DecodeError as exc:
            message = str(exc)
            failed_at = _FAILED_AT.search(message)
            if failed_at is not None:  # the text's byte, less the "[" before the items
                self._failed_at = int(failed_at.group(1)) - 1
                self._damaged = self._failed_at < len(items) and "trailing characters" not in message
            return None
        except RecursionError:
            return None
        try:
            raw = self._any.decode(text)
        except (msgspec.DecodeError, RecursionError):
            return None
        events = []
        for item in raw:
            try:
                events.append(msgspec.convert(item, self.event_type))
            except (msgspec.ValidationError, TypeError):
                self.skipped += 1
        return events
