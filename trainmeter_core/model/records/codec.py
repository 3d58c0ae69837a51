"""The records' codec: the wire form (MessagePack), the run log's line (JSON), the checks a hub makes of what a
producer sends, and the decoders back into typed records. It defines no kind and never imports the package's face:
the face builds the one ``UnionCodec`` from its union of every kind and hands out its methods.
"""

import math
from typing import Any

import msgspec

from trainmeter_core.model.records.header import Record

#: Kinds whose dict-of-float fields may hold NaN or infinity, which JSON cannot carry as numbers.
#: A field holds a mapping of numbers, a list of numbers, or a list of mappings of numbers (a block's columns).
_NONFINITE_FIELDS: dict[str, tuple[str, ...]] = {
    "metric": ("values",),
    "alert": ("numbers",),
    "block": ("loss", "metric_values"),
}
_NONFINITE_TEXT = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
#: Kinds with fields typed ``Any`` (Fact.value, ExplainInput.value): they may hold map keys JSON cannot carry.
_ANY_VALUED_KINDS = frozenset({"fact", "snapshot"})


class Unknown(msgspec.Struct, kw_only=True):
    """A record of a kind this version does not know (from a newer writer): kept verbatim, counted, never fatal."""

    kind: str
    data: dict[str, Any]
    seq: int | None = None


class MalformedRecord(ValueError):
    """Bytes that are not a record: counted and dropped by whoever reads them."""


def reject_extension(code: int, data: memoryview) -> Any:
    """The ``ext_hook`` of every MessagePack decoder of records: no record carries a MessagePack extension, and the
    JSON log could not hold one."""
    raise ValueError(f"MessagePack extension type {code}")


_msgpack_encoder = msgspec.msgpack.Encoder()
_msgpack_any = msgspec.msgpack.Decoder(ext_hook=reject_extension)
_msgpack_any_list = msgspec.msgpack.Decoder(list, ext_hook=reject_extension)
_json_encoder = msgspec.json.Encoder()
_json_any = msgspec.json.Decoder()


def encode(record: Record) -> bytes:
    """The wire form: MessagePack of one record."""
    return _msgpack_encoder.encode(record)


def encode_many(records: list[Record]) -> bytes:
    """A batch on the wire: a MessagePack array of records (the hub splits it without re-encoding)."""
    return _msgpack_encoder.encode(records)


def topic(kind: str) -> bytes:
    return kind.encode("ascii")


class Checked(msgspec.Struct):
    """What ``check`` learned of one payload: the raw mapping, its kind, whether the kind or a field is unknown, and
    the typed record its schema check decoded (None for a kind this version does not know): a hub that looks further
    into a record (a block's columns) reads it there rather than decoding the payload again."""

    kind: str
    data: dict[str, Any]
    unknown: bool
    record: Record | None = None


def _require_loggable(kind: str, data: dict[str, Any]) -> None:
    # What the schema leaves untyped (unknown kinds and fields, Any) may hold map keys the JSON log cannot: such a
    # record would stop the recorder, so it is malformed here. Typed fields cannot, so the hot path skips this.
    try:
        _json_encoder.encode(data)
    except (TypeError, ValueError, RecursionError, msgspec.EncodeError) as exc:
        raise MalformedRecord(f"{kind}: not loggable: {exc}") from None


class UnionCodec:
    """The checks and typed decoders of one tagged union of record kinds: a decoder per kind, and one of the whole
    union for a wire record, for a batch of them and for a log line.

    ``kinds`` maps each kind (the tag) to its Struct class, ``fields`` to the field names a record of that kind may
    carry (the tag included). The decoders are built at the first decode, each attribute standing in for its decoder
    until then replaced by it: building them evaluates every annotation of every kind, about 1.3 ms that a process
    which only builds and sends records (the agent, in the training process) never needs to pay.
    """

    def __init__(self, union: Any) -> None:
        self.kinds: dict[str, type[Record]] = {cls.__struct_config__.tag: cls for cls in union.__args__}
        self.fields: dict[str, frozenset[str]] = {
            kind: frozenset(cls.__struct_fields__) | {"kind"} for kind, cls in self.kinds.items()
        }
        self._union = union
        self._json_typed = _BuiltOnFirstUse(self, "_json_typed")
        self._typed_msgpack = _BuiltOnFirstUse(self, "_typed_msgpack")
        self._typed_union_list = _BuiltOnFirstUse(self, "_typed_union_list")
        self._typed_union_msgpack = _BuiltOnFirstUse(self, "_typed_union_msgpack")

    def build_decoders(self) -> None:
        """Build the decoders now (the first decode does it otherwise). Two threads that both build leave equal ones."""
        union = self._union
        self._json_typed = msgspec.json.Decoder(union)
        self._typed_msgpack = {kind: msgspec.msgpack.Decoder(cls) for kind, cls in self.kinds.items()}
        self._typed_union_list = msgspec.msgpack.Decoder(list[union], ext_hook=reject_extension)
        self._typed_union_msgpack = msgspec.msgpack.Decoder(union, ext_hook=reject_extension)

    def check(self, payload: bytes) -> Checked:
        """Validate one wire payload, keeping fields and kinds this version does not know.

        Raises MalformedRecord for bytes that are not a mapping with a string ``kind``, or that break the schema of a
        known kind. An unknown kind, or a known kind carrying extra fields, is valid and flagged ``unknown``.
        """
        try:
            data = _msgpack_any.decode(payload)
        # ValueError: msgspec raises it for some truncated inputs (and reject_extension); RecursionError: absurd nesting
        except (msgspec.DecodeError, ValueError, RecursionError) as exc:
            raise MalformedRecord(f"not MessagePack: {exc}") from None
        if not isinstance(data, dict):
            raise MalformedRecord(f"not a mapping but {type(data).__name__}")
        kind = data.get("kind")
        if not isinstance(kind, str):
            raise MalformedRecord("no string 'kind'")
        decoder = self._typed_msgpack.get(kind)
        if decoder is None:
            _require_loggable(kind, data)
            return Checked(kind, data, True)
        try:
            record = decoder.decode(payload)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
            raise MalformedRecord(f"{kind}: {exc}") from None
        unknown = not self.fields[kind].issuperset(data)
        if unknown or kind in _ANY_VALUED_KINDS:
            _require_loggable(kind, data)
        return Checked(kind, data, unknown, record)

    def check_batch(self, payload: bytes) -> list[Checked] | None:
        """``check`` of every record of a producer's batch (a MessagePack array of records), in two decodes of the
        whole array instead of two per record; None when any record is not a valid record of a known kind, for the
        caller to check them one by one (so that the bad one is counted alone and the others pass)."""
        try:
            items = _msgpack_any_list.decode(payload)
            # The schema of each record's kind, found by its tag: what check's typed decode of each does.
            typed = self._typed_union_list.decode(payload)
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError, RecursionError):
            return None
        fields = self.fields
        checked = []
        for data, record in zip(items, typed, strict=True):
            if not isinstance(data, dict):
                return None
            kind = data.get("kind")
            if kind not in fields:
                return None  # not the tag the typed decode checked (msgspec refuses a second, other "kind" today)
            unknown = not fields[kind].issuperset(data)
            if unknown or kind in _ANY_VALUED_KINDS:
                try:
                    _require_loggable(kind, data)
                except MalformedRecord:
                    return None
            checked.append(Checked(kind, data, unknown, record))
        return checked

    def decode(self, payload: bytes) -> Record | Unknown:
        """Decode one wire payload into its Struct, or Unknown for a kind this version does not know."""
        checked = self.check(payload)
        if checked.kind not in self.kinds:
            return Unknown(kind=checked.kind, data=checked.data)
        return self._typed_msgpack[checked.kind].decode(payload)

    def decode_published(self, payload: bytes) -> Record | Unknown:
        """``decode`` for what the hub published, which it checked as it took it in: one typed decode of the union by
        the ``kind`` tag; what that refuses (a kind this version does not know, a malformed record) takes ``decode``."""
        try:
            return self._typed_union_msgpack.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError):
            return self.decode(payload)

    def from_log_line(self, line: bytes | str) -> Record | Unknown:
        """Decode one line of the run log. Raises MalformedRecord for anything that is not a valid record."""
        # Fast path: a typed decode of the union. Anything it refuses (an unknown kind, a non-finite float written as
        # text, or a line that is really malformed) takes the careful path below, which decides.
        try:
            return self._json_typed.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, ValueError, RecursionError):
            pass
        try:
            data = _json_any.decode(line)
        except (msgspec.DecodeError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise MalformedRecord(f"not JSON: {exc}") from None
        return self.from_mapping(data)

    def from_mapping(self, data: Any) -> Record | Unknown:
        """A record from a plain mapping (a decoded JSON line), restoring non-finite floats."""
        if not isinstance(data, dict):
            raise MalformedRecord(f"not a mapping but {type(data).__name__}")
        kind = data.get("kind")
        if not isinstance(kind, str):
            raise MalformedRecord("no string 'kind'")
        cls = self.kinds.get(kind)
        if cls is None:
            seq = data.get("seq")
            return Unknown(kind=kind, data=data, seq=seq if isinstance(seq, int) else None)
        for field in _NONFINITE_FIELDS.get(kind, ()):
            value = data.get(field)
            if value is not None:
                data[field] = _restore_nonfinite(value)
        try:
            return msgspec.convert(data, cls)
        except msgspec.ValidationError as exc:
            raise MalformedRecord(f"{kind}: {exc}") from None


class _BuiltOnFirstUse:
    """Stands in for one decoder of a ``UnionCodec`` (or its map of them by kind) until the first use, which builds
    them all and replaces every stand-in: from then on the codec reads its decoders with no detour."""

    __slots__ = ("_codec", "_name")

    def __init__(self, codec: UnionCodec, name: str) -> None:
        self._codec = codec
        self._name = name

    def _built(self) -> Any:
        self._codec.build_decoders()
        return getattr(self._codec, self._name)

    def decode(self, payload: bytes | str) -> Any:
        return self._built().decode(payload)

    def get(self, kind: str) -> Any:
        return self._built().get(kind)

    def __getitem__(self, kind: str) -> Any:
        return self._built()[kind]


def leading_kind(payload) -> str | None:
    """The kind a payload names in its first field, as msgspec writes a record (a map, its tag first, the tag a string
    of at most 31 bytes), read from its first bytes without decoding the rest; None for any other start. A look, not a
    check: the bytes after it may still be malformed."""
    head = bytes(memoryview(payload)[:40])
    at = 3 if head[:1] == b"\xde" else 1 if b"\x80" <= head[:1] <= b"\x8f" else 0
    if not at or head[at : at + 5] != b"\xa4kind":
        return None
    length = head[at + 5] - 0xA0 if len(head) > at + 5 else -1
    if not 0 <= length <= 31 or len(head) < at + 6 + length:
        return None
    try:
        return head[at + 6 : at + 6 + length].decode("ascii")
    except UnicodeDecodeError:
        return None


def split_batch(payload: bytes) -> list[msgspec.Raw]:
    """The raw bytes of each record in a batch, without decoding them."""
    try:
        items = msgspec.msgpack.decode(payload, type=list[msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        raise MalformedRecord(f"batch: {exc}") from None
    return items


def to_log_line(data: dict[str, Any]) -> bytes:
    """One JSON line of the run log from a checked mapping (which keeps unknown fields verbatim)."""
    fields = _NONFINITE_FIELDS.get(data.get("kind", ""))
    if fields:
        for field in fields:
            value = data.get(field)
            if value is not None:
                data[field] = _write_nonfinite(value)
    return _json_encoder.encode(data) + b"\n"


def _nonfinite_text(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _write_nonfinite(value: Any) -> Any:
    """A field of numbers with each non-finite float as the text the log writes for it (JSON has no such number): a
    mapping is changed in place, a list of numbers replaced only when it holds one, a list of mappings entry by entry."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, float) and not math.isfinite(item):
                value[key] = _nonfinite_text(item)
    elif isinstance(value, list):
        if value and isinstance(value[0], dict):
            for entry in value:
                _write_nonfinite(entry)
        else:
            floats = [x for x in value if type(x) is float]
            # A sum is finite unless a term is not (a finite sum that overflows is looked at term by term).
            if not math.isfinite(sum(floats)) and not all(math.isfinite(x) for x in floats):
                return [_nonfinite_text(x) if type(x) is float and not math.isfinite(x) else x for x in value]
    return value


def _restore_nonfinite(value: Any) -> Any:
    """``_write_nonfinite`` undone: the texts of non-finite numbers back into floats."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, str) and item in _NONFINITE_TEXT:
                value[key] = _NONFINITE_TEXT[item]
    elif isinstance(value, list):
        return [
            _restore_nonfinite(x)
            if isinstance(x, dict)
            else _NONFINITE_TEXT.get(x, x)
            if isinstance(x, str)
            else x
            for x in value
        ]
    return value


def to_builtins(record: Record | Unknown) -> dict[str, Any]:
    """A record as plain Python data (for JSON output by tools); keeps the kind."""
    if isinstance(record, Unknown):
        return dict(record.data)
    return msgspec.to_builtins(record)


def kind_of(record: Record | Unknown) -> str:
    """The kind of a record (the tag), for Structs and Unknown alike: ``record.kind``."""
    return record.kind
