"""Importing profiler results into a run: the importer for each file, every record read and checked before any is
written, the profiled steps mapped to the run's steps by wall time, and the records put into the run log through the
hub (a live run's own hub; a finished run's log reopened as a new segment, under the run's lock, then its
``summary.json`` and passport rewritten).

Anything refused is one line (``ImportRefused``) and then nothing is written: a file no importer reads, a file cut
short or damaged, a trace from another run (unless forced). An importer's own failure is refused the same way; it
never reaches the user as a traceback, and never leaves half an import in the log.
"""

from __future__ import annotations

import json
import os
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmeter_core.model import records
from trainmeter_core.runlog import reader, rundir, tail

#: How far outside the run's own time a trace may start and still be the run's (clocks, the profiler's start-up).
CLOCK_SLACK_S = 5.0
#: Records sent to a live hub per batch.
BATCH = 200


class ImportRefused(Exception):
    """Why nothing was imported, in one line the user can act on (exit status 2)."""


@dataclass
class Importer:
    name: str
    plugin: str
    obj: Any


@dataclass
class Prepared:
    """What an import will write, and what it skipped (the end of a run skips other runs' traces quietly)."""

    records: list[records.ProfileImport] = field(default_factory=list)
    files: list[tuple[Path, str, int]] = field(default_factory=list)  # (file, importer, records)
    skipped: list[str] = field(default_factory=list)

    @property
    def traces(self) -> list[records.ProfileImport]:
        return [r for r in self.records if r.scope == "trace"]


def load_importers(plugins) -> tuple[list[Importer], list[str]]:
    """The importers the plugins offer (``trainmeter_profiler_importers``), first name wins; and one line for each
    plugin whose hook failed or whose answer is not an importer (reported and skipped, never fatal)."""
    found: list[Importer] = []
    problems: list[str] = []
    errors_before = len(plugins.errors())
    for plugin_name, answer in plugins.per_plugin("trainmeter_profiler_importers"):
        for obj in answer if isinstance(answer, (list, tuple)) else [answer]:
            name = getattr(obj, "name", None)
            if (
                not isinstance(name, str)
                or not callable(getattr(obj, "can_read", None))
                or not callable(getattr(obj, "read", None))
            ):
                problems.append(
                    f"plugin {plugin_name}: {obj!r} is no profiler importer (name, can_read, read)"
                )
                continue
            if any(i.name == name for i in found):
                problems.append(f"plugin {plugin_name}: importer {name!r} is already offered: ignored")
                continue
            found.append(Importer(name, plugin_name, obj))
    for info in plugins.errors()[errors_before:]:
        problems.append(f"plugin {info.name} not used: {info.error}")
    return found, problems


def _can_read(importer: Importer, path: Path, problems: list[str]) -> bool:
    try:
        return bool(importer.obj.can_read(path))
    except (
        Exception
    ) as exc:  # an importer's can_read must never raise; one that does is skipped for this file
        problems.append(
            f"importer {importer.name} ({importer.plugin}) failed on {path.name}: {type(exc).__name__}"
        )
        return False


def choose(
    paths: Iterable[Path],
    importers: list[Importer],
    *,
    quiet_dirs: bool = False,
    since_wall: float | None = None,
) -> tuple[list[tuple[Path, Importer]], list[str]]:
    """Each file with the first importer that reads it; a folder gives the files in it that some importer reads.

    Raises ``ImportRefused`` for a path that does not exist or a file no importer reads (the line names the
    importers tried). ``quiet_dirs`` (the end of a run) skips a folder with nothing to read instead, and
    ``since_wall`` leaves out files older than the run.
    """
    names = ", ".join(i.name for i in importers) or "none: no importer is installed"
    problems: list[str] = []
    chosen: list[tuple[Path, Importer]] = []
    for path in paths:
        path = Path(path)
        if not path.exists():
            if quiet_dirs:
                continue
            raise ImportRefused(f"{path}: no such file or folder")
        whole = next((i for i in importers if _can_read(i, path, problems)), None)
        if whole is not None:
            chosen.append((path, whole))
            continue
        if path.is_dir():
            found = 0
            try:
                entries = sorted(p for p in path.iterdir() if p.is_file())
            except OSError as exc:
                raise ImportRefused(f"{path}: cannot list it: {exc.strerror or exc}") from None
            for entry in entries:
                if since_wall is not None:
                    try:
                        if entry.stat().st_mtime < since_wall - CLOCK_SLACK_S:
                            continue
                    except OSError:
                        continue
                importer = next((i for i in importers if _can_read(i, entry, problems)), None)
                if importer is not None:
                    chosen.append((entry, importer))
                    found += 1
            if not found and not quiet_dirs:
                raise ImportRefused(f"{path}: holds no file an importer reads (tried: {names})")
            continue
        raise ImportRefused(f"{path}: no importer reads it (tried: {names})")
    return chosen, problems


# ---------------------------------------------------------------------------------------------------------------------
# The run's side: its processes and steps, read from its log


@dataclass
class RunClock:
    """The run's processes and steps as its log has them: what a trace is checked and aligned against."""

    meta: dict[str, Any]
    pids: set[int]
    steps: dict[
        tuple[str, int], tuple[list[float], list[int], int | None]
    ]  # (host, pid) -> walls, steps, rank
    start_wall: float | None
    end_wall: float | None

    @classmethod
    def read(cls, run_dir: Path, live: bool) -> RunClock:
        meta = rundir.read_json(run_dir / "meta.json") or {}
        pids: set[int] = set()
        if isinstance(meta.get("child_pid"), int):
            pids.add(meta["child_pid"])
        by_process: dict[tuple[str, int], list[tuple[float, int, int | None]]] = {}
        for record in reader.read_log(run_dir, kinds={"hello", "step"}):
            if isinstance(record, records.Hello):
                pids.add(record.pid)
            elif isinstance(record, records.Step):
                by_process.setdefault((record.host, record.pid), []).append(
                    (record.wall, record.step, record.rank)
                )
                pids.add(record.pid)
        steps = {}
        for key, entries in by_process.items():
            entries.sort()
            steps[key] = ([e[0] for e in entries], [e[1] for e in entries], entries[-1][2])
        summary = rundir.read_json(run_dir / "summary.json") or {}
        end = None if live else summary.get("end_wall")
        start = meta.get("start_wall")
        return cls(
            meta=meta,
            pids=pids,
            steps=steps,
            start_wall=start if isinstance(start, (int, float)) else None,
            end_wall=end if isinstance(end, (int, float)) else (time.time() if live else None),
        )

    def process(self, host: str, pid: int | None) -> tuple[list[float], list[int], int | None] | None:
        if pid is None:
            return None
        for (h, p), entries in self.steps.items():
            if p == pid and (not host or not h or _same_host(h, host)):
                return entries
        return None


def _same_host(a: str, b: str) -> bool:
    return a.split(".")[0].lower() == b.split(".")[0].lower()


def _when(wall: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall))


def check_identity(trace: records.ProfileImport, clock: RunClock) -> str | None:
    """Why this trace is not the run's (another host, another process, another time), or None."""
    name = Path(trace.file).name
    host = clock.meta.get("host")
    if trace.host and isinstance(host, str) and host and not _same_host(trace.host, host):
        return f"{name} was recorded on {trace.host}, and this run ran on {host}"
    if trace.traced_pid is not None and clock.pids and trace.traced_pid not in clock.pids:
        known = ", ".join(str(p) for p in sorted(clock.pids)[:6])
        return f"{name} comes from process {trace.traced_pid}, which is none of this run's ({known})"
    start = trace.window_start_wall
    if start is not None and clock.start_wall is not None:
        late = clock.end_wall is not None and start > clock.end_wall + CLOCK_SLACK_S
        if start < clock.start_wall - CLOCK_SLACK_S or late:
            until = _when(clock.end_wall) if clock.end_wall is not None else "now"
            return f"{name} starts at {_when(start)}, outside this run ({_when(clock.start_wall)} to {until})"
    return None


def align(profile_records: list[records.ProfileImport], clock: RunClock) -> None:
    """Give each profiled step the run's step whose step record was sent inside it (the optimizer step of that
    iteration), from the same process; say why where none is; fill the trace's list of steps and its rank."""
    trace = profile_records[-1]
    process = clock.process(trace.host, trace.traced_pid)
    if trace.rank is None and process is not None and process[2] is not None:
        rank = process[2]
        for record in profile_records:
            record.rank = rank
    steps: list[int] = []
    for record in profile_records:
        if record.scope != "step" or "step" in record.absent:
            continue
        label = f"ProfilerStep#{record.profiler_step}"
        if record.step_start_wall is None or record.step_end_wall is None:
            record.absent = {**record.absent, "step": f"{label} has no wall time"}
            continue
        if process is None:
            record.absent = {
                **record.absent,
                "step": f"no step record of process {trace.traced_pid} in the run's log to align {label} with",
            }
            continue
        walls, numbers, _ = process
        lo = bisect_left(walls, record.step_start_wall)
        hi = bisect_right(walls, record.step_end_wall)
        if hi <= lo:
            record.absent = {
                **record.absent,
                "step": f"no step of process {trace.traced_pid} ended inside {label} ({_when(record.step_start_wall)})",
            }
            continue
        record.step = numbers[
            hi - 1
        ]  # several (the profiler stepped less often than the optimizer): the last
        steps.append(record.step)
    trace.steps = steps


def prepare(
    run_dir: Path,
    found: list[tuple[Path, Importer]],
    *,
    live: bool,
    force: bool = False,
    foreign: str = "refuse",
    say: Callable[[str], None] = lambda line: None,
    clock: RunClock | None = None,
) -> Prepared:
    """Read every file and check every record, writing nothing. ``foreign``: "refuse" (``tm import``) or "skip"
    (the end of a run: a folder may hold older runs' traces). Raises ``ImportRefused``."""
    clock = clock if clock is not None else RunClock.read(run_dir, live)
    meta = clock.meta
    out = Prepared()
    for path, importer in found:
        try:
            profile_records = list(importer.obj.read(path, meta))
        except ValueError as exc:
            raise ImportRefused(_one_line(str(exc)) or f"{path.name}: refused by {importer.name}") from None
        except Exception as exc:  # an importer's bug: refused like a bad file, with what it said
            raise ImportRefused(
                f"importer {importer.name} ({importer.plugin}) failed on {path.name}: {type(exc).__name__}: "
                f"{_one_line(str(exc))}"
            ) from None
        kept = _check_records(profile_records, path, importer)
        why = None
        for trace_index in [i for i, r in enumerate(kept) if r.scope == "trace"]:
            why = why or (None if force else check_identity(kept[trace_index], clock))
        if why is not None:
            if foreign == "skip":
                out.skipped.append(why)
                continue
            raise ImportRefused(f"{why}: pass --force to import it anyway")
        start = 0
        for i, record in enumerate(kept):
            if record.scope == "trace":
                align(kept[start : i + 1], clock)
                start = i + 1
            if not record.host and isinstance(meta.get("host"), str):
                record.host = meta["host"]
        out.records.extend(kept)
        out.files.append((path, importer.name, len(kept)))
    return out


def _check_records(profile_records: list, path: Path, importer: Importer) -> list[records.ProfileImport]:
    """Only ``profile.import`` records that the hub will take, ending with a trace record."""
    kept: list[records.ProfileImport] = []
    for record in profile_records:
        if not isinstance(record, records.ProfileImport):
            raise ImportRefused(
                f"importer {importer.name} gave a {type(record).__name__} for {path.name}: only profile.import records"
            )
        record.importer = record.importer or importer.name
        try:
            records.check(records.encode(record))
        except (records.MalformedRecord, TypeError, ValueError) as exc:
            raise ImportRefused(
                f"importer {importer.name} gave a malformed record for {path.name}: {exc}"
            ) from None
        kept.append(record)
    if not kept:
        raise ImportRefused(f"{path.name}: {importer.name} found nothing to import in it")
    if kept[-1].scope != "trace":
        raise ImportRefused(f"importer {importer.name} gave no trace record for {path.name}")
    return kept


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


# ---------------------------------------------------------------------------------------------------------------------
# Writing


def send_live(run_dir: Path, profile_records: list[records.ProfileImport]) -> None:
    """Into a live run: through its hub, as any producer sends."""
    from trainmeter_core.bus.client import Producer, read_endpoints

    try:
        endpoint = read_endpoints(run_dir)["in"]
    except (OSError, ValueError, KeyError) as exc:
        raise ImportRefused(
            f"{run_dir.name} is running but its endpoints.json cannot be read: {exc}"
        ) from None
    producer = Producer(endpoint, "import")
    for i in range(0, len(profile_records), BATCH):
        producer.send_many(list(profile_records[i : i + BATCH]))
    producer.close(linger_ms=10_000)
    if producer.dropped:
        raise ImportRefused(
            f"the run's hub took {producer.sent} of {len(records)} records ({producer.error or 'its queue was full'})"
        )


def write_finished(run_dir: Path, imports: list[records.ProfileImport], say: Callable[[str], None]) -> bool:
    """Into a finished run: its log reopened as a new segment through a hub of our own, under the run's lock, then
    ``summary.json`` and the passport rewritten. False when the run turned out to be live (nothing written)."""
    from trainmeter_core.bus.hub import Hub
    from trainmeter_core.runlog.recorder import Recorder, segment_name

    lock = rundir.RunLock(run_dir)
    try:
        lock.acquire()
    except BlockingIOError:
        lock.release()
        return False
    sockets = None
    try:
        last = tail.last_seq(run_dir) or 0
        segments = reader.segments(run_dir)
        number = max((_segment_number(p) for p in segments), default=0) + 1
        recorder = Recorder(run_dir, first_segment=number, warn=say)
        sockets = rundir.SocketDir.create(rundir.socket_base())
        hub = Hub(
            sockets.endpoint("in"),
            sockets.endpoint("out"),
            recorder,
            tick_s=1e5,
            stats_every_s=1e5,
            after_seq=last,
        )
        recorder.start()
        hub.start()
        for record in imports:
            hub.inject(record)
        hub.stop()
        recorder.close()
        written = hub.seq - last  # the hub numbers every record it takes in, on from the log's last
        problem = recorder.error or hub.error or (hub.malformed and "a record was refused")
        if not problem and written != len(imports):
            problem = f"{written} of {len(records)} records reached the log"
        if problem:
            (run_dir / segment_name(number)).unlink(missing_ok=True)  # the segment holds this import alone
            raise ImportRefused(f"cannot write the run log of {run_dir.name}: {problem}")
        rewrite_summary(run_dir, len(imports), say)
    finally:
        if sockets is not None:
            sockets.remove()
        lock.release()
    return True


def _segment_number(path: Path) -> int:
    try:
        return int(path.name.split("-", 1)[1].split(".", 1)[0])
    except (IndexError, ValueError):
        return 0


def rewrite_summary(run_dir: Path, imported: int, say: Callable[[str], None]) -> None:
    """The run's final numbers again (its checkpoint and the log after it, the import included) into
    ``summary.json`` and the passport; the launcher wrote them at the end, ``tm import`` rewrites them since."""
    from trainmeter_core.run.summary import write_passport
    from trainmeter_core.runlog import replay

    snapshot = replay.final_snapshot(run_dir)
    summary = rundir.read_json(run_dir / "summary.json") or {"state": "finished"}
    if snapshot is not None:
        summary["snapshot"] = records.to_builtins(snapshot)
    kinds = summary.get("records")
    if isinstance(kinds, dict):
        kinds["profile.import"] = int(kinds.get("profile.import", 0) or 0) + imported
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    os.replace(tmp, run_dir / "summary.json")
    write_passport(run_dir, snapshot, say)


def describe(trace: records.ProfileImport) -> str:
    """One line for a trace imported: where its GPU time went."""
    who = f"rank {trace.rank}" if trace.rank is not None else "process"
    steps = ""
    if trace.profiler_steps:
        first, last = trace.profiler_steps[0], trace.profiler_steps[-1]
        steps = f" ProfilerStep#{first}" + (f"-{last}" if last != first else "")
        if trace.steps:
            a, b = trace.steps[0], trace.steps[-1]
            steps += f" = step {a}" + (f"-{b}" if b != a else "")
    window = trace.window_s or 0.0
    if trace.split_s and window > 0:
        parts = ", ".join(
            f"{name.replace('_', ' ')} {value / window:.0%}"
            for name, value in trace.split_s.items()
            if value / window >= 0.005
        )
        body = f"{window * 1e3:.1f} ms: {parts}"
    else:
        body = trace.absent.get("split_s", "no GPU time")
    return f"{who}{steps}: {body} ({Path(trace.file).name})"


def import_at_end(
    run_dir: Path,
    folders: list[str],
    inject: Callable[[records.Record], None],
    plugins,
    since_wall: float,
    say: Callable[[str], None],
) -> int:
    """The launcher, when the training process has ended: the traces torch.profiler wrote during the run (in the
    folders the agent saw, and those of ``--profile-dir``) into the run through its hub, before ``run.end``.

    Each file on its own: one that cannot be read, or that belongs to another run, is skipped with one line, and the
    run's end goes on. Returns the number of traces imported.
    """
    importers, problems = load_importers(plugins)
    for line in problems:
        say(line)
    found, problems = choose([Path(f) for f in folders], importers, quiet_dirs=True, since_wall=since_wall)
    for line in problems:
        say(line)
    if not found:
        return 0
    clock = RunClock.read(run_dir, live=True)
    imported = 0
    skipped: list[str] = []
    for path, importer in found:
        try:
            prepared = prepare(run_dir, [(path, importer)], live=True, foreign="skip", clock=clock)
        except ImportRefused as exc:
            say(f"profiler trace not imported: {exc}")
            continue
        skipped.extend(prepared.skipped)
        for record in prepared.records:
            inject(record)
        for trace in prepared.traces:
            say(f"profile imported: {describe(trace)}")
            imported += 1
    if skipped:
        say(
            f"{len(skipped)} trace(s) in {', '.join(folders)} are another run's, left alone (e.g. {skipped[0]})"
        )
    return imported
