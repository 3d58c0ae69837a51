"""Reading a run log: its segments in order, plain or compressed, skipping and counting whatever is not a record.

A reader never crashes on a log: malformed lines, bytes that are not UTF-8, wrong payload types and a last line cut by
a SIGKILL are skipped and counted (by reason); kinds from a newer writer are kept as ``Unknown``.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

from trainmeter_core import records as rec

_SEGMENT = re.compile(r"^events-(\d{4,})\.jsonl(\.gz)?$")


def segments(run_dir: Path) -> list[Path]:
    """The log's segments in order; where a segment exists both plain and compressed, the plain one."""
    found: dict[int, Path] = {}
    for path in Path(run_dir).iterdir():
        match = _SEGMENT.match(path.name)
        if not match:
            continue
        n = int(match.group(1))
        if n not in found or not match.group(2):
            found[n] = path
    return [found[n] for n in sorted(found)]


def _lines(path: Path) -> Iterator[bytes]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            yield from f
    except (OSError, EOFError, zlib.error):  # a compressed segment cut short or corrupt: what was read stands
        return


def read_log(
    run_dir: Path, kinds: set[str] | None = None, stats: dict | None = None
) -> Iterator[rec.Record | rec.Unknown]:
    """Every record of a run's log in order. ``stats`` (if given) receives ``skipped`` and ``reasons``."""
    if stats is None:
        stats = {}
    stats.setdefault("skipped", 0)
    stats.setdefault("unknown", 0)
    reasons: dict[str, int] = stats.setdefault("reasons", {})
    paths = segments(run_dir)
    for index, path in enumerate(paths):
        last_segment = index == len(paths) - 1
        for line in _lines(path):
            if not line.endswith(b"\n"):
                reason = "truncated last line" if last_segment else "truncated line"
                stats["skipped"] += 1
                reasons[reason] = reasons.get(reason, 0) + 1
                continue
            if kinds is not None:
                # Cheap pre-filter: a line of another kind is not decoded at all.
                if not any(f'"kind":"{k}"'.encode() in line for k in kinds):
                    continue
            try:
                record = rec.from_log_line(line)
            except rec.MalformedRecord as exc:
                reason = str(exc).split(":")[0]
                stats["skipped"] += 1
                reasons[reason] = reasons.get(reason, 0) + 1
                continue
            if isinstance(record, rec.Unknown):
                stats["unknown"] += 1
            if kinds is None or rec.kind_of(record) in kinds:
                yield record
