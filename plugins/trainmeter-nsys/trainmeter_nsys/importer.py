"""Nsight Systems' SQLite export (``nsys export --type sqlite``) into ``profile.import`` records.

It reads the tables of the export schema NVIDIA documents ("SQLite Export Schema Reference", Nsight Systems
2021.5 and later; the README names each column used): kernels, memcpys and memsets of ``CUPTI_ACTIVITY_KIND_*``,
their names in ``StringIds``, the CUDA runtime calls that launched them, NVTX ranges for the steps, and the session's
start in Unix time. Rows are read one at a time from SQLite cursors into tm's ``ProfileBuilder``: the export is never
loaded whole. A file that is not such an export, or is damaged, is refused with one line (``ValueError``).
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from trainmeter_core.api import ProfileBuilder, Record

SQLITE_MAGIC = b"SQLite format 3\x00"
NEEDED = ("StringIds", "CUPTI_ACTIVITY_KIND_KERNEL")
#: NVTX range event types (NVIDIA's ENUM_NSYS_EVENT_TYPE): push/pop and start/end ranges.
NVTX_RANGES = (59, 60)
#: A step range's text: "ProfilerStep#12" (torch.profiler's emit_nvtx), "step 12", "iteration 12", "train_step_12".
STEP_TEXT = re.compile(r"(?:ProfilerStep\s*#\s*|\bstep[\s_#:=]*|\biteration[\s_#:=]*)(\d+)", re.IGNORECASE)
#: CUPTI_ActivityMemcpyKind, for the names of copies ("Memcpy HtoD", ...).
COPY_KINDS = {
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
}


def _pid(global_id: int | None) -> int | None:
    """The process of a serialized ``globalPid``/``globalTid`` (the pid sits in bits 24 to 47)."""
    if global_id is None:
        return None
    return (global_id >> 24) & 0xFFFFFF


class NsysImporter:
    """``tm import RUN report.sqlite``: one profiled process (the one that ran most kernels) per export."""

    name = "nsys"
    profiler = "nsight-systems"

    def can_read(self, path: Path) -> bool:
        try:
            if not path.is_file():
                return False
            with open(path, "rb") as f:
                if f.read(16) != SQLITE_MAGIC:
                    return False
            with _connect(path) as db:
                tables = _tables(db)
        except (OSError, sqlite3.Error):
            return False
        return all(t in tables for t in NEEDED)

    def read(self, path: Path, run: Mapping[str, Any]) -> Iterator[Record]:
        try:
            with _connect(path) as db:
                records = list(self._read(db, path, run))
        except sqlite3.Error as exc:
            raise ValueError(f"{path.name}: not a readable Nsight Systems export ({exc})") from None
        yield from records

    def _read(self, db: sqlite3.Connection, path: Path, run: Mapping[str, Any]) -> Iterator[Record]:
        tables = _tables(db)
        missing = [t for t in NEEDED if t not in tables]
        if missing:
            raise ValueError(f"{path.name}: no table {', '.join(missing)}: not an export of a CUDA trace")
        names = dict(db.execute("SELECT id, value FROM StringIds"))
        pids: Counter[int] = Counter()
        devices: Counter[int] = Counter()
        for global_pid, count in db.execute(
            "SELECT globalPid, COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY globalPid"
        ):
            if global_pid is not None:
                pids[_pid(global_pid)] += count
        pid = pids.most_common(1)[0][0] if pids else None
        builder = ProfileBuilder(time_unit_s=1e-9)
        first = None
        for start, end, device, stream, corr, gpid, name_id in db.execute(
            "SELECT start, end, deviceId, streamId, correlationId, globalPid, demangledName "
            "FROM CUPTI_ACTIVITY_KIND_KERNEL"
        ):
            if pid is not None and _pid(gpid) != pid:
                continue
            builder.add_kernel(
                start, end, names.get(name_id, f"kernel {name_id}"), stream=stream, correlation=corr
            )
            devices[device] += 1
            first = start if first is None or start < first else first
        if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
            for start, end, stream, corr, gpid, kind, moved in db.execute(
                "SELECT start, end, streamId, correlationId, globalPid, copyKind, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY"
            ):
                if pid is None or _pid(gpid) == pid:
                    name = f"Memcpy {COPY_KINDS.get(kind, 'Unknown')}"
                    builder.add_kernel(
                        start,
                        end,
                        name,
                        category="gpu_memcpy",
                        stream=stream,
                        correlation=corr,
                        moved_b=moved,
                    )
        if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
            for start, end, stream, corr, gpid, moved in db.execute(
                "SELECT start, end, streamId, correlationId, globalPid, bytes FROM CUPTI_ACTIVITY_KIND_MEMSET"
            ):
                if pid is None or _pid(gpid) == pid:
                    builder.add_kernel(
                        start,
                        end,
                        "Memset",
                        category="gpu_memset",
                        stream=stream,
                        correlation=corr,
                        moved_b=moved,
                    )
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
            for start, end, corr, gtid in db.execute(
                "SELECT start, end, correlationId, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME"
            ):
                if pid is None or _pid(gtid) == pid:
                    builder.add_runtime(start, end, corr)
        if "NVTX_EVENTS" in tables:
            for start, end, text, text_id, gtid in db.execute(
                "SELECT start, end, text, textId, globalTid FROM NVTX_EVENTS WHERE eventType IN (?, ?)",
                NVTX_RANGES,
            ):
                if end is None or (pid is not None and _pid(gtid) != pid):
                    continue
                label = text if text is not None else names.get(text_id, "")
                match = STEP_TEXT.search(label or "")
                if match:
                    builder.add_step(int(match.group(1)), start, end)
                    builder.add_step_mark(label, start)
        if builder.empty:
            raise ValueError(f"{path.name}: the export holds no GPU activity")
        offset, why = _session_start(db, tables)
        host = _hostname(db, tables)
        device = devices.most_common(1)[0][0] if devices else None
        identity = f"{path.name}|{path.stat().st_size}|{pid}|{first}"
        yield from builder.records(
            importer=self.name,
            file=str(path),
            profiler=self.profiler,
            trace_id=hashlib.sha1(identity.encode()).hexdigest()[:16],
            wall_offset_s=offset,
            wall_absent=why,
            host=host,
            pid=pid,
            device=f"{host or run.get('host') or ''}/gpu{device}" if device is not None else None,
            notes=[] if builder.steps() else ["no NVTX step range: the whole capture is one window"],
        )


def _connect(path: Path) -> sqlite3.Connection:
    # Read-only: the export is the user's file, and tm never writes anything but the run's log.
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _tables(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _session_start(db: sqlite3.Connection, tables: set[str]) -> tuple[float | None, str | None]:
    """Seconds to add to an export time (ns since the session started) × 1e-9 for Unix time."""
    if "TARGET_INFO_SESSION_START_TIME" in tables:
        row = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        if row and isinstance(row[0], int) and row[0] > 0:
            return row[0] / 1e9, None
    return (
        None,
        "the export has no session start time (TARGET_INFO_SESSION_START_TIME): it cannot be put on the run's clock",
    )


def _hostname(db: sqlite3.Connection, tables: set[str]) -> str:
    if "TARGET_INFO_SYSTEM_ENV" in tables:
        row = db.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'").fetchone()
        if row and isinstance(row[0], str):
            return row[0]
    return ""
