"""A run's process tree read from ``/proc``: who belongs to the run, their CPU time, memory and I/O, their ancestors.

It only reads ``/proc``; it never signals, traces or slows a process. The tree is walked again only when a process was
created somewhere (the last pid in ``/proc/loadavg`` moved); a stable tree costs one read per process and field.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_B = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcStat:
    name: str
    ppid: int
    cpu_s: float
    threads: int
    state: str
    start_ticks: (
        int  # when it started, in clock ticks since boot: with the pid, it names one process for good
    )


#: What ``KeptFiles.read`` asks for in one ``pread``; a larger file takes more.
_CHUNK_B = 65536


class KeptFiles:
    """Files of ``/proc`` and ``/sys`` that a sampler reads again and again, each kept open and read from its start by
    ``os.pread``: procfs and sysfs make a file's contents afresh at each read from offset 0. Opening and closing ten
    such files cost a beat 0.44 ms of CPU after a second's sleep, reading them this way 0.19 ms (docs/performance.md,
    "The host sampler's beat"). A file kept for a process reads as gone once that process is, never as another's
    that took its pid. A file that cannot be opened or read gives None and is closed; the next read opens it again,
    at once or, with ``retry_s``, once that long has passed (a path that is missing for good is not looked up on
    every beat)."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._groups: dict[str, int | None] = {}
        self._missing: dict[str, float] = {}

    def read(self, path: str, group: int | None = None, retry_s: float | None = None) -> bytes | None:
        """The file's contents now, or None; ``group`` (a pid, say) lets ``keep_groups`` close it later."""
        fd = self._fds.get(path)
        if fd is None:
            if retry_s is not None and time.monotonic() < self._missing.get(path, -math.inf):
                return None
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                if retry_s is not None:
                    self._missing[path] = time.monotonic() + retry_s
                return None
            self._missing.pop(path, None)
            self._fds[path], self._groups[path] = fd, group
        try:
            data = os.pread(fd, _CHUNK_B, 0)
            if len(data) == _CHUNK_B:
                parts = [data]
                while len(parts[-1]) == _CHUNK_B:
                    parts.append(os.pread(fd, _CHUNK_B, _CHUNK_B * len(parts)))
                data = b"".join(parts)
        except OSError:
            self.forget(path)
            return None
        return data

    def forget(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        self._groups.pop(path, None)
        if fd is not None:
            os.close(fd)

    def keep_groups(self, groups: Container[int]) -> None:
        """Close the files read with a group that ``groups`` does not hold (the pids that left a tree)."""
        for path, group in list(self._groups.items()):
            if group is not None and group not in groups:
                self.forget(path)

    def close(self) -> None:
        for path in list(self._fds):
            self.forget(path)


def _read_bytes(path: str, files: KeptFiles | None, group: int | None = None) -> bytes | None:
    if files is not None:
        return files.read(path, group)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def read_stat(pid: int, proc: str = "/proc", files: KeptFiles | None = None) -> ProcStat | None:
    """One process's ``stat``, or None if it is gone (or a zombie, which uses nothing any more)."""
    data = _read_bytes(f"{proc}/{pid}/stat", files, pid)
    if data is None:
        return None
    # The name sits in parentheses and may itself hold spaces or parentheses: split at the last ')'.
    close = data.rfind(b")")
    fields = data[close + 2 :].split()
    if len(fields) < 20:
        return None
    state = fields[0].decode(errors="replace")
    if state in ("Z", "X"):
        return None
    return ProcStat(
        name=data[data.find(b"(") + 1 : close].decode(errors="replace"),
        ppid=int(fields[1]),
        cpu_s=(int(fields[11]) + int(fields[12])) / CLOCK_TICKS,
        threads=int(fields[17]),
        state=state,
        start_ticks=int(fields[19]),
    )


def read_rss_b(pid: int, proc: str = "/proc", files: KeptFiles | None = None) -> int | None:
    data = _read_bytes(f"{proc}/{pid}/statm", files, pid)
    try:
        return int(data.split()[1]) * PAGE_B if data is not None else None
    except (IndexError, ValueError):
        return None


def read_io_b(pid: int, proc: str = "/proc", files: KeptFiles | None = None) -> tuple[int, int] | None:
    """(bytes read, bytes written) from storage, cumulative; None when ``io`` is not readable (another user's)."""
    text = _read_bytes(f"{proc}/{pid}/io", files, pid)
    if text is None:
        return None
    values = {}
    for line in text.splitlines():
        key, _, number = line.partition(b":")
        values[key] = number.strip()
    try:
        return int(values[b"read_bytes"]), int(values[b"write_bytes"])
    except (KeyError, ValueError):
        return None


def read_environ(pid: int, proc: str = "/proc") -> dict[str, str] | None:
    """A process's environment at its start, or None when it is not ours to read."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def read_cmdline(pid: int, proc: str = "/proc") -> list[str] | None:
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in data.split(b"\0") if part]


def last_pid(proc: str = "/proc", files: KeptFiles | None = None) -> int | None:
    """The last pid the kernel handed out in this pid namespace (the fifth field of ``/proc/loadavg``)."""
    data = _read_bytes(f"{proc}/loadavg", files)
    try:
        return int(data.split()[4]) if data is not None else None
    except (IndexError, ValueError):
        return None


def ancestors(pid: int, proc: str = "/proc") -> Iterator[int]:
    """The parents of ``pid`` up to (not including) pid 1."""
    seen = {pid}
    stat = read_stat(pid, proc)
    while stat is not None and stat.ppid > 1 and stat.ppid not in seen:
        seen.add(stat.ppid)
        yield stat.ppid
        stat = read_stat(stat.ppid, proc)


def _children(pid: int, proc: str) -> list[int] | None:
    """Children of every thread of ``pid`` (``/proc/PID/task/TID/children``), or None where the kernel lacks it."""
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tids:
        try:
            with open(f"{proc}/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(x) for x in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"{proc}/{pid}/task/{tid}"):
                continue  # the thread just ended
            return None  # CONFIG_PROC_CHILDREN is off: the caller scans /proc instead
        except (OSError, ValueError):
            continue
    return found


class ProcessTree:
    """The processes under ``root`` (itself included), kept current at the cost of the tree, not of ``/proc``."""

    def __init__(
        self,
        root: int,
        proc: str = "/proc",
        last_pid_reader: Callable[[], int | None] | None = None,
        files: KeptFiles | None = None,
    ):
        self.root = root
        self.proc = proc
        #: Where ``refresh`` reads each process's ``stat`` and the last pid (kept open), when given
        self.files = files
        self._last_pid = last_pid_reader or (lambda: last_pid(proc, files))
        self._seen_last_pid: int | None = None
        self.pids: set[int] = set()
        self.walks = 0  # how many times the tree was walked from the root (the benchmark and tests read it)

    def refresh(self) -> dict[int, ProcStat]:
        """Every live process of the run and its ``stat``; an empty dict once the root and its tree are gone."""
        newest = self._last_pid()
        if newest is None or newest != self._seen_last_pid or not self.pids:
            self._walk()
            self._seen_last_pid = newest
        stats = {}
        for pid in sorted(self.pids):
            stat = read_stat(pid, self.proc, self.files)
            if stat is not None:
                stats[pid] = stat
        self.pids = set(stats)
        if self.files is not None:
            self.files.keep_groups(self.pids)  # the files of processes that left the tree are closed
        return stats

    def _walk(self) -> None:
        self.walks += 1
        if read_stat(self.root, self.proc) is None:
            # The root is gone; its orphans (reparented away) are still the run's while they live.
            self.pids = {pid for pid in self.pids if read_stat(pid, self.proc) is not None}
            return
        found = {self.root}
        todo = [self.root]
        while todo:
            children = _children(todo.pop(), self.proc)
            if children is None:
                found = self._scan()
                break
            for child in children:
                if child not in found:
                    found.add(child)
                    todo.append(child)
        # Processes the run started whose parent died were reparented out of the tree: still the run's.
        self.pids = found | {pid for pid in self.pids if read_stat(pid, self.proc) is not None}

    def _scan(self) -> set[int]:
        parents: dict[int, list[int]] = {}
        for entry in os.listdir(self.proc):
            if entry.isdigit():
                stat = read_stat(int(entry), self.proc)
                if stat is not None:
                    parents.setdefault(stat.ppid, []).append(int(entry))
        found = {self.root}
        todo = [self.root]
        while todo:
            for child in parents.get(todo.pop(), ()):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        return found
