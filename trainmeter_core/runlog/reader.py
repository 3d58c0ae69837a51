"""Reading a run log: its segments in order, plain or compressed, skipping and counting whatever is not a record.

A reader never crashes on a log: malformed lines, bytes that are not UTF-8, wrong payload types and a last line cut by
a SIGKILL are skipped and counted (by reason); kinds from a newer writer are kept as ``Unknown``. A reader that wants
only the tail (``after_seq``, from a checkpoint) skips whole segments by their first sequence number and, inside a
segment, every line at or before it by a look at its last key, so it never decodes a record it does not need.
A ``block`` line (many steps, metrics and phases as columns, numbered as its rows) reaches whoever asks for one of those
kinds as its rows, unless the reader asks for blocks as they are.

Why one module: the tag filter, the bounds and the cutting of blocks at them are one pass over the same lines and
chunks; split, each half would have to know how the other reads a line.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Union

import msgspec

from trainmeter_core.model import records

#: A segment's file name: its number, and ``.gz`` once compressed.
SEGMENT_RE = re.compile(r"^events-(\d{4,})\.jsonl(\.gz)?$")
_SEQ_KEY = b'"seq":'
# How far into a segment its first sequence number is looked for (past lines that are damaged or carry none).
_FIRST_SEQ_LINES = 64
# How much of a segment is read at once while passing what lies before a checkpoint.
_CHUNK_B = 1024 * 1024


def segments(run_dir: Path) -> list[Path]:
    """The log's segments in order; where a segment exists both plain and compressed, the plain one."""
    found: dict[int, Path] = {}
    for path in Path(run_dir).iterdir():
        match = SEGMENT_RE.match(path.name)
        if not match:
            continue
        n = int(match.group(1))
        if n not in found or not match.group(2):
            found[n] = path
    return [found[n] for n in sorted(found)]


def _open(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115 - the caller closes


def _lines(path: Path, after_seq: int = 0) -> Iterator[bytes]:
    """The segment's lines (the last one possibly cut); with ``after_seq``, from about where records after it start:
    whole chunks that end at or before it are passed without being split into lines, and a plain segment (the one
    being written, the last of a finished run) is first bisected by its offsets, so only its end is read."""
    try:
        with _open(path) as f:
            if after_seq <= 0:
                yield from f
                return
            if path.suffix != ".gz":
                f.seek(_bisect(f, after_seq))
            carry = b""
            while True:
                chunk = f.read(_CHUNK_B)
                if not chunk:
                    if carry:
                        yield carry
                    return
                data = carry + chunk
                end = data.rfind(b"\n") + 1
                if end == 0:
                    carry = data
                    continue
                last = seq_at_end(data[data.rfind(b"\n", 0, end - 1) + 1 : end])
                if last is not None and last <= after_seq:
                    # Every line up to here is at or before after_seq: the hub numbers in order.
                    carry = data[end:]
                    continue
                # The tail starts in this chunk: its lines, then the rest of the segment as it comes.
                yield from data[:end].splitlines(keepends=True)
                carry = data[end:]
                if carry:
                    yield carry + f.readline()
                yield from f
                return
    except (OSError, EOFError, zlib.error):  # a compressed segment cut short or corrupt: what was read stands
        return


def _bisect(f: BinaryIO, after_seq: int) -> int:
    """The offset of a line start at or before the first line after ``after_seq`` in a plain segment, within a chunk
    of it; 0 when a line in the way cannot tell its sequence number."""
    lo, hi = 0, f.seek(0, os.SEEK_END)
    while hi - lo > _CHUNK_B:
        mid = (lo + hi) // 2
        f.seek(mid)
        f.readline()  # to the next line start
        start = f.tell()
        seq = seq_at_end(f.readline())
        if seq is None:
            return lo
        if seq <= after_seq:
            lo = start
        else:
            hi = mid
    return lo


def seq_at_end(line: bytes) -> int | None:
    """The sequence number a log line ends with, read without decoding the line; None when it does not end so.

    The hub appends ``seq`` last to every record it numbers, so a line it wrote ends ``,"seq":N}``. One closing brace
    only: a nested mapping whose last key were "seq" would end with two; and inside a JSON string the quotes are
    escaped, so the key cannot be faked there.
    """
    if not line.endswith(b"}\n"):
        return None
    key = line.rfind(_SEQ_KEY, max(0, len(line) - 32))
    if key < 1 or line[key - 1] not in b"{,":
        return None
    digits = line[key + len(_SEQ_KEY) : -2]
    if not digits.isdigit() or len(digits) > 18:
        return None
    return int(digits)


def first_seq(path: Path, stats: dict | None = None) -> int | None:
    """The sequence number of a segment's first record (decoded in full, so a damaged line cannot mislead the
    index); None when its first lines hold none."""
    for index, line in enumerate(_lines(path)):
        if index >= _FIRST_SEQ_LINES or not line.endswith(b"\n"):
            return None
        if stats is not None:
            stats["decoded"] = stats.get("decoded", 0) + 1
        try:
            record = records.from_log_line(line)
        except records.MalformedRecord:
            continue
        if record.seq is not None:
            # A block's seq is its last row's: the segment starts with its first.
            return record.seq - record.rows + 1 if type(record) is records.Block else record.seq
    return None


def start_segment(paths: list[Path], after_seq: int, stats: dict | None = None) -> int:
    """The index of the first segment that can hold a record after ``after_seq``.

    Looked for from the last segment backwards: a checkpoint is at most minutes old, so the tail starts in the last
    segment or the one before, and only those are opened (a compressed one only up to its first line). A segment
    whose first sequence number cannot be read is never skipped on a guess: the search goes on before it.
    """
    for index in range(len(paths) - 1, 0, -1):
        first = first_seq(paths[index], stats)
        if first is not None and first <= after_seq + 1:
            return index
    return 0


def read_log(
    run_dir: Path,
    kinds: set[str] | frozenset[str] | None = None,
    stats: dict | None = None,
    *,
    after_seq: int = 0,
    before_seq: int | None = None,
    blocks: bool = False,
) -> Iterator[records.Record | records.Unknown]:
    """Every record of a run's log in order, or only those with ``after_seq < seq < before_seq``.

    A block comes as its rows of the kinds asked (``step``, ``metric``, ``phase``; every row when ``kinds`` is None),
    each with its own ``seq``; with ``blocks`` true, or ``block`` among ``kinds``, as it is, unless the bounds cut it:
    then as its rows inside them (of the row kinds asked, or of every row kind when none is).

    ``stats`` (if given) receives ``skipped`` and ``reasons`` (lines that are not records), ``unknown`` (records of a
    kind this version does not know), ``decoded`` (lines decoded in full, the segment index included) and
    ``last_seq`` (the last sequence number passed, of a record left out by ``kinds`` too). With ``after_seq`` or
    ``before_seq``, a record that carries no sequence number cannot be placed and is left out. The records come in
    decoded lists through one ``itertools.chain``: no Python frame resumes per record (2% of a replay).
    """
    row_kinds = records.ROW_KINDS if kinds is None else frozenset(kinds) & records.ROW_KINDS
    whole = blocks or (kinds is not None and "block" in kinds)
    if kinds is not None and (whole or row_kinds):
        kinds = {*kinds, "block"}  # block lines pass the tag filter and are decoded
    if stats is None:
        stats = {}
    pieces = _pieces(run_dir, kinds, stats, after_seq, before_seq)
    if not whole and not row_kinds:
        return itertools.chain.from_iterable(pieces)  # no block wanted: none decoded
    limit = before_seq if before_seq is not None else 1 << 64
    cut_kinds = None if not row_kinds or row_kinds == records.ROW_KINDS else row_kinds
    return itertools.chain.from_iterable(
        _opened(piece, whole, cut_kinds, after_seq, limit, stats) for piece in pieces
    )


def _opened(
    found: list, whole: bool, kinds: frozenset[str] | None, after_seq: int, limit: int, stats: dict
) -> list:
    """A decoded list with each block in it as its rows of ``kinds`` (every row kind when None), or as it is when
    ``whole`` and the bounds ``after_seq < seq < limit`` do not cut it (its rows inside them when they do). A block
    whose columns disagree with its rows is skipped and counted, as a line that is no record is."""
    block_type = records.Block
    if block_type not in map(type, found):
        return found
    out: list = []
    for record in found:
        if type(record) is not block_type:
            out.append(record)
            continue
        try:
            records.block.validate(record)
        except records.MalformedRecord:
            stats["skipped"] += 1
            stats["reasons"]["block"] = stats["reasons"].get("block", 0) + 1
            continue
        seq = record.seq
        cut = seq is not None and (seq - record.rows < after_seq or seq >= limit)
        if whole and not cut:
            out.append(record)
            continue
        rows = records.block.expand(record, kinds, after_seq if seq is not None else 0)
        if seq is not None and seq >= limit:
            rows = [row for row in rows if row.seq < limit]
        out.extend(rows)
    return out


def _pieces(run_dir: Path, kinds, stats: dict | None, after_seq: int, before_seq) -> Iterator[list]:
    """``read_log``'s records, in lists as they are decoded (lazily: nothing is read before the first is asked for)."""
    if stats is None:
        stats = {}
    stats.setdefault("skipped", 0)
    stats.setdefault("unknown", 0)
    stats.setdefault("decoded", 0)
    stats.setdefault("last_seq", None)
    reasons: dict[str, int] = stats.setdefault("reasons", {})
    bounded = after_seq > 0 or before_seq is not None
    limit = before_seq if before_seq is not None else 1 << 64
    paths = segments(run_dir)
    start = start_segment(paths, after_seq, stats) if after_seq > 0 else 0
    wanted = None if kinds is None else {k.encode() for k in kinds}
    # A wanted line's start, as the recorder writes it.
    kind_marks = None if kinds is None else [f'{{"kind":"{k}"'.encode() for k in kinds]
    if not bounded:
        for index, path in enumerate(paths):
            yield from _whole_segment(path, index == len(paths) - 1, stats, kinds, wanted, kind_marks)
        return
    for index in range(start, len(paths)):
        last_segment = index == len(paths) - 1
        chunk: list[bytes] = []
        for line in _lines(paths[index], after_seq):
            if not line.endswith(b"\n"):
                reason = "truncated last line" if last_segment else "truncated line"
                stats["skipped"] += 1
                reasons[reason] = reasons.get(reason, 0) + 1
                continue
            if bounded:
                # Each line is checked, not only until the first one past after_seq: one damaged line must not let
                # the lines after it through twice.
                seq = seq_at_end(line)
                if seq is not None:
                    if seq <= after_seq:
                        continue
                    if seq >= limit:
                        # A block's seq is its last row's: its first rows may be before the limit.
                        if _BLOCK_MARK in line and (wanted is None or b"block" in wanted):
                            chunk.append(line)
                        yield _decoded(chunk, stats, kinds, after_seq, limit, bounded)[0]
                        return  # the recorder writes in hub order: nothing wanted follows
            if wanted is not None and line.startswith(_KIND_FIRST):
                # A line of another kind is not decoded at all: the recorder writes the tag first, so one look at the
                # line's start tells. A line written otherwise is decoded (and counted, when it is no record).
                end = line.find(b'"', 9)
                if line[9:end] not in wanted:
                    stats["last_seq"] = seq_at_end(line) or stats["last_seq"]
                    continue
            chunk.append(line)
            if len(chunk) >= _BATCH_LINES:
                found, past_limit = _decoded(chunk, stats, kinds, after_seq, limit, bounded)
                yield found
                if past_limit:
                    return
                chunk = []
        found, past_limit = _decoded(chunk, stats, kinds, after_seq, limit, bounded)
        yield found
        if past_limit:
            return


def _whole_segment(path: Path, last_segment: bool, stats: dict, kinds, wanted, kind_marks) -> Iterator[list]:
    """Every wanted record of one segment, in lists, read in 1 MiB chunks split into lines at once (what the
    line-by-line loop of a bounded read costs per line is most of a small record's decode)."""
    reasons = stats["reasons"]
    carry = b""
    search = wanted is not None
    try:
        with _open(path) as f:
            while True:
                data = f.read(_CHUNK_B)
                if not data:
                    break
                if carry:
                    data = carry + data
                cut = data.rfind(b"\n") + 1
                carry = data[cut:]
                if not cut:
                    continue
                sparse = None
                if search:
                    sparse = _sparse_lines(data, cut, kind_marks, stats)
                    if sparse is _DENSE:
                        search = False  # wanted lines are many here: the rest is decoded piece by piece
                        sparse = None
                if sparse is not None:
                    yield from _line_records(sparse, stats, kinds, None)
                    continue
                if cut < _PIECE_B:
                    # A chunk shorter than one piece (a short run's whole log, a segment's last bytes) goes line by
                    # line: the piece decoder, built once per process in 0.5 ms, would cost more than it saves.
                    yield from _line_records(data[: cut - 1].split(b"\n"), stats, kinds, wanted)
                    continue
                # Piece by piece (the records of one piece are handed on before the next is decoded), each decoded by
                # one call, or line by line when a line in it is not a well-formed record of a known kind.
                start = 0
                while start < cut:
                    end = data.find(b"\n", start + _PIECE_B, cut - 1) + 1 or cut
                    found = _decoded_piece(data[start : end - 1], stats, kinds)
                    if found is not None:
                        yield found
                    else:
                        yield from _line_records(data[start : end - 1].split(b"\n"), stats, kinds, wanted)
                    start = end
    except (OSError, EOFError, zlib.error):  # a compressed segment cut short or corrupt: what was read stands
        pass
    if carry:
        reason = "truncated last line" if last_segment else "truncated line"
        stats["skipped"] += 1
        reasons[reason] = reasons.get(reason, 0) + 1


def _sparse_lines(data: bytes, cut: int, kind_marks: list[bytes], stats: dict) -> list[bytes] | object | None:
    """The wanted lines of ``data[:cut]`` (complete lines), found by searching for their tags, when they are few and
    every line starts with the tag the recorder writes first; ``_DENSE`` when they are many (a replay's kinds: the
    caller stops searching), None when a line is written otherwise (the line-by-line filter then runs).

    What the alerts sinks read at a run's end (a few alerts in every record of the log) then costs a search in C per
    chunk instead of a look at each line in Python. ``stats["last_seq"]`` ends as the line-by-line filter leaves it:
    the sequence number of the last line passed over, before the wanted ones are decoded.
    """
    lines_n = data.count(b"\n", 0, cut)
    tagged = data.count(b'\n{"kind":"', 0, cut) + (1 if data.startswith(_KIND_FIRST) else 0)
    if tagged != lines_n:
        return None  # a line written otherwise: it is decoded, or counted, by the line-by-line filter
    first_wanted = any(data.startswith(mark) for mark in kind_marks)
    marks = [b"\n" + mark for mark in kind_marks]  # after the newline that ends the line before
    found = int(first_wanted)
    for mark in marks:
        found += data.count(mark, 0, cut)
        if found * _SPARSE_AT_MOST > lines_n:
            return _DENSE
    starts = [0] if first_wanted else []
    for mark in marks:
        at = data.find(mark, 0, cut)
        while at >= 0:
            starts.append(at + 1)
            at = data.find(mark, at + 1, cut)
    starts.sort()
    lines = [data[start : data.find(b"\n", start)] for start in starts]
    # The last line passed over that carries a sequence number (the last line, unless it is wanted or has none).
    wanted_starts = set(starts)
    end = cut - 1
    while end > 0:
        start = data.rfind(b"\n", 0, end) + 1
        if start not in wanted_starts:
            seq = seq_at_end(data[start : end + 1])
            if seq is not None:
                stats["last_seq"] = seq
                break
        end = start - 1
    return lines


def _line_records(lines: list[bytes], stats: dict, kinds, wanted: set[bytes] | None) -> Iterator[list]:
    """The wanted records of complete lines (each without its newline), in lists: filtered first by their tag when
    ``wanted`` is given, then decoded in batches."""
    if wanted is not None:
        # A wanted line passes on the spot; any other goes through _wanted (decoded, or counted as passed).
        lines = [
            line
            for line in lines
            if (line.startswith(_KIND_FIRST) and line[9 : line.find(b'"', 9)] in wanted)
            or _wanted(line, wanted, stats)
        ]
    passed = stats["last_seq"]  # of the lines the filter passed over: a later one than any wanted
    for at in range(0, len(lines), _BATCH_LINES):
        yield _decoded(lines[at : at + _BATCH_LINES], stats, kinds, 0, 1 << 64, False, b"\n")[0]
    if passed is not None and (stats["last_seq"] is None or passed > stats["last_seq"]):
        stats["last_seq"] = passed  # the last sequence number passed, whether wanted or not


def _decoded_piece(body: bytes, stats: dict, kinds) -> list | None:
    """The wanted records of ``body`` (complete lines, the last one without its newline), decoded by one call as one
    JSON array (the newlines turned into commas); None when a line is not a well-formed record of a known kind (the
    caller then goes line by line, where each bad line is skipped and counted alone).

    A record of a kind not wanted decodes into a Struct that keeps only its sequence number: its other fields are
    passed over in C, unchecked, as the line-by-line filter passes a line by its tag. (One case differs from that
    filter, in the counts alone: a line of a kind not wanted that does not start with its tag, and whose fields are
    of the wrong types, is passed here where the filter decodes it and counts it as no record.)

    Measured on the 1M-record log of ``bench/bench_replay.py``: the read takes 0.37 s instead of 0.69 s split into
    lines, filtered by their tags and decoded 256 at a time; pieces of 1 MiB take 0.9 s (the GC walks thousands of
    young records each time it runs, and the piece leaves the CPU caches).
    """
    try:
        found: list = _piece_decoder(None if kinds is None else frozenset(kinds)).decode(
            b"[" + body.replace(b"\n", b",") + b"]"
        )
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    for record in reversed(found):
        if record.seq is not None:
            stats["last_seq"] = record.seq
            break
    if kinds is not None:
        types = _types_of(frozenset(kinds))
        found = [record for record in found if type(record) in types]
    stats["decoded"] += len(found)
    return found


#: How much of a chunk is decoded by one call (the records of a piece are handed on before the next one is decoded:
#: a piece that stays in the CPU caches and a few hundred records alive at once decode fastest).
_PIECE_B = 16 * 1024


@functools.lru_cache(maxsize=64)
def _piece_decoder(kinds: frozenset[str] | None) -> msgspec.json.Decoder:
    """A decoder of a list of records: those of ``kinds`` in full (every kind when None), any other known kind into a
    Struct holding its sequence number alone."""
    if kinds is None:
        return _typed_batch
    members = tuple(cls if kind in kinds else _passed_struct(kind) for kind, cls in records.KINDS.items())
    return msgspec.json.Decoder(list[Union[members]])  # type: ignore[valid-type]  # noqa: UP007 - built at run time


@functools.cache
def _passed_struct(kind: str) -> type:
    """A Struct tagged ``kind`` with the record's sequence number as its one field (the others are skipped)."""
    return msgspec.defstruct(
        f"Passed_{kind.replace('.', '_')}",
        [("seq", int | None, None)],
        tag_field="kind",
        tag=kind,
        kw_only=True,
    )


#: The search above pays when at most one line in this many is wanted.
_SPARSE_AT_MOST = 8
_DENSE = object()


def _wanted(line: bytes, wanted: set[bytes], stats: dict) -> bool:
    """Whether a line may hold one of the kinds wanted: by the tag the recorder writes first; a line that does not
    start with it is decoded (a record written otherwise is then kept or left by its kind, anything else counted)."""
    if line.startswith(_KIND_FIRST):
        if line[9 : line.find(b'"', 9)] in wanted:
            return True
        stats["last_seq"] = seq_at_end(line + b"\n") or stats["last_seq"]
        return False
    return True


_KIND_FIRST = b'{"kind":"'
_BLOCK_MARK = b'"kind":"block"'
#: Lines decoded by one call: the typed decoder's per-call cost is paid once for all of them.
_BATCH_LINES = 256
_typed_batch = msgspec.json.Decoder(list[records.AnyRecord])  # type: ignore[valid-type]


def _decoded(
    lines: list[bytes], stats: dict, kinds, after_seq: int, limit: int, bounded: bool, end: bytes = b""
) -> tuple[list[records.Record | records.Unknown], bool]:
    """The wanted records of consecutive log lines, and whether one past ``limit`` came (nothing after it is wanted).

    The lines are decoded together when every one is a well-formed record of a known kind (the common case), else one
    by one, so that a bad line is skipped and counted alone. ``end`` is what each line lacks of its newline.
    """
    out: list[records.Record | records.Unknown] = []
    if not lines:
        return out, False
    stats["decoded"] += len(lines)
    try:
        found: list = _typed_batch.decode(b"[" + b",".join(lines) + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, ValueError, RecursionError):
        found = []
        reasons = stats["reasons"]
        for line in lines:
            try:
                found.append(records.from_log_line(line + end if end else line))
            except records.MalformedRecord as exc:
                reason = str(exc).split(":")[0]
                stats["skipped"] += 1
                reasons[reason] = reasons.get(reason, 0) + 1
    if not bounded:
        # The whole-log read (a replay's): the same filter as below, with its lookups hoisted out of the loop.
        unknown, kind_of, last_seq = records.Unknown, records.kind_of, stats["last_seq"]
        types = None if kinds is None else _types_of(frozenset(kinds))
        for record in found:
            seq = record.seq
            if seq is not None:
                last_seq = seq
            cls = type(record)
            if cls is unknown:
                stats["unknown"] += 1
            if types is None or cls in types or (cls is unknown and kind_of(record) in kinds):
                out.append(record)
        stats["last_seq"] = last_seq
        return out, False
    for record in found:
        seq = record.seq
        if seq is not None:
            stats["last_seq"] = seq
        if bounded:
            if seq is None or seq <= after_seq:
                continue
            if seq >= limit:
                if (
                    type(record) is records.Block
                    and seq - record.rows + 1 < limit
                    and (kinds is None or "block" in kinds)
                ):
                    out.append(record)  # its first rows are before the limit: read_log cuts it
                return out, True
        if type(record) is records.Unknown:
            stats["unknown"] += 1
        if kinds is None or records.kind_of(record) in kinds:
            out.append(record)
    return out, False


@functools.lru_cache(maxsize=64)
def _types_of(kinds: frozenset[str]) -> frozenset[type]:
    """The record types of ``kinds`` (an Unknown record's kind is checked by name)."""
    return frozenset(records.KINDS[kind] for kind in kinds if kind in records.KINDS)


def read_segment(path: Path, kinds: set[str] | None = None) -> Iterator[records.Record | records.Unknown]:
    """The records of one segment in order (of ``kinds`` only, the others not decoded); lines that are not records
    are skipped. A block comes as its rows of the kinds asked."""
    row_kinds = records.ROW_KINDS if kinds is None else frozenset(kinds) & records.ROW_KINDS
    marks = None if kinds is None else [f'"kind":"{k}"'.encode() for k in kinds]
    if marks is not None and row_kinds:
        marks.append(_BLOCK_MARK)
    for line in _lines(path):
        if not line.endswith(b"\n") or (marks is not None and not any(mark in line for mark in marks)):
            continue
        try:
            record = records.from_log_line(line)
        except records.MalformedRecord:
            continue
        if type(record) is records.Block and row_kinds:
            yield from _opened([record], False, row_kinds, 0, 1 << 64, {"skipped": 0, "reasons": {}})
        elif kinds is None or records.kind_of(record) in kinds:
            yield record
