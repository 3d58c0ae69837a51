"""The host sampler: the run's process tree (CPU cores busy, resident memory, process count) once a second.

It reads /proc only; it never signals, traces or slows a process of the run. The node-wide view (CPU split, memory,
disks, network, filesystems) completes it in the sources issue.
"""

from __future__ import annotations

import os
import time

from trainmeter_core import records as rec
from trainmeter_core.component import Component, ComponentContext

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_B = os.sysconf("SC_PAGE_SIZE")


def read_stat(pid: int) -> tuple[str, int, float, int] | None:
    """(name, ppid, CPU seconds used, threads) of one process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The name sits in parentheses and may itself contain spaces or parentheses: split at the last ')'.
    close = data.rfind(b")")
    name = data[data.find(b"(") + 1 : close].decode(errors="replace")
    fields = data[close + 2 :].split()
    ppid = int(fields[1])
    cpu_s = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    threads = int(fields[17])
    return name, ppid, cpu_s, threads


def read_rss_b(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_B
    except (OSError, IndexError, ValueError):
        return None


def process_tree(root: int) -> dict[int, tuple[str, int, float, int]]:
    """Every live process under ``root`` (itself included), by a scan of /proc."""
    stats: dict[int, tuple[str, int, float, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = read_stat(int(entry))
            if stat is not None:
                stats[int(entry)] = stat
    children: dict[int, list[int]] = {}
    for pid, stat in stats.items():
        children.setdefault(stat[1], []).append(pid)
    tree: dict[int, tuple[str, int, float, int]] = {}
    todo = [root] if root in stats else []
    while todo:
        pid = todo.pop()
        tree[pid] = stats[pid]
        todo.extend(children.get(pid, ()))
    return tree


class HostSampler(Component):
    """Samples the training command's process tree at 1 Hz (``TM_HOST_INTERVAL_S`` changes it)."""

    name = "host"
    shared = True

    def run(self, ctx: ComponentContext) -> None:
        interval_s = float(os.environ.get("TM_HOST_INTERVAL_S", "1.0"))
        root = ctx.child_pid
        if root is None:
            return
        previous_cpu: dict[int, float] = {}
        previous_t: float | None = None
        while not ctx.stopping.wait(interval_s if previous_t is not None else 0):
            now = time.monotonic()
            tree = process_tree(root)
            if not tree:
                previous_t = now
                continue
            window_s = None if previous_t is None else now - previous_t
            cpu_cores = None
            if window_s:
                used = sum(max(0.0, stat[2] - previous_cpu.get(pid, stat[2])) for pid, stat in tree.items())
                cpu_cores = used / window_s
            rss = [read_rss_b(pid) for pid in tree]
            record = rec.SampleHost(
                root_pid=root,
                procs=len(tree),
                cpu_cores=cpu_cores,
                rss_b=sum(r for r in rss if r is not None),
                threads=sum(stat[3] for stat in tree.values()),
                window_s=window_s,
            )
            if cpu_cores is None:
                record.absent = {"cpu_cores": "first sample: no window yet"}
            ctx.publish(record)
            previous_cpu = {pid: stat[2] for pid, stat in tree.items()}
            previous_t = now
