"""The process that runs bus components: several built-ins as threads, or one plugin's component alone.

Started and restarted by the launcher's supervisor as ``python -m trainmeter_core.run.component_host``. It lowers its own
priority and raises its OOM score so the kernel never picks the trainer first, and it exits as soon as the launcher
is gone (end of file on the pipe the launcher holds, backed by a parent-death signal). It never touches the trainer.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

from trainmeter_core.bus.component import Component, ComponentContext, Stopping
from trainmeter_core.model import records
from trainmeter_core.run.child import lower_own_priority

THREAD_BACKOFF_MAX_S = 10.0
#: How long the stop waits for the components' threads, all together: less than the supervisor's 3 s before it kills
#: the process, so that a component that does not stop is named, with where it was, before its process ends.
STOP_JOIN_S = 2.5
#: The main thread's longest sleep between looks at its components' threads (each one's end wakes it at once).
WATCH_EVERY_S = 60.0


def die_with_parent(parent_pid: int) -> None:
    """Exit when the launcher dies: PR_SET_PDEATHSIG, and end of file on stdin (a pipe only the launcher holds)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the launcher died before the signal was armed
        os._exit(0)

    def watch() -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        os._exit(0)

    threading.Thread(target=watch, name="tm-parent-watch", daemon=True).start()


def find_components(names: list[str]) -> dict[str, type[Component]]:
    from trainmeter_core import plugins as plugins_mod

    plugins = plugins_mod.load()
    found: dict[str, type[Component]] = {}
    for hook in ("trainmeter_components", "trainmeter_sinks"):
        for _plugin, classes in plugins.per_plugin(hook):
            for cls in classes:
                found.setdefault(cls.name, cls)
    missing = [n for n in names if n not in found]
    if missing:
        raise SystemExit(f"tm: no component named {', '.join(missing)} among the loaded plugins")
    return {n: found[n] for n in names}


def run_component(cls: type[Component], run_dir: Path, process: str, stopping: threading.Event) -> None:
    """Run one component in this thread; a crash is reported and the component restarted with backoff."""
    crashes = 0
    while not stopping.is_set():
        ctx = None
        started = time.monotonic()
        try:
            ctx = ComponentContext(cls.name, run_dir, stopping, cls.subscribes, process=process)
            cls().run(ctx)
            return
        except Exception as exc:
            crashes = 0 if time.monotonic() - started > 30 else crashes + 1
            backoff = min(0.5 * 2 ** max(crashes - 1, 0), THREAD_BACKOFF_MAX_S)
            print(f"tm: component {cls.name} crashed: {type(exc).__name__}: {exc}", file=sys.stderr)
            if ctx is not None:
                ctx.publish(
                    records.Component(
                        name=cls.name,
                        event="crashed",
                        process=process,
                        child_pid=os.getpid(),
                        error=f"{type(exc).__name__}: {exc}",
                        restarts=crashes,
                        backoff_s=backoff,
                    )
                )
            stopping.wait(backoff)
        finally:
            if ctx is not None:
                ctx.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainmeter_core.run.component_host")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--process", required=True)
    parser.add_argument("--components", required=True)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    lower_own_priority(10)
    # Its pipe wakes the components waiting on the bus at the stop (ComponentContext.recv)
    stopping = Stopping()
    # Set by the stop and by each component's thread as it ends: the main thread sleeps until one of them happens (it
    # looked every 0.5 s before: two wakes a second in each component process, for nothing)
    changed = threading.Event()
    ended: list[str] = []  # the components whose threads are over (a thread is alive a little past its end)
    started: list[bool] = []  # not empty once the components' threads start
    stop_t: list[float] = []  # when the stop came

    def stop(*_: object) -> None:
        if not stop_t:
            stop_t.append(time.monotonic())
        stopping.set()
        changed.set()
        if not started:
            # The stop came while this process was still loading its components (plugins are imported here, slowly
            # at the lowered priority on a busy machine): none of them ran, and none would (run_component looks at
            # the stop first), so the process ends now instead of when the loading ends, which could be after the
            # supervisor's kill and its "was killed" (tests/e2e/test_supervision.py).
            os._exit(0)

    def run_then_say(cls: type[Component]) -> None:
        try:
            run_component(cls, args.run_dir, args.process, stopping)
        finally:
            ended.append(cls.name)
            changed.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides when components stop
    classes = find_components([n for n in args.components.split(",") if n])
    threads = [
        threading.Thread(target=run_then_say, args=(cls,), name=f"tm-{name}", daemon=True)
        for name, cls in classes.items()
    ]
    started.append(True)
    for thread in threads:
        thread.start()
    while True:
        changed.clear()  # before the look: what happens after it sets it again
        if stopping.is_set() or len(ended) == len(threads):
            break
        changed.wait(WATCH_EVERY_S)
    stopping.set()
    # From the stop itself: the supervisor's 3 s run from its SIGTERM, whenever this thread got to look
    deadline = (stop_t[0] if stop_t else time.monotonic()) + STOP_JOIN_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    say_stuck([thread for thread in threads if thread.is_alive()])
    return 0


def say_stuck(threads: list[threading.Thread]) -> None:
    """One line for each component thread still running at the stop's end: its name and its innermost frames (a
    component's thread is named ``tm-<component>``). Its process then exits without it."""
    frames = sys._current_frames()
    for thread in threads:
        frame = frames.get(thread.ident) if thread.ident is not None else None
        where = []
        while frame is not None and len(where) < 3:
            where.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
            frame = frame.f_back
        name = thread.name.removeprefix("tm-")
        try:
            sys.stderr.write(
                f"tm: component {name} did not stop within {STOP_JOIN_S:g} s of the stop and ends with its "
                f"process; it was at {' <- '.join(where) or 'an unknown place'}\n"
            )
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


if __name__ == "__main__":
    sys.exit(main())
