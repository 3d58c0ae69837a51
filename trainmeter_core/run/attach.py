"""``tm attach PID``: watch a program that is already running, from outside only (its process tree, the node, and its
GPUs), writing a run directory like ``tm train.py`` does but without an agent inside.

It never signals the watched program: Ctrl-C (or SIGTERM, SIGHUP) stops the watch and leaves the program running. The
run ends when the program exits or when the watch is stopped.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from pathlib import Path

from trainmeter_core.bus.hub import Hub
from trainmeter_core.bus.proctree import read_environ, read_stat
from trainmeter_core.bus.supervisor import Supervisor
from trainmeter_core.errors import UsageError
from trainmeter_core.model import records
from trainmeter_core.model.redaction import redact_argv, redact_env
from trainmeter_core.run.child import lower_own_priority
from trainmeter_core.run.component_start import plan_placements
from trainmeter_core.run.identity import describe_run, open_run, read_job_identity
from trainmeter_core.run.stderr_lines import Say
from trainmeter_core.run.summary import view_command, write_summary
from trainmeter_core.runlog.recorder import Recorder

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_S = 0.25
_ENV_PREFIXES = ("CUDA_", "NCCL_", "TORCH", "PYTORCH_", "OMP_", "SLURM_", "WORLD_SIZE", "RANK", "LOCAL_RANK")


class Target:
    """The watched process, known by pid and start time (so a reused pid is never mistaken for it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        stat = read_stat(pid)
        self.start_ticks = stat.start_ticks if stat is not None else None

    def alive(self) -> bool:
        stat = read_stat(self.pid)  # None once it is gone, or a zombie its parent has not reaped yet
        return stat is not None and (self.start_ticks is None or stat.start_ticks == self.start_ticks)

    def wait(self, stop: threading.Event) -> bool:
        """Wait until the program exits (True) or the watch is stopped (False)."""
        fd = None
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            pass  # an older kernel: poll /proc instead
        try:
            poller = None
            if fd is not None:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
            while not stop.is_set():
                if poller is not None and poller.poll(POLL_S * 1000):
                    return True
                if poller is None:
                    stop.wait(POLL_S)
                if not self.alive():  # also catches a zombie its own parent has not reaped yet
                    return True
            return False
        finally:
            if fd is not None:
                os.close(fd)


def _environ(pid: int) -> dict[str, str]:
    """The variables of its environment that shape a run (secrets are redacted by the caller)."""
    env = read_environ(pid) or {}
    return {k: v for k, v in env.items() if k.startswith(_ENV_PREFIXES) or k == "NVIDIA_VISIBLE_DEVICES"}


def program_name(command: list[str], pid: int) -> str:
    """A run name for a program: the script of ``python train.py``, the module of ``python -m pkg``, else argv[0]."""
    if not command:
        return f"pid{pid}"
    program = Path(command[0]).name
    if not program.startswith("python"):
        return program
    args = iter(command[1:])
    for arg in args:
        if arg == "-m":
            return next(args, program)
        if arg == "-c":
            return program
        if not arg.startswith("-"):
            return Path(arg).stem or program
    return program


def check_pid(text: str) -> int:
    """The pid to watch; a ``UsageError`` says in one line why it cannot be watched."""
    if not text.isdigit() or int(text) <= 0:
        raise UsageError(
            f"attach: {text!r} is not a process id (a positive whole number, as `pgrep -f train.py` gives)"
        )
    pid = int(text)
    if pid == os.getpid():
        raise UsageError("attach: that is tm itself")
    if read_stat(pid) is None:
        raise UsageError(f"attach: no process {pid} (`ps -p {pid}`); it may have exited already")
    return pid


def watch(target: Target, command: list[str], name: str, runs_dir: str | None, say: Say) -> int:
    """Watch the program until it exits or the watch is stopped, as a run of its own; returns 0 (tm cannot see the
    exit status of a process it did not start)."""
    start_wall = time.time()
    start_t = time.monotonic()
    run_dir, lock, sockets, endpoints = open_run(name, runs_dir, start_wall)
    recorder = Recorder(run_dir, warn=say)
    recorder.start()
    hub = Hub(endpoints["in"], endpoints["out"], recorder, child_alive=target.alive)
    hub.start()

    stop = threading.Event()
    received: list[int] = []

    def stop_watch(signum: int, _frame) -> None:
        received.append(signum)  # never forwarded: the program is not ours to signal
        stop.set()

    previous = {sig: signal.signal(sig, stop_watch) for sig in STOP_SIGNALS}
    plugins, shown = _announce(hub, run_dir, target, command, name, start_wall, start_t, say)
    lower_own_priority()
    supervisor = Supervisor(run_dir, plan_placements(plugins), lambda r: hub.inject(_ours(r)))
    supervisor.start()
    say(f"watching pid {target.pid} ({shown[:80]}) in run {run_dir.name}; Ctrl-C stops the watch only")

    exited = target.wait(stop)
    if not exited:
        hub.inject(
            records.Notice(
                level="info",
                topic="attach",
                message=f"the watch stopped on {signal.Signals(received[-1]).name}; pid {target.pid} still runs",
                source="attach",
            )
        )
    supervisor.stop()
    elapsed_s = _end_run(hub, recorder, run_dir, target, exited, start_t, start_wall)
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    ended = f"pid {target.pid} exited" if exited else f"watch stopped, pid {target.pid} still runs"
    say(f"{ended} after {elapsed_s:.1f} s · see it again: {view_command(run_dir)}", always=not say.quiet)
    lock.release()
    sockets.remove()
    return 0


def _announce(
    hub: Hub, run_dir: Path, target: Target, command: list[str], name: str, start_wall, start_t, say: Say
):
    """``meta.json`` and the ``run.start`` record of the watched program; returns the plugins and its command line as
    shown (secrets redacted)."""
    from trainmeter_core import plugins as plugins_mod

    plugins = plugins_mod.load()
    for info in plugins.errors():
        say(f"plugin {info.name} ({info.distribution or 'unknown distribution'}) not loaded: {info.error}")
    secret_names = [n for _, names in plugins.per_plugin("trainmeter_secret_options") for n in names]
    redacted = redact_argv(command, secret_names)
    try:
        cwd = os.readlink(f"/proc/{target.pid}/cwd")
    except OSError:
        cwd = None
    hub.inject(
        describe_run(
            run_dir,
            name=name,
            command=redacted,
            cwd=cwd,
            start_wall=start_wall,
            start_t=start_t,
            child_pid=target.pid,
            env=redact_env(_environ(target.pid), secret_names),
            plugins=plugins.infos,
            source="attach",
            agent=False,
            attached=True,
            # The program's own ids: its environment and its cgroups, which are readable wherever its environ is.
            job_identity=read_job_identity(
                read_environ(target.pid) or {}, cgroup_file=f"/proc/{target.pid}/cgroup"
            ),
        )
    )
    return plugins, " ".join(redacted)


def _end_run(
    hub: Hub, recorder: Recorder, run_dir: Path, target: Target, exited: bool, start_t, start_wall
) -> float:
    """run.end (no exit status: tm did not start the program), the log closed and ``summary.json``; returns the
    watch's length in seconds."""
    elapsed_s = time.monotonic() - start_t
    why = (
        "tm attach cannot see the exit status of a process it did not start"
        if exited
        else f"detached: pid {target.pid} was not signalled and still runs"
    )
    reason = "exited" if exited else "detached"
    hub.finish(
        records.RunEnd(
            status=0,
            reason=reason,
            elapsed_s=elapsed_s,
            steps=hub.steps,
            source="attach",
            absent={"exit_code": why},
        )
    )
    recorder.close()
    write_summary(run_dir, hub, recorder, 0, reason, None, None, elapsed_s, start_wall)
    return elapsed_s


def _ours(record: records.Record) -> records.Record:
    record.source = record.source or "attach"
    return record
