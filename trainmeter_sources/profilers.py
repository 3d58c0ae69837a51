"""Whether Nsight Systems (``nsys``) or Nsight Compute (``ncu``) runs the training, seen from outside.

A profiler that replays kernels or holds the performance counters makes GPM read wrong values, so the GPU sampler
pauses GPM while one is there. It only reads ``/proc`` (names, command lines, the environment) and never touches the
profiler or the training.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from trainmeter_core.bus.proctree import ancestors, read_cmdline, read_environ, read_stat

# Executable names as the Nsight tools install them (``ncu`` was ``nv-nsight-cu-cli`` before Nsight Compute 2021.1).
PROFILER_PROGRAMS = {
    "nsys": "nsys",
    "nsys-launcher": "nsys",
    "ncu": "ncu",
    "ncu-cli": "ncu",
    "nv-nsight-cu-cli": "ncu",
}
# CUDA loads the library named by CUDA_INJECTION64_PATH into every CUDA process: the Nsight tools inject their
# collectors that way, so the variable names them even when the profiler process is out of sight (another namespace).
_INJECTION_ENV = "CUDA_INJECTION64_PATH"
_INJECTION_WORDS = (("nsys", "nsys"), ("nsight-systems", "nsys"), ("nsight-compute", "ncu"), ("ncu", "ncu"))


def program_of(pid: int, proc: str = "/proc") -> str | None:
    """The profiler a process is (``nsys`` or ``ncu``), by its name or the first word of its command line."""
    names = []
    stat = read_stat(pid, proc)
    if stat is not None:
        names.append(stat.name)
    argv = read_cmdline(pid, proc)
    if argv:
        names.append(os.path.basename(argv[0]))
    for name in names:
        if name in PROFILER_PROGRAMS:
            return PROFILER_PROGRAMS[name]
    return None


def profiler_in_environment(environ: Mapping[str, str] | None) -> str | None:
    if not environ:
        return None
    injected = environ.get(_INJECTION_ENV, "").lower()
    for word, profiler in _INJECTION_WORDS:
        if word in injected:
            return profiler
    return None


def find_profiler(run_pids: Iterable[int], root: int | None, proc: str = "/proc") -> str | None:
    """``nsys`` or ``ncu`` when one runs the training: in the run's tree, above it (``nsys profile tm ...``), or in
    the training's environment; None otherwise."""
    for pid in run_pids:
        found = program_of(pid, proc)
        if found:
            return found
    if root is None:
        return None
    for pid in ancestors(root, proc):
        found = program_of(pid, proc)
        if found:
            return found
    return profiler_in_environment(read_environ(root, proc))
