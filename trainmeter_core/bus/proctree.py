"""A run's process tree read from ``/proc``: who belongs to the run, their CPU time, memory and I/O, their ancestors.

It only reads ``/proc``; it never signals, traces or slows a process. The tree is walked again only when a process was
created somewhere (the last pid in ``/proc/loadavg`` moved); a stable tree costs one read per process and field.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
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


def read_stat(pid: int, proc: str = "/proc") -> ProcStat | None:
    """One process's ``stat``, or None if it is gone (or a zombie, which uses nothing any more)."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
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


def read_rss_b(pid: int, proc: str = "/proc") -> int | None:
    try:
        with open(f"{proc}/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_B
    except (OSError, IndexError, ValueError):
        return None


def read_io_b(pid: int, proc: str = "/proc") -> tuple[int, int] | None:
    """(bytes read, bytes written) from storage, cumulative; None when ``io`` is not readable (another user's)."""
    try:
        with open(f"{proc}/{pid}/io", "rb") as f:
            text = f.read()
    except OSError:
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


def last_pid(proc: str = "/proc") -> int | None:
    """The last pid the kernel handed out in this pid namespace (the fifth field of ``/proc/loadavg``)."""
    try:
        with open(f"{proc}/loadavg", "rb") as f:
            return int(f.read().split()[4])
    except (OSError, IndexError, ValueError):
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
        self, root: int, proc: str = "/proc", last_pid_reader: Callable[[], int | None] | None = None
    ):
        self.root = root
        self.proc = proc
        self._last_pid = last_pid_reader or (lambda: last_pid(proc))
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
            stat = read_stat(pid, self.proc)
            if stat is not None:
                stats[pid] = stat
        self.pids = set(stats)
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
