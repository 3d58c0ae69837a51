"""The launcher's supervisor: starts the component processes, restarts a crashed one with backoff, says so on the bus.

Each process gets a pipe on its stdin that only the launcher holds, so it exits when the launcher dies, and its own
session, so a signal meant for the training never reaches it. ``component`` records tell started, crashed (with the
exit code or signal), restarted, stopped, and gave up.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainmeter_core.model import records

BACKOFF_FIRST_S = 0.2
BACKOFF_MAX_S = 10.0
STABLE_AFTER_S = 30.0
GIVE_UP_AFTER = 20  # crashes in a row, each within STABLE_AFTER_S of its start
NEVER_WAITED_FOR = frozenset({"web"})
#: How often the watch looks at the processes anyway (a pidfd says when one ends), and where a pidfd cannot be had.
WATCH_EVERY_S = 5.0
POLL_WITHOUT_PIDFD_S = 0.1


@dataclass
class Placement:
    """One process and the components it runs."""

    process: str
    components: list[str]
    popen: subprocess.Popen | None = None
    started_at: float = 0.0
    crashes_in_row: int = 0
    restarts: int = 0
    gave_up: bool = False
    pids: list[int] = field(default_factory=list)


class Supervisor:
    def __init__(
        self,
        run_dir: Path,
        placements: list[Placement],
        publish: Callable[[records.Record], None],
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        self.pass_fds = (
            pass_fds  # sockets the launcher bound once, handed to every incarnation (the web's port)
        )
        self.run_dir = run_dir
        self.web_port: object | None = (
            None  # the launcher's bound port for the web process, alive while this is
        )
        self.placements = placements
        self.publish = publish
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe()  # written at the stop: the watch sleeps on it and the pidfds
        self._thread = threading.Thread(target=self._watch, name="tm-supervisor", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        for placement in self.placements:
            self._spawn(placement, "started")
        self._thread.start()

    def _spawn(self, placement: Placement, event: str) -> None:
        argv = [
            sys.executable,
            "-m",
            "trainmeter_core.run.component_host",
            "--run-dir",
            str(self.run_dir),
            "--process",
            placement.process,
            "--components",
            ",".join(placement.components),
            "--parent",
            str(os.getpid()),
        ]
        env = dict(os.environ)
        for name in ("TM_AGENT", "PYTHONPATH_TM"):
            env.pop(name, None)
        env["TM_AGENT"] = "0"  # tm's own processes never carry the agent
        try:
            placement.popen = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                pass_fds=self.pass_fds,
            )
        except OSError as exc:
            self.publish(
                records.Component(
                    name=",".join(placement.components),
                    event="error",
                    process=placement.process,
                    error=str(exc),
                )
            )
            placement.gave_up = True
            return
        placement.started_at = time.monotonic()
        placement.pids.append(placement.popen.pid)
        self._announce(placement, event, child_pid=placement.popen.pid, restarts=placement.restarts)

    def _announce(self, placement: Placement, event: str, **fields) -> None:
        """One ``component`` record for each component the process runs: they share its start, crash and end."""
        for name in placement.components:
            self.publish(records.Component(name=name, event=event, process=placement.process, **fields))  # type: ignore[arg-type]

    def _watch(self) -> None:
        """Wait for a component process to end, and act on it. Each process is watched through a pidfd (readable
        once it exits) beside the stop's pipe, so the thread sleeps until something happens: polling every 0.1 s was
        ten wakes a second of an idle run (docs/performance.md). Where a pidfd cannot be had (a kernel before 5.3),
        it looks every ``POLL_WITHOUT_PIDFD_S``."""
        pidfds: dict[int, int] = {}  # the pid of each process watched -> its pidfd
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        try:
            while not self._stopping.is_set():
                poller.poll(self._wait_s(pidfds, poller) * 1000)
                if self._stopping.is_set():
                    return
                self._look()
        finally:
            for fd in pidfds.values():
                os.close(fd)

    def _wait_s(self, pidfds: dict[int, int], poller: select.poll) -> float:
        """Watch the live processes' pidfds (and no others'); how long to wait for one to end."""
        live = {p.popen.pid for p in self.placements if p.popen is not None and not p.gave_up}
        for pid in list(pidfds):
            if pid not in live:
                poller.unregister(pidfds[pid])
                os.close(pidfds.pop(pid))
        timeout_s = WATCH_EVERY_S
        for pid in live - pidfds.keys():
            try:
                fd = os.pidfd_open(pid)
            except (OSError, AttributeError):
                timeout_s = POLL_WITHOUT_PIDFD_S
                continue
            pidfds[pid] = fd
            poller.register(fd, select.POLLIN)
        return timeout_s

    def _look(self) -> None:
        """Act on every component process that ended."""
        for placement in self.placements:
            with self._lock:
                if self._stopping.is_set() or placement.gave_up or placement.popen is None:
                    continue
                code = placement.popen.poll()
                if code is None:
                    continue
                if code == 0:
                    self._finished(placement)
                else:
                    self._crashed(placement, code)

    def _finished(self, placement: Placement) -> None:
        """Every component of the process returned on its own (done, or nothing to do): stopped, not restarted."""
        assert placement.popen is not None
        self._announce(
            placement, "stopped", child_pid=placement.popen.pid, exit_code=0, restarts=placement.restarts
        )
        _close_stdin(placement.popen)
        placement.popen = None

    def _crashed(self, placement: Placement, code: int) -> None:
        ran_s = time.monotonic() - placement.started_at
        placement.crashes_in_row = 1 if ran_s > STABLE_AFTER_S else placement.crashes_in_row + 1
        backoff = min(BACKOFF_FIRST_S * 2 ** (placement.crashes_in_row - 1), BACKOFF_MAX_S)
        sig = -code if code < 0 else None
        self._announce(
            placement,
            "crashed",
            child_pid=placement.popen.pid,
            exit_code=None if sig else code,
            signal=sig,
            restarts=placement.restarts,
            backoff_s=backoff,
        )
        _close_stdin(placement.popen)
        if placement.crashes_in_row >= GIVE_UP_AFTER:
            placement.gave_up = True
            self._announce(placement, "gave_up", restarts=placement.restarts)
            return
        if self._stopping.wait(backoff):
            return
        placement.restarts += 1
        self._spawn(placement, "restarted")

    def stop(self, timeout_s: float = 3.0) -> list[str]:
        """Ask every component process to stop (SIGTERM), wait a little, then kill what is left; returns a line for
        each process killed so."""
        killed: list[str] = []
        self._stopping.set()
        try:
            os.write(self._wake_w, b"s")
        except OSError:
            pass
        with self._lock:
            live = [p for p in self.placements if p.popen is not None and p.popen.poll() is None]
            for placement in live:
                try:
                    placement.popen.send_signal(signal.SIGTERM)
                except OSError:
                    pass
            deadline = time.monotonic() + timeout_s
            for placement in live:
                if placement.process in NEVER_WAITED_FOR:
                    # tm never waits for the dashboard at the end: its pages hold streams, and it exits with tm anyway.
                    _close_stdin(placement.popen)
                    continue
                try:
                    placement.popen.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    placement.popen.kill()
                    placement.popen.wait()
                    killed.append(
                        f"the {placement.process} process ({', '.join(placement.components)}) did not stop within "
                        f"{timeout_s:g} s of SIGTERM and was killed"
                    )
                _close_stdin(placement.popen)
                self._announce(placement, "stopped", child_pid=placement.popen.pid)
        self._thread.join(2.0)
        return killed


def _close_stdin(popen: subprocess.Popen) -> None:
    try:
        if popen.stdin is not None:
            popen.stdin.close()
    except OSError:
        pass
