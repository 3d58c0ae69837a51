"""The step page: a training process's count of its steps, in a small file it maps into memory, so that the launcher
can read it after the process was killed (SIGKILL leaves no goodbye and no last window) and say how many steps died
with it. The agent writes it with plain stores, never a syscall per step; the launcher reads it once, at the run's end.

One page per process, named after its pid, in the folder the launcher names in ``TM_AGENT_PAGES``; a fork child maps
its own once it steps. Nothing here imports anything heavy: the agent loads it in the training process.
"""

from __future__ import annotations

import mmap
import os
from array import array
from pathlib import Path

#: The launcher's folder of pages, in the training process's environment.
PAGES_ENV = "TM_AGENT_PAGES"
#: The slots of a page, each a signed 64-bit integer in the machine's byte order.
MAGIC, PID, COUNTED, HANDED, WINDOWS, WINDOW_RECORDS = range(6)
SLOTS = 8
#: The first slot of a page the agent wrote (b"tmsteps1" read as a little-endian integer).
MAGIC_VALUE = int.from_bytes(b"tmsteps1", "little")
SIZE_B = 8 * SLOTS


def page_path(folder: str | os.PathLike, pid: int) -> Path:
    return Path(folder) / f"{pid}.page"


class StepPage:
    """The agent's page. ``slots`` takes plain stores: ``COUNTED`` the steps the process queued, ``HANDED`` those
    already in a message handed to the bus, ``WINDOWS`` the windows sent. Before ``open`` (and when no folder is
    named, or the file cannot be made) the slots are an array of this process's own: the same stores, kept nowhere."""

    def __init__(self) -> None:
        self.slots = array("q", bytes(SIZE_B))
        self.path: Path | None = None
        self._map: mmap.mmap | None = None

    def open(self, window_records: int) -> None:
        """Map this process's page in the launcher's folder, carrying over what the slots hold so far."""
        folder = os.environ.get(PAGES_ENV)
        if not folder or self._map is not None:
            return
        path = page_path(folder, os.getpid())
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.ftruncate(fd, SIZE_B)
                mapped = mmap.mmap(fd, SIZE_B)
            finally:
                os.close(fd)
        except OSError:
            return  # no page: the launcher says what it can without one
        slots = memoryview(mapped).cast("q")
        for i, value in enumerate(self.slots):
            slots[i] = value
        slots[PID] = os.getpid()
        slots[WINDOW_RECORDS] = window_records
        slots[MAGIC] = MAGIC_VALUE  # last: a page with its magic holds its pid
        self.slots, self._map, self.path = slots, mapped, path

    def after_fork(self) -> StepPage:
        """A fork child's page: a new one, unopened (the parent's mapping stays the parent's)."""
        return StepPage()


def read_page(folder: str | os.PathLike, pid: int) -> dict[str, int] | None:
    """The page of ``pid`` as the launcher reads it: steps counted, handed, windows sent and the window's records;
    None when there is none or it is not a page."""
    try:
        data = page_path(folder, pid).read_bytes()
    except OSError:
        return None
    if len(data) < SIZE_B:
        return None
    slots = memoryview(data).cast("q")
    if slots[MAGIC] != MAGIC_VALUE or slots[PID] != pid:
        return None
    return {
        "counted": slots[COUNTED],
        "handed": slots[HANDED],
        "windows": slots[WINDOWS],
        "window_records": slots[WINDOW_RECORDS],
    }
