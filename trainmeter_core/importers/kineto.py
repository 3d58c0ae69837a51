"""tm's built-in profiler importer: PyTorch profiler (Kineto) Chrome traces, ``.json`` or ``.json.gz``, one per rank.

It reads the file as a stream (``jsonstream``) into the pure analysis (``model.profiles``) and yields the records:
one per profiled step and one for the trace. It never writes anything and never loads a trace whole; a file it
cannot read completely raises ``ValueError`` (``TraceError``) with one line, so nothing of it is imported.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from trainmeter_core.importers.jsonstream import TraceError, TraceReader, open_trace
from trainmeter_core.model import records
from trainmeter_core.model.profiles.builder import NO_FLOP
from trainmeter_core.model.profiles.kineto import Event, KinetoTrace

#: tensorboard_trace_handler's file names: ``<host>_<pid>.<ms>.pt.trace.json[.gz]`` (its default worker name).
HANDLER_NAME = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.(?P<ms>\d+)\.pt\.trace\.json(?:\.gz)?$")
_SUFFIXES = (".json", ".json.gz")
_SNIFF_B = 64 * 1024


def worker_identity(path: Path) -> tuple[str, int | None]:
    """(host, pid) that tensorboard_trace_handler put in the file's name, or ("", None)."""
    match = HANDLER_NAME.match(path.name)
    if match is None:
        return "", None
    return match.group("host"), int(match.group("pid"))


class KinetoImporter:
    """Reads torch.profiler's Chrome traces (Kineto): ``tm import RUN trace.json`` and the import at a run's end."""

    name = "kineto"
    profiler = "torch.profiler"

    def can_read(self, path: Path) -> bool:
        try:
            if not path.is_file() or not path.name.endswith(_SUFFIXES):
                return False
            with open_trace(path) as f:
                head = f.read(_SNIFF_B)
        except (OSError, EOFError, ValueError):
            return False
        text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
        if text.startswith(b"{"):
            return b'"traceEvents"' in head or b'"schemaVersion"' in head
        return text.startswith(b"[") and b'"ph"' in head

    def read(self, path: Path, run: Mapping[str, Any]) -> Iterator[records.Record]:
        trace = KinetoTrace()
        try:
            with open_trace(path) as f:
                reader = TraceReader(f, Event)
                for item in reader:
                    if item[0] == "events":
                        trace.feed(item[1])
                    else:
                        trace.take(item[1], item[2])
        except TraceError as exc:
            raise TraceError(f"{path.name}: {exc}") from None
        except OSError as exc:
            raise TraceError(f"{path.name}: cannot read it: {exc.strerror or exc}") from None
        if not reader.saw_events:
            raise TraceError(f"{path.name}: no traceEvents: not a Chrome trace")
        builder = trace.finish()
        if builder.empty:
            raise TraceError(f"{path.name}: its traceEvents hold no timed event")
        host, name_pid = worker_identity(path)
        if not host and isinstance(trace.meta.get("host_name"), str):
            host = trace.meta["host_name"]  # newer PyTorch writes the host at the top
        pid = trace.pid if trace.pid is not None else name_pid
        rank = trace.rank
        offset, why = trace.wall_offset()
        notes = []
        skipped = reader.skipped + trace.wrong + builder.skipped
        if skipped:
            notes.append(f"{skipped} events skipped: fields of the wrong type or impossible times")
        device = None
        index = trace.device_index
        if index is not None:
            device = f"{host or run.get('host') or ''}/gpu{index}"
        if trace.device_name:
            notes.append(f"device {trace.device_name}")
        size = path.stat().st_size
        identity = f"{path.name}|{size}|{rank}|{pid}|{builder._first_t!r}"
        trace_id = hashlib.sha1(identity.encode()).hexdigest()[:16]
        yield from builder.records(
            importer=self.name,
            file=str(path),
            profiler=self.profiler,
            trace_id=trace_id,
            wall_offset_s=offset,
            wall_absent=why,
            rank=rank,
            host=host,
            pid=pid,
            device=device,
            world_size=trace.world_size,
            notes=notes,
            flop_absent=(
                "the profiler was asked for FLOPs (with_flops=True) but no op in the trace carries a count"
                if trace.meta.get("with_flops")
                else NO_FLOP
            ),
        )
