"""The launcher's watch for processes of the run that never said hello: why the agent missed each one, said once.

It reads ``/proc`` (argv, interpreter, environment, age) and asks ``model.diagnosis`` for the reason and the fix; it
never signals, traces or slows a process, and it says nothing about a process the agent joined or one that is silent
by design (a DataLoader worker, a compile worker, the torchrun parent). The agent says hello only once a process does
something worth a record, so only a certain reason is said (``-I``, a cleared environment, an interpreter without
trainmeter, an old Python); a non-Python command gets its one line when no Python process of the run was seen.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable

from trainmeter_core.bus.proctree import CLOCK_TICKS, ProcessTree, read_cmdline, read_environ
from trainmeter_core.model.diagnosis import Diagnosis, SilentProcess, diagnose, is_helper, is_python

#: How long a process may run before its silence means something: the agent says hello while the interpreter starts
#: (tens of ms), so a few seconds leave room for a loaded machine without making the user wait.
GRACE_S = float(os.environ.get("TM_SILENCE_GRACE_S", "5"))
#: The watch looks once a second while a process of the tree waits for its grace to end; each look that finds every
#: process already judged doubles the wait, up to POLL_MAX_S. On a virtual machine a wake that reads /proc costs 0.4 to
#: 0.6 ms of CPU (against 0.04 ms for the same look warm, docs/performance.md "Windows of a second"), so a run whose
#: tree stays the same pays a quarter of that. A process born during a long wait is seen at most POLL_MAX_S later,
#: before its grace of GRACE_S (5 s) is over, and judged when the grace ends, as with one look a second.
POLL_S, POLL_MAX_S = 1.0, 4.0
_PROBE = (
    "import importlib.util, sys; "
    "print(*sys.version_info[:3], importlib.util.find_spec('trainmeter_agent') is not None)"
)
_VERSION_IN_NAME = re.compile(r"python(\d)\.(\d+)$")


def uptime_s(proc: str = "/proc") -> float | None:
    try:
        with open(f"{proc}/uptime", "rb") as f:
            return float(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None


class SilenceWatch:
    """Walks the run's process tree while the child lives and reports each silent process once.

    ``said_hello(pid)`` tells whether the agent in that process said hello (the hub knows); ``report(line)`` says it
    (on tm's stderr and as a ``notice`` on the bus).
    """

    def __init__(
        self,
        root_pid: int,
        said_hello: Callable[[int], bool],
        anyone_said_hello: Callable[[], bool],
        report: Callable[[str], None],
        boot_dir: str,
        tm_python: str,
        proc: str = "/proc",
    ) -> None:
        self.root_pid = root_pid
        self.said_hello = said_hello
        self.anyone_said_hello = anyone_said_hello
        self.report = report
        self.boot_dir = boot_dir
        self.tm_python = tm_python
        self.proc = proc
        self.tree = ProcessTree(root_pid, proc)
        self.done: set[tuple[int, int]] = set()  # (pid, start ticks): a process is judged once
        self.python_seen = False
        self.waiting = False  # a process of the tree, at the last look, was still within its grace
        self._thread: threading.Thread | None = None

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(target=self._run, args=(stop,), name="tm-silence", daemon=True)
        self._thread.start()

    def _run(self, stop: threading.Event) -> None:
        wait_s = POLL_S
        while not stop.wait(wait_s):
            try:
                self.check()
            except Exception:  # a /proc race or an odd process must never take the launcher down
                wait_s = POLL_S
                continue
            wait_s = POLL_S if self.waiting else min(2 * wait_s, POLL_MAX_S)

    def check(self) -> list[str]:
        """One look at the tree; returns the lines reported now."""
        now = uptime_s(self.proc)
        if now is None:
            return []
        lines = []
        self.waiting = False
        tree = self.tree.refresh()
        argvs = {pid: tuple(read_cmdline(pid, self.proc) or ()) for pid in tree}
        self.python_seen = self.python_seen or any(argv and is_python(list(argv)) for argv in argvs.values())
        for pid, stat in tree.items():
            argv = argvs[pid]
            key = (pid, stat.start_ticks)
            if key in self.done:
                continue
            if now - stat.start_ticks / CLOCK_TICKS < GRACE_S:
                self.waiting = True
                continue
            self.done.add(key)
            if not argv or self.said_hello(pid) or is_helper(list(argv)):
                continue
            found = self.diagnose(pid, argv)
            if found is None or not found.certain:
                continue
            if found.fix is None and (pid != self.root_pid or self.python_seen or self.anyone_said_hello()):
                continue  # a shell or a tool beside Python processes the agent may join: nothing worth a line
            line = f"pid {pid} ({shlex.join(argv)[:80]}) never said hello: {found.line()}"
            self.report(line)
            lines.append(line)
        return lines

    def diagnose(self, pid: int, argv: tuple[str, ...]) -> Diagnosis | None:
        env = read_environ(pid, self.proc)
        executable = self._interpreter_path(pid, argv, env)
        version, has_trainmeter = self._interpreter(argv, executable, env)
        return diagnose(
            SilentProcess(
                argv=argv,
                executable=executable,
                python_version=version,
                env=env,
                boot_dir=self.boot_dir,
                tm_python=self.tm_python,
                has_trainmeter=has_trainmeter,
            )
        )

    def _interpreter_path(self, pid: int, argv: tuple[str, ...], env: dict[str, str] | None) -> str | None:
        """The interpreter as the process named it (a virtualenv's ``bin/python`` is a link to the base binary, so
        ``/proc/PID/exe`` cannot tell two virtualenvs apart: which packages it sees depends on the path it ran)."""
        if argv and os.sep in argv[0]:
            return argv[0]
        if argv and env is not None:
            found = shutil.which(argv[0], path=env.get("PATH", ""))
            if found:
                return found
        try:
            return os.readlink(f"{self.proc}/{pid}/exe")
        except OSError:
            return None

    def _interpreter(
        self, argv: tuple[str, ...], executable: str | None, env: dict[str, str] | None
    ) -> tuple[tuple[int, ...] | None, bool | None]:
        """The interpreter's version and whether it can import the agent, asked of it once, in the process's own
        environment (with the agent kept dormant); or read from its file name when it cannot be asked."""
        if not argv or not is_python(list(argv), executable):
            return None, None
        name = os.path.basename(executable or argv[0])
        named = _VERSION_IN_NAME.search(name)
        guess = (int(named.group(1)), int(named.group(2))) if named else None
        if executable is None:
            return guess, None
        if executable == self.tm_python:
            return guess, True  # tm's own interpreter has trainmeter
        probe_env = dict(env or {}, TM_AGENT="0")
        try:
            result = subprocess.run(
                [executable, "-c", _PROBE], env=probe_env, capture_output=True, text=True, timeout=10
            )
            major, minor, micro, found = result.stdout.split()
            return (int(major), int(minor), int(micro)), found == "True"
        except (OSError, ValueError, subprocess.SubprocessError):
            return guess, None
