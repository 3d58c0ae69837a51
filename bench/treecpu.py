"""The CPU time of a command's whole process tree, every process counted, the ones killed at the end included.

How: the bench process makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so a process of the tree
whose parent exits before it (a component the launcher left running, a daemon, a killed process's children) is handed
to the bench instead of to init. After the command returns, the bench waits for every process it was handed until it
has no child left (a straggler still running after ``linger_s`` is killed with SIGKILL, then waited for). The kernel
adds a process's user and system time to its parent's ``RUSAGE_CHILDREN`` when the parent waits for it, and the
parent's own children's totals along with it; with every process of the tree waited for by its parent or by the bench,
the difference of the bench's ``RUSAGE_CHILDREN`` before and after is the CPU of the whole tree: the training process,
the launcher, the hub, the recorder, the components, a web process, whether they ended on their own, were terminated
or were killed. (Before, the benches read ``RUSAGE_CHILDREN`` without the subreaper: a process whose parent exited
without waiting for it went to init and its CPU was never seen.)

What no measurement from outside can count is work a process never did: a component stopped at the end with records
still queued never pays for them. The slope method (a long run minus a short one) cancels a backlog of the same size;
one that grows with the run's length shows as the time tm takes after its training loop ends, which
``bench_tree.py`` prints beside the CPU (the loop prints the wall clock of its last line).

Linux only. One command at a time per bench process (``RUSAGE_CHILDREN`` is the process's total).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import time
from dataclasses import dataclass

PR_SET_CHILD_SUBREAPER = 36
_subreaper = False


def become_subreaper() -> None:
    """Orphans of the trees this process starts come back to it (once per process; raises when the kernel refuses)."""
    global _subreaper
    if _subreaper:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    _subreaper = True


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _my_children() -> list[int]:
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        if int(data[data.rfind(b")") + 2 :].split()[1]) == me:
            found.append(int(entry))
    return found


def _reap_all(linger_s: float) -> int:
    """Wait for every child this process has (the orphans it was handed); returns how many had to be killed."""
    deadline = time.monotonic() + linger_s
    killed = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return killed
        if pid:
            continue
        if time.monotonic() > deadline:
            for child in _my_children():
                try:
                    os.kill(child, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 60
        time.sleep(0.01)


@dataclass
class TreeRun:
    returncode: int
    stdout: str
    stderr: str
    cpu_s: float  # user + system seconds of every process of the tree
    wall_s: float
    stragglers_killed: int


def run_tree(argv: list[str], env: dict, cwd: str | None = None, linger_s: float = 10.0) -> TreeRun:
    """Run ``argv`` to its end and return the CPU seconds of its whole process tree (see the module's docstring)."""
    become_subreaper()
    _reap_all(0.0)  # nothing of an earlier run left to be counted here
    before = _children_cpu_s()
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    killed = _reap_all(linger_s)
    return TreeRun(done.returncode, done.stdout, done.stderr, _children_cpu_s() - before, wall_s, killed)
