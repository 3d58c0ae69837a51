"""Why a process of the run never said hello, and the command that fixes it, from what the launcher can read of it.

Pure: the launcher reads argv, the interpreter, its version and environment (``/proc/<pid>/...``) and asks here; this
module does no I/O, runs nothing and imports nothing of the agent. It answers once per process, in one line.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: The oldest Python the agent runs on (pyproject's requires-python).
OLDEST_PYTHON = (3, 10)

# Helpers of a training process stay silent by design (trainmeter_agent/boot/sitecustomize.py keeps them dormant; a
# test checks that both lists agree): their silence needs no diagnosis.
_HELPER_CODE = ("multiprocessing.spawn", "multiprocessing.forkserver", "multiprocessing.resource_tracker")
_HELPER_MODULES = ("torch._inductor.compile_worker", "torch.distributed.run", "torch.distributed.launch")
_HELPER_SCRIPTS = ("/torch/_inductor/compile_worker/__main__.py", "/torch/distributed/run.py", "/torchrun")

# Interpreter options that keep sitecustomize (and so the agent) from loading, and why.
_BLOCKING_OPTIONS = {
    "I": "runs Python in isolated mode (-I), which ignores PYTHONPATH, so tm's agent never loads",
    "E": "runs Python with -E, which ignores PYTHONPATH, so tm's agent never loads",
    "S": "runs Python with -S, which skips site and so sitecustomize, where tm's agent starts",
}
_OPTIONS_WITH_VALUE = "WX"


@dataclass(frozen=True)
class SilentProcess:
    """What the launcher knows of a process of the run that never said hello."""

    argv: tuple[str, ...]
    executable: str | None = None  # the interpreter's path (/proc/<pid>/exe), if readable
    python_version: tuple[int, ...] | None = None  # (3, 9) or (3, 12, 1), if known
    env: Mapping[str, str] | None = None  # its environment, None when it could not be read
    boot_dir: str | None = None  # the folder tm put first on PYTHONPATH
    tm_python: str | None = None  # tm's own interpreter
    has_trainmeter: bool | None = None  # whether that interpreter can import trainmeter_agent, if checked


@dataclass(frozen=True)
class Diagnosis:
    """One reason, and the command or step that fixes it (None where nothing in the process can change).

    ``certain`` is False where the reason is a guess (the interpreter could not be asked whether it has trainmeter,
    or nothing explains the silence): the agent says hello only once the process does something worth a record, so a
    process that just sleeps is silent with the agent in it, and an uncertain reason is not worth a warning.
    """

    reason: str
    fix: str | None
    certain: bool = True

    def line(self) -> str:
        return self.reason if self.fix is None else f"{self.reason}; fix: {self.fix}"


def _program(argv: Sequence[str]) -> tuple[list[str], str, str]:
    """(interpreter options, how the program is given: "-c", "-m", "script" or "", what)."""
    options: list[str] = []
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            return options, "script", argv[i + 1] if arg == "--" and i + 1 < len(argv) else arg
        if arg.startswith("--"):
            options.append(arg)
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        for at, letter in enumerate(arg[1:], start=1):
            if letter in "cm":
                options.append(arg[:at])
                value = arg[at + 1 :] or (argv[i + 1] if i + 1 < len(argv) else "")
                return options, "-" + letter, value
            if letter in _OPTIONS_WITH_VALUE:
                i += 0 if arg[at + 1 :] else 1
                break
        options.append(arg)
        i += 1
    return options, "", ""


def is_python(argv: Sequence[str], executable: str | None = None) -> bool:
    """Whether a command is a Python interpreter (by the program's or the interpreter's file name)."""
    for path in (executable, argv[0] if argv else None):
        name = os.path.basename(path or "")
        if name.startswith("python") or name.startswith("pypy"):
            return True
    return False


def is_helper(argv: Sequence[str]) -> bool:
    """A multiprocessing helper, an inductor compile worker or the torchrun parent: silent by design."""
    if "--multiprocessing-fork" in argv:
        return True
    _, how, what = _program(argv)
    if how == "-c":
        return any(fragment in what for fragment in _HELPER_CODE)
    if how == "-m":
        return any(what == m or what.startswith(m + ".") for m in _HELPER_MODULES)
    if how == "script":
        path = what.replace(os.sep, "/")
        return any(path.endswith(suffix) or "/" + path == suffix for suffix in _HELPER_SCRIPTS)
    return False


def _without_option(argv: Sequence[str], letter: str) -> list[str]:
    """argv with one interpreter flag letter removed, alone (``-I``) or in a cluster (``-uI`` becomes ``-u``)."""
    out = [argv[0]]
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("--", "-") or not arg.startswith("-"):
            return out + list(argv[i:])  # the program and its own arguments are left alone
        i += 1
        if arg.startswith("--"):
            out.append(arg)
            continue
        head = arg[1:]
        stop = next((at for at, ch in enumerate(head) if ch in "cm" + _OPTIONS_WITH_VALUE), len(head))
        cleaned = head[:stop].replace(letter, "") + head[stop:]
        if cleaned:
            out.append("-" + cleaned)
        if stop < len(head) and head[stop] in "cm":
            return out + list(argv[i:])
        if stop == len(head) - 1 and head[stop] in _OPTIONS_WITH_VALUE and i < len(argv):
            out.append(argv[i])  # -W ignore: the value is the next argument
            i += 1
    return out


def diagnose(process: SilentProcess) -> Diagnosis | None:
    """Why ``process`` never said hello, and the fix; None for a helper that is silent by design."""
    argv = list(process.argv)
    command = shlex.join(argv) if argv else "the command"
    if not argv or not is_python(argv, process.executable):
        return Diagnosis(
            reason=f"{os.path.basename(argv[0]) if argv else 'the command'} is not Python: tm shows its GPU counters "
            "and host data, but no steps, tokens or loss from inside it",
            fix=None,
        )
    if is_helper(argv):
        return None
    version = process.python_version
    if version is not None and tuple(version[:2]) < OLDEST_PYTHON:
        shown = ".".join(map(str, version[:3]))
        return Diagnosis(
            reason=f"it runs Python {shown}, older than the 3.10 the agent needs",
            fix="run it with Python 3.10 or newer, with trainmeter installed there: tm -- python3.12 "
            + shlex.join(argv[1:]),
        )
    options, _, _ = _program(argv)
    for option in options:
        if option.startswith("--"):
            continue
        for letter, why in _BLOCKING_OPTIONS.items():
            if letter in option[1:]:
                return Diagnosis(reason=f"it {why}", fix=shlex.join(_without_option(argv, letter)))
    env = process.env
    if env is not None:
        path = env.get("PYTHONPATH", "")
        boot_on_path = process.boot_dir is None or process.boot_dir in path.split(os.pathsep)
        if not env.get("TM_AGENT_ENDPOINT") or not boot_on_path:
            return Diagnosis(
                reason="its environment lacks tm's TM_AGENT_ENDPOINT and PYTHONPATH: something started it with a "
                "cleared environment (env -i, sudo, a scheduler)",
                fix=f"keep the environment (sudo -E, srun --export=ALL), or run tm inside: tm -- {command}",
            )
    executable = process.executable
    other = executable is not None and process.tm_python is not None and executable != process.tm_python
    if process.has_trainmeter is False or (other and process.has_trainmeter is None):
        where = f"{executable}, another Python than tm's ({process.tm_python})," if other else f"{executable}"
        certainty = "has no trainmeter" if process.has_trainmeter is False else "may not have trainmeter"
        return Diagnosis(
            reason=f"it runs {where} which {certainty}",
            fix=f"{executable or argv[0]} -m pip install trainmeter",
            certain=process.has_trainmeter is False,
        )
    return Diagnosis(
        reason="the agent did not start in this Python process",
        fix=f"tm doctor --python {executable or argv[0]}",
        certain=False,
    )
