"""The host sampler: the run's process tree (CPU cores busy, resident memory, threads, storage I/O, process count, the
busiest processes) and the node (``node.NodeReader``), once per ``TM_HOST_INTERVAL_S`` (default 1 s).

It reads /proc only; it never signals, traces or slows a process of the run. Checkpoint folders come from the
``phase`` records the agent sends, so the disk that must hold the next checkpoint is the one it watches.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from trainmeter_core.bus.component import Component, ComponentContext
from trainmeter_core.bus.proctree import KeptFiles, ProcessTree, ProcStat, read_io_b, read_rss_b
from trainmeter_core.model import records
from trainmeter_core.model.platform_adapters import FIRST_SAMPLE
from trainmeter_sources.node import NodeReader
from trainmeter_sources.sampling_interval import interval_from_env

INTERVAL_ENV = "TM_HOST_INTERVAL_S"
TOP_PROCESSES = 5
SHM = "/dev/shm"
#: The agent's fact naming the folders a training process wrote checkpoints to (trainmeter_agent/_phases.py).
CHECKPOINT_FOLDERS_FACT = "checkpoint.folders"


@dataclass
class TreeSampler:
    """Turns successive reads of a process tree into ``sample.host`` records (rates over the window between them)."""

    root: int
    tree: ProcessTree
    _cpu_s: dict[int, float] = field(default_factory=dict)
    _io_b: dict[int, tuple[int, int]] = field(default_factory=dict)
    _t: float | None = None

    @classmethod
    def for_root(cls, root: int, proc: str = "/proc") -> TreeSampler:
        """A sampler of ``root``'s tree that keeps the files it reads each beat open (``KeptFiles``)."""
        return cls(root, ProcessTree(root, proc, files=KeptFiles()))

    def sample(self, now_t: float) -> records.SampleHost | None:
        """The tree now; None once every process of it is gone."""
        stats = self.tree.refresh()
        if not stats:
            return None
        proc = self.tree.proc
        window_s = now_t - self._t if self._t is not None and now_t > self._t else None
        record = records.SampleHost(root_pid=self.root, procs=len(stats), t=now_t)
        absent: dict[str, str] = {}
        record.threads = sum(s.threads for s in stats.values())
        files = self.tree.files
        # A process reads 0 once it has let its memory go on its way out (one that exited between its stat and its
        # statm, read through a file kept open, or one in its exit): unknown, never nothing. Every process of a run
        # holds pages while it lives.
        rss = {pid: read_rss_b(pid, proc, files) or None for pid in stats}
        known = [r for r in rss.values() if r is not None]
        if known:
            record.rss_b = sum(known)
        else:
            absent["rss_b"] = (
                "no process of the tree had memory to read (each was exiting, or its statm unreadable)"
            )
        io = {pid: read_io_b(pid, proc, files) for pid in stats}
        cores: dict[int, float] = {}
        if window_s is None:
            for name in ("cpu_cores", "window_s", "io_read_bps", "io_write_bps"):
                absent[name] = FIRST_SAMPLE
        else:
            record.window_s = window_s
            # A process born inside the window counts from its birth: its whole CPU time is in the window.
            cores = {
                pid: max(0.0, s.cpu_s - self._cpu_s.get(pid, 0.0)) / window_s for pid, s in stats.items()
            }
            record.cpu_cores = sum(cores.values())
            readable = {pid: b for pid, b in io.items() if b is not None}
            if readable:
                read_b = sum(max(0, b[0] - self._io_b.get(pid, b)[0]) for pid, b in readable.items())
                write_b = sum(max(0, b[1] - self._io_b.get(pid, b)[1]) for pid, b in readable.items())
                record.io_read_bps = read_b / window_s
                record.io_write_bps = write_b / window_s
            else:
                absent["io_read_bps"] = absent["io_write_bps"] = "no permission to read /proc/PID/io"
        record.top = _top(stats, cores, rss)
        record.absent = absent
        self._cpu_s = {pid: s.cpu_s for pid, s in stats.items()}
        self._io_b = {pid: b for pid, b in io.items() if b is not None}
        self._t = now_t
        return record


def _top(
    stats: dict[int, ProcStat], cores: dict[int, float], rss: dict[int, int | None]
) -> list[records.ProcessStat]:
    ranked = sorted(stats, key=lambda pid: (-(cores.get(pid) or 0.0), -(rss.get(pid) or 0), pid))
    return [
        records.ProcessStat(pid=pid, name=stats[pid].name, cpu_cores=cores.get(pid), rss_b=rss.get(pid))
        for pid in ranked[:TOP_PROCESSES]
    ]


class HostSampler(Component):
    """Samples the training command's process tree and the node (``TM_HOST_INTERVAL_S`` changes the 1 s)."""

    name = "host"
    shared = True
    # The folders a training process wrote checkpoints to (its agent's "checkpoint.folders" fact), so their
    # filesystems are watched.
    subscribes = ("fact",)

    def run(self, ctx: ComponentContext) -> None:
        interval_s, note = interval_from_env(INTERVAL_ENV, 1.0)
        if note:
            ctx.publish(records.Notice(level="warning", topic="host", message=note))
        root = ctx.child_pid
        tree = TreeSampler.for_root(root) if root else None
        node = NodeReader()
        paths: dict[str, list[str]] = {"run": [str(ctx.run_dir)], "checkpoints": [], "shm": [SHM]}
        try:
            next_t = time.monotonic()
            while not ctx.stopping.is_set():
                now_t = time.monotonic()
                batch: list[records.Record] = []
                if tree is not None:
                    record = tree.sample(now_t)
                    if record is not None:
                        batch.append(record)
                sample = node.read(
                    now_t, paths, cgroup_pid=root if root and os.path.exists(f"/proc/{root}") else "self"
                )
                sample.t = now_t
                batch.append(sample)
                # One message for both: the hub wakes once a second for them, not twice (on a virtual machine a
                # wake costs 0.1 to 0.3 ms of CPU, docs/performance.md "Windows of a second").
                ctx.publish_many(batch)
                next_t += interval_s
                if next_t < time.monotonic():
                    next_t = time.monotonic() + interval_s
                self._wait(ctx, next_t, paths)
        finally:
            node.close()  # the files it kept open
            if tree is not None and tree.tree.files is not None:
                tree.tree.files.close()

    @staticmethod
    def _wait(ctx: ComponentContext, until_t: float, paths: dict[str, list[str]]) -> None:
        """Wait for the next beat, noting the folders of checkpoints the run writes meanwhile."""
        while not ctx.stopping.is_set():
            left_s = until_t - time.monotonic()
            if left_s <= 0:
                return
            record = ctx.recv(left_s)
            if (
                isinstance(record, records.Fact)
                and record.name == CHECKPOINT_FOLDERS_FACT
                and isinstance(record.value, list)
            ):
                for folder in record.value:
                    if (
                        isinstance(folder, str)
                        and os.path.isabs(folder)
                        and folder not in paths["checkpoints"]
                    ):
                        paths["checkpoints"].append(folder)
