"""The training command as tm starts it: untouched, in its own process group, with the agent's boot folder on its
``PYTHONPATH``, and the terminal's foreground when tm has it.

Nothing here ever signals the child except to forward a signal tm itself received; its exit status becomes tm's.
"""

from __future__ import annotations

import importlib.util
import os
import select
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

from trainmeter_core.bus import step_page
from trainmeter_core.errors import CommandNotStartable

#: The signals tm forwards to the child (once each; not under Slurm, which signals every process of the step).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: The ``trainmeter.agent`` entry points' names, one per line, in the command's environment (the run directory's
#: agent-plugins.json has the whole list): the agent watches the import of each, and needs no JSON to read them.
AGENT_PLUGIN_NAMES = "TM_AGENT_PLUGIN_NAMES"
#: How long an agent's flush window stays open at most (trainmeter_agent/_outbox.py): a second unless the command's
#: environment says otherwise, after a process's first twenty windows of at most 50 ms (_outbox.START_WINDOWS, unless
#: the environment chose the window). Each window wakes the hub, the recorder and the engine, and on the tight loop a
#: window's fixed cost in them is more than its rows': 250 ms windows cut tm's processes' CPU by a quarter to a half
#: against 50 ms, windows of a second by a fifth more (docs/performance.md, "Windows of a second"), as long as the
#: engine's ticks, so the dashboard's snapshots lag the loop by a second more at most. The first windows stay short so
#: that the first steps show at once and what starts at a process's first window (the collective probe's timing)
#: starts early ...
FLUSH_ENV, FLUSH_S = "TM_AGENT_FLUSH_S", "1"
#: ... and on a node of a job a second from the first window: a rank of a job steps a few times a second, so a short
#: window leaves with one step in it, and the job hub takes a block of one step at 1.6 times the rows a second it takes
#: as records, against 8 times for blocks of ten (bench/bench_jobhub.py, docs/performance.md "The job hub"). The price,
#: there as in a single-node run: steps reach the hubs up to a second later (the dashboard's snapshots come once a
#: second), and a process killed by SIGKILL loses up to a second of steps, which its launcher counts and says
#: (goodbyes.lost_windows).
JOB_FLUSH_S = "1"
#: The records a window holds at most (trainmeter_agent/_outbox.py's MAX_RECORDS) unless the environment says otherwise:
#: a second of a fast tight loop (5,000 steps a second, each a step and a data wait) with room to spare
FLUSH_RECORDS_ENV, FLUSH_RECORDS = "TM_AGENT_FLUSH_RECORDS", "16000"


def exec_untouched(command: list[str], script_mode: bool) -> NoReturn:
    """Replace tm with the command itself (a tm inside a tm, or inside a torchrun rank); returns only by raising
    ``CommandNotStartable``."""
    argv = [sys.executable, *command] if script_mode else command
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        raise CommandNotStartable.not_found(f"{argv[0]}: command not found") from None
    except PermissionError:
        raise CommandNotStartable.not_executable(f"{argv[0]}: not executable") from None


def resolve_command(command: list[str], script_mode: bool) -> list[str]:
    """The argv to start; ``CommandNotStartable`` (127 not found, 126 not executable) when it cannot start."""
    if script_mode:
        script = command[0]
        if not os.path.exists(script):
            raise CommandNotStartable.not_found(
                f"{script}: no such file (to run a command rather than a script: tm -- CMD ARGS)"
            )
        if os.path.isdir(script) and not os.path.exists(os.path.join(script, "__main__.py")):
            raise CommandNotStartable.not_executable(f"{script}: is a directory without __main__.py")
        return [sys.executable, *command]
    program = command[0]
    if os.sep in program:
        if not os.path.exists(program):
            raise CommandNotStartable.not_found(f"{program}: no such file")
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            raise CommandNotStartable.not_executable(f"{program}: not executable")
        return list(command)
    if shutil.which(program) is None:
        raise CommandNotStartable.not_found(f"{program}: command not found")
    return list(command)


def agent_boot_dir() -> Path:
    """The folder holding the agent's ``sitecustomize.py``, put first on the child's ``PYTHONPATH``.

    Found with ``find_spec``, which locates ``trainmeter_agent`` without importing it: the core never imports the agent,
    which is a guest of the training process only.
    """
    spec = importlib.util.find_spec("trainmeter_agent")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("trainmeter_agent is not installed beside trainmeter_core: reinstall trainmeter")
    return Path(next(iter(spec.submodule_search_locations))) / "boot"


def child_environment(
    endpoints: dict, run_dir: Path, agent: bool, tap: bool = True, step_pages: Path | None = None
) -> dict[str, str]:
    """The command's environment: the run, the hub's endpoint, the agent's boot folder first on ``PYTHONPATH``, and the
    folder where each agent keeps its step page (``trainmeter_core.bus.step_page``) when the launcher made one."""
    env = dict(os.environ)
    if not tap:
        env["TM_NO_TAP"] = "1"
    env["TM_ACTIVE"] = "1"
    env["TM_RUN_DIR"] = str(run_dir)
    env["TM_LAUNCHER_PID"] = str(os.getpid())
    env["TM_AGENT_ENDPOINT"] = endpoints["in"]
    env["TM_AGENT"] = "1" if agent else "0"
    if step_pages is not None:
        env[step_page.PAGES_ENV] = str(step_pages)
    if agent:
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(agent_boot_dir()) + (os.pathsep + path if path else "")
    return env


def agent_window_s(env: dict[str, str]) -> str:
    """The agents' flush window in the command's environment ``env``, as the agent reads it (seconds, as text)."""
    return env.get(FLUSH_ENV, FLUSH_S)


def give_job_windows(env: dict[str, str]) -> None:
    """The command's environment on a node of a job: its agents' windows a second long (``JOB_FLUSH_S``), unless the
    environment already sets one (the user's, kept)."""
    env.setdefault(FLUSH_ENV, JOB_FLUSH_S)


def lower_own_priority(niceness: int = 5) -> None:
    """Nice ``niceness`` and OOM score +500: tm's own processes yield CPU to the trainer and are the OOM killer's first
    pick. The launcher calls it after the child started (so the child inherits neither), with 5; the components'
    processes with 10."""
    try:
        os.nice(niceness)
    except OSError:
        pass
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("500")
    except OSError:
        pass


class Child:
    """The training command: its own process group, the terminal's foreground when tm has it."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.env = env
        self.pid: int | None = None
        self.status: int | None = None  # raw waitpid status
        self.exited = threading.Event()
        self.tty: int | None = None

    def start(self) -> None:
        tty = 0 if _isatty(0) else None
        foreground = tty is not None and os.tcgetpgrp(tty) == os.getpgrp()
        # Python ignores SIGPIPE and SIGXFSZ; the child gets the defaults it would have without tm.
        self.pid = os.posix_spawnp(
            self.argv[0],
            self.argv,
            self.env,
            setpgroup=0,
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            setsigmask=(),
        )
        if foreground:
            self.tty = tty
            self._give_terminal(self.pid)
            try:
                os.killpg(self.pid, signal.SIGCONT)  # in case it read the terminal before it was its own
            except OSError:
                pass

    def _give_terminal(self, pgid: int) -> None:
        if self.tty is None:
            return
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
        try:
            os.tcsetpgrp(self.tty, pgid)
        except OSError:
            pass
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def poll(self) -> int | None:
        """The raw status if the child has already exited (it is then reaped, and ``wait`` returns it), else None."""
        if self.status is not None:
            return self.status
        assert self.pid is not None
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return None  # reaped elsewhere: let wait() tell
        if pid == 0 or not (os.WIFEXITED(status) or os.WIFSIGNALED(status)):
            return None
        self.status = status
        self.exited.set()
        self._give_terminal(os.getpgrp())
        return status

    def exited_within(self, timeout_s: float) -> int | None:
        """The raw status if the child exits within ``timeout_s`` (woken by its exit, not by polling), else None."""
        if self.poll() is not None or timeout_s <= 0:
            return self.status
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # no pidfd (an old kernel): look every 10 ms
            deadline = time.monotonic() + timeout_s
            while self.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            return self.status
        try:
            select.select([fd], [], [], timeout_s)
        finally:
            os.close(fd)
        return self.poll()

    def wait(self) -> int:
        """Wait for the child to exit, following Ctrl-Z like a shell would. Returns the raw status."""
        assert self.pid is not None
        if self.status is not None:
            return self.status
        while True:
            try:
                _, status = os.waitpid(self.pid, os.WUNTRACED)
            except ChildProcessError:
                status = 0
            if os.WIFSTOPPED(status):
                # The child was stopped (Ctrl-Z): take the terminal back, stop tm too, hand it over again on resume.
                self._give_terminal(os.getpgrp())
                os.kill(os.getpid(), signal.SIGSTOP)
                self._give_terminal(self.pid)
                try:
                    os.killpg(self.pid, signal.SIGCONT)
                except OSError:
                    pass
                continue
            self.status = status
            self.exited.set()
            self._give_terminal(os.getpgrp())
            return status

    def alive(self) -> bool:
        return self.pid is not None and not self.exited.is_set()

    def signal(self, signum: int) -> None:
        if self.alive():
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def exit_status(status: int) -> tuple[int, str, int | None, int | None]:
    """tm's exit status, the reason, the exit code and the signal, from a raw wait status."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return 128 + sig, "signaled", None, sig
    code = os.WEXITSTATUS(status)
    return code, "exited", code, None
