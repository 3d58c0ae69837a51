"""The header every record carries, and the one form of "unknown" every kind uses: a field left out and named in
``absent`` with its reason, never a zero. Each family module builds its kinds on ``Record``; the schema's version is
here because every header says it. Pure: no I/O, no clock.
"""

# No ``from __future__ import annotations`` here, nor in any module of the records package: the decoders (built at
# the first decode) would then evaluate ~600 annotations from strings, which cost every tm process 3-8 ms at start
# (docs/performance.md, "The launcher: what a short command pays"). tests/unit/test_records.py holds every module of the package to it.
import msgspec

#: Version of the record schema; a reader keeps records of a newer version and counts what it does not know.
#: 2: a FLOP count ends in ``_flop`` and a rate in ``_flop_per_s`` (docs/bus.md has the table of renamed keys).
SCHEMA_VERSION = 2
#: What a record without ``v`` was written under: schema 1 left ``v`` out as its default. Writers stamp
#: ``SCHEMA_VERSION`` on every record they send (the producer and the hub), so every line says its schema.
UNSTAMPED_VERSION = 1


class Record(msgspec.Struct, tag_field="kind", kw_only=True, omit_defaults=True):
    """The header every record carries.

    ``seq`` is the hub's sequence number: absent on the wire from a producer (the hub sends it in its own frame) and
    present in the run log. ``t`` is monotonic seconds (CLOCK_MONOTONIC, shared by the processes of one host),
    ``wall`` is Unix time. ``dropped`` is the producer's cumulative count of records it had to drop when this one was
    sent, so the last record received from a producer is authoritative. ``absent`` maps a field name to the reason it
    is missing: the one form of "unknown" every kind uses.
    """

    v: int = UNSTAMPED_VERSION
    seq: int | None = None
    t: float = 0.0
    wall: float = 0.0
    source: str = ""
    host: str = ""
    pid: int = 0
    rank: int | None = None
    dropped: int = 0
    absent: dict[str, str] = {}

    @property
    def kind(self) -> str:
        """The record's kind (``step``, ``sample.gpu``, ...): its tag, which the wire and the log carry as ``kind``.

        A property, not a field: msgspec writes the tag itself, so the encoding is the same with it or without it.
        ``records.Unknown`` (a kind newer than this tm) holds its ``kind`` as a field, so every record a subscriber
        receives answers ``record.kind``."""
        return self.__struct_config__.tag
