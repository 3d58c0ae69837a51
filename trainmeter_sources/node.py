"""The node a run lives on, from ``/proc`` and ``/sys``: the CPU split (with iowait and steal), load, memory and swap,
the cgroup's limits (a CPU quota counted in cores), disks, network, and the filesystems holding the run, its
checkpoints and ``/dev/shm``.

It only reads files and ``statvfs``; it never writes or changes anything. Rates need two reads, so the first sample
names them absent ("first sample: no window yet") instead of guessing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass

from trainmeter_core.bus.proctree import KeptFiles
from trainmeter_core.model import records
from trainmeter_core.model.platform_adapters import FIRST_SAMPLE

SECTOR_B = 512  # /proc/diskstats counts 512-byte sectors whatever the device's own sector size
# cgroup v1 writes "no limit" as the largest page-aligned 64-bit number; anything this large is no limit.
_UNLIMITED_B = 1 << 60
_NOT_DISKS = ("loop", "ram", "zram", "fd", "sr")
#: The fields of /proc/meminfo a node sample reads.
_MEMINFO_KEYS = frozenset({"MemTotal", "MemAvailable", "SwapTotal", "SwapFree"})
#: How long a cgroup file found missing is not looked for again (where the cgroup's own files sit differs between a
#: host and a container: the candidate that is not there would be looked up on every beat).
MISSING_RETRY_S = 30.0
#: How long a filesystem's mount point is taken as known while statvfs still names the same filesystem.
MOUNT_KEPT_S = 60.0


@dataclass
class _Counters:
    t: float
    cpu: list[int] | None
    disks: dict[str, tuple[int, int, int]]  # sectors read, sectors written, ms doing I/O
    net: dict[str, tuple[int, int]]  # bytes received, bytes sent


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _kept(files: KeptFiles, retry_s: float | None = None) -> Callable[[str], str | None]:
    """``_read`` through files kept open."""

    def read(path: str) -> str | None:
        data = files.read(path, retry_s=retry_s)
        return None if data is None else data.decode("utf-8", errors="replace")

    return read


def cpu_times(proc: str = "/proc", read: Callable[[str], str | None] = _read) -> list[int] | None:
    """The first eight fields of the ``cpu`` line: user nice system idle iowait irq softirq steal (clock ticks)."""
    text = read(f"{proc}/stat")
    if not text or not text.startswith("cpu "):
        return None
    values = [int(x) for x in text.split("\n", 1)[0].split()[1:9]]
    return values if len(values) == 8 else None


def meminfo_b(
    proc: str = "/proc", read: Callable[[str], str | None] = _read, keys: Container[str] | None = None
) -> dict[str, int]:
    """``/proc/meminfo`` in bytes (the file says kB and means KiB): every field, or those of ``keys``."""
    values = {}
    for line in (read(f"{proc}/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        if keys is not None and key not in keys:
            continue
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return values


def disk_counters(
    proc: str = "/proc", sys_block: str = "/sys/block", read: Callable[[str], str | None] = _read
) -> dict[str, tuple[int, int, int]]:
    try:
        whole = {name for name in os.listdir(sys_block) if not name.startswith(_NOT_DISKS)}
    except OSError:
        whole = set()
    counters = {}
    for line in (read(f"{proc}/diskstats") or "").splitlines():
        fields = line.split()
        if len(fields) >= 13 and fields[2] in whole:
            counters[fields[2]] = (int(fields[5]), int(fields[9]), int(fields[12]))
    return counters


def net_counters(
    proc: str = "/proc", read: Callable[[str], str | None] = _read
) -> dict[str, tuple[int, int]]:
    counters = {}
    for line in (read(f"{proc}/net/dev") or "").splitlines()[2:]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        name = name.strip()
        if name and name != "lo" and len(fields) >= 9:
            counters[name] = (int(fields[0]), int(fields[8]))
    return counters


def cgroup_limits(
    pid: int | str = "self", proc: str = "/proc", root: str = "/sys/fs/cgroup", files: KeptFiles | None = None
) -> dict:
    """``cpu_quota_cores``, ``mem_limit_b``, ``mem_used_b`` of the cgroup ``pid`` lives in, and reasons for the rest.

    cgroup v2 (``cpu.max``, ``memory.max``, ``memory.current``) or v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``,
    ``memory.limit_in_bytes``, ``memory.usage_in_bytes``); a quota of 200000 per 100000 µs is 2 cores. ``files``: read
    through files kept open, a cgroup file found missing looked for again after ``MISSING_RETRY_S``.
    """
    read = _read if files is None else _kept(files)
    read_cgroup = _read if files is None else _kept(files, MISSING_RETRY_S)
    found: dict = {"absent": {}}
    paths: dict[str, str] = {}
    for line in (read(f"{proc}/{pid}/cgroup") or "").splitlines():
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    v2 = read_cgroup(f"{root}/cgroup.controllers") is not None

    def first(candidates: Iterable[str]) -> str | None:
        for candidate in candidates:
            text = read_cgroup(candidate)
            if text is not None:
                return text.strip()
        return None

    def where(controller: str, name: str) -> list[str]:
        base = root if v2 else f"{root}/{controller}"
        path = paths.get("" if v2 else controller, "/")
        # Inside a container the cgroup's own files are at the mount's top, not under the host's path.
        return [f"{base}{path.rstrip('/')}/{name}", f"{base}/{name}"]

    if v2:
        cpu_max = first(where("", "cpu.max"))
        mem_max = first(where("", "memory.max"))
        mem_now = first(where("", "memory.current"))
        quota = None
        if cpu_max and not cpu_max.startswith("max"):
            quota_us, _, period_us = cpu_max.partition(" ")
            quota = int(quota_us) / int(period_us or 100000)
    else:
        quota_text = first(where("cpu", "cpu.cfs_quota_us"))
        period_text = first(where("cpu", "cpu.cfs_period_us"))
        mem_max = first(where("memory", "memory.limit_in_bytes"))
        mem_now = first(where("memory", "memory.usage_in_bytes"))
        quota = None
        if quota_text and period_text and int(quota_text) > 0:
            quota = int(quota_text) / int(period_text)
    if quota is not None:
        found["cgroup_cpu_quota_cores"] = quota
    else:
        found["absent"]["cgroup_cpu_quota_cores"] = "no cgroup CPU quota"
    if mem_max and mem_max.isdigit() and int(mem_max) < _UNLIMITED_B:
        found["cgroup_mem_limit_b"] = int(mem_max)
    else:
        found["absent"]["cgroup_mem_limit_b"] = "no cgroup memory limit"
    if mem_now and mem_now.isdigit():
        found["cgroup_mem_used_b"] = int(mem_now)
    else:
        found["absent"]["cgroup_mem_used_b"] = "no cgroup memory accounting readable"
    return found


def mount_of(path: str) -> str | None:
    """The mount point holding ``path`` (the nearest folder above it that is one)."""
    current = os.path.realpath(path)
    while True:
        if os.path.ismount(current):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def filesystem(
    role: str, path: str, mounts: dict[str, tuple[int, str | None, float]] | None = None
) -> records.FsStat | None:
    """``path``'s filesystem, its size and what is free. ``mounts`` keeps each path's mount point (with the statvfs
    ``f_fsid`` it was found under and when): looked up again when the filesystem changes or after ``MOUNT_KEPT_S``,
    not on every beat (``mount_of`` walks up the path, a realpath and two lstats a level)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    if mounts is None:
        mount = mount_of(path)
    else:
        now = time.monotonic()
        kept = mounts.get(path)
        if kept is not None and kept[0] == st.f_fsid and now - kept[2] < MOUNT_KEPT_S:
            mount = kept[1]
        else:
            mount = mount_of(path)
            mounts[path] = (st.f_fsid, mount, now)
    return records.FsStat(
        role=role,  # type: ignore[arg-type]
        path=path,
        mount=mount,
        total_b=st.f_blocks * st.f_frsize,
        avail_b=st.f_bavail * st.f_frsize,
    )


class NodeReader:
    """Reads the node once per interval; keeps the previous counters to turn them into rates."""

    def __init__(
        self, proc: str = "/proc", sys_block: str = "/sys/block", cgroup_root: str = "/sys/fs/cgroup"
    ):
        self.proc = proc
        self.sys_block = sys_block
        self.cgroup_root = cgroup_root
        self._previous: _Counters | None = None
        #: The files it reads on every beat, kept open (``KeptFiles``), and each path's mount point (``filesystem``)
        self.files = KeptFiles()
        self._read = _kept(self.files)
        self._mounts: dict[str, tuple[int, str | None, float]] = {}

    def close(self) -> None:
        """Close the files it keeps open."""
        self.files.close()

    def read(
        self, now_t: float, paths: Mapping[str, Iterable[str]], cgroup_pid: int | str = "self"
    ) -> records.SampleNode:
        """The ``sample.node`` record; ``paths`` maps a role (run, checkpoints, shm) to the paths that play it."""
        counters = _Counters(
            now_t,
            cpu_times(self.proc, self._read),
            disk_counters(self.proc, self.sys_block, self._read),
            net_counters(self.proc, self._read),
        )
        previous, self._previous = self._previous, counters
        node = records.SampleNode(cpu_count=os.cpu_count())
        absent: dict[str, str] = {}
        window_s = now_t - previous.t if previous is not None and now_t > previous.t else None
        if window_s is None:
            for name in (
                "cpu_user",
                "cpu_system",
                "cpu_iowait",
                "cpu_steal",
                "cpu_idle",
                "window_s",
                "disks",
                "net",
            ):
                absent[name] = FIRST_SAMPLE
        else:
            node.window_s = window_s
            self._cpu_split(node, absent, previous.cpu, counters.cpu)
            node.disks = _disk_rates(previous.disks, counters.disks, window_s)
            node.net = _net_rates(previous.net, counters.net, window_s)
        load = (self._read(f"{self.proc}/loadavg") or "").split()
        if len(load) >= 3:
            node.load1, node.load5, node.load15 = (float(x) for x in load[:3])
        else:
            absent.update(load1="no /proc/loadavg", load5="no /proc/loadavg", load15="no /proc/loadavg")
        memory = meminfo_b(self.proc, self._read, _MEMINFO_KEYS)
        for field, key in (
            ("mem_total_b", "MemTotal"),
            ("mem_available_b", "MemAvailable"),
            ("swap_total_b", "SwapTotal"),
        ):
            if key in memory:
                setattr(node, field, memory[key])
            else:
                absent[field] = f"no {key} in /proc/meminfo"
        if "SwapTotal" in memory and "SwapFree" in memory:
            node.swap_used_b = memory["SwapTotal"] - memory["SwapFree"]
        else:
            absent["swap_used_b"] = "no SwapFree in /proc/meminfo"
        limits = cgroup_limits(cgroup_pid, self.proc, self.cgroup_root, self.files)
        absent.update(limits.pop("absent"))
        for field, value in limits.items():
            setattr(node, field, value)
        node.filesystems = _filesystems(paths, self._mounts)
        node.absent = absent
        return node

    @staticmethod
    def _cpu_split(
        node: records.SampleNode, absent: dict[str, str], before: list[int] | None, after: list[int] | None
    ):
        if before is None or after is None:
            for name in ("cpu_user", "cpu_system", "cpu_iowait", "cpu_steal", "cpu_idle"):
                absent[name] = "no cpu line in /proc/stat"
            return
        delta = [b - a for a, b in zip(before, after, strict=True)]
        total = sum(delta)
        if total <= 0:
            for name in ("cpu_user", "cpu_system", "cpu_iowait", "cpu_steal", "cpu_idle"):
                absent[name] = "no CPU time passed in the window"
            return
        user, nice, system, idle, iowait, irq, softirq, steal = delta
        node.cpu_user = (user + nice) / total
        node.cpu_system = (system + irq + softirq) / total
        node.cpu_iowait = iowait / total
        node.cpu_steal = steal / total
        node.cpu_idle = idle / total


def _disk_rates(before: dict, after: dict, window_s: float) -> list[records.DiskStat]:
    disks = []
    for name, (read_sectors, written_sectors, io_ms) in sorted(after.items()):
        if name not in before:
            continue
        old = before[name]
        disks.append(
            records.DiskStat(
                device=name,
                read_bps=max(0, read_sectors - old[0]) * SECTOR_B / window_s,
                write_bps=max(0, written_sectors - old[1]) * SECTOR_B / window_s,
                busy=min(1.0, max(0, io_ms - old[2]) / 1000 / window_s),
            )
        )
    return disks


def _net_rates(before: dict, after: dict, window_s: float) -> list[records.NetStat]:
    return [
        records.NetStat(
            interface=name,
            rx_bps=max(0, rx - before[name][0]) / window_s,
            tx_bps=max(0, tx - before[name][1]) / window_s,
        )
        for name, (rx, tx) in sorted(after.items())
        if name in before
    ]


def _filesystems(
    paths: Mapping[str, Iterable[str]], mounts: dict[str, tuple[int, str | None, float]]
) -> list[records.FsStat]:
    found = []
    seen: set[tuple[str, str]] = set()
    for role, role_paths in paths.items():
        for path in role_paths:
            if (role, path) in seen:
                continue
            seen.add((role, path))
            stat = filesystem(role, path, mounts)
            if stat is not None:
                found.append(stat)
    return found
