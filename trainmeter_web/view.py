"""``tm view [RUN]``: a run in the dashboard, rebuilt from its engine checkpoint and log, or its final snapshot as JSON.

A finished run is served from the log; a live one is caught up from the log and then followed on its bus, like the web
component does. It only reads the run directory and binds loopback unless told otherwise (then with a token).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from trainmeter_core import records as rec
from trainmeter_core import rundir, webport


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run", nargs="?", help="a run directory, a run name or its unique prefix (default: the latest)"
    )
    p.add_argument(
        "--json", action="store_true", help="print the final snapshot as JSON and exit (no server)"
    )
    p.add_argument("--runs-dir", help="where runs are (default: TM_RUNS_DIR, else ./.trainmeter/runs)")
    p.add_argument("--port", type=int, help="the dashboard's port (default 8765, or the next free one)")
    p.add_argument(
        "--host", default="127.0.0.1", help="the dashboard's address (non-loopback needs the token)"
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tm view", description=ViewCommand.help)
    add_arguments(p)
    return p


class ViewCommand:
    """``tm view`` as the ``trainmeter_commands`` hook describes a command: the CLI completes its built-in with it."""

    name = "view"
    help = "A run in the dashboard, rebuilt from its log (or its final snapshot as JSON)."

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        add_arguments(p)

    def run(self, args: argparse.Namespace) -> int:
        return run(args)


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    try:
        run_dir = rundir.resolve_run(args.run, rundir.runs_dir(args.runs_dir) if args.runs_dir else None)
    except rundir.RunDirError as exc:
        print(f"tm: {exc}", file=sys.stderr)
        return 2
    if args.json:
        return print_final_snapshot(run_dir)
    return serve(run_dir, args.host, args.port)


def print_final_snapshot(run_dir: Path) -> int:
    import msgspec

    from trainmeter_core.replay import final_snapshot

    stats: dict = {}
    snapshot = final_snapshot(run_dir, stats=stats)
    if snapshot is None:
        print(f"tm: {run_dir.name} has no record the engine can use yet", file=sys.stderr)
        return 1
    sys.stdout.write(msgspec.json.encode(rec.to_builtins(snapshot)).decode() + "\n")
    if stats.get("skipped"):
        print(f"tm: skipped {stats['skipped']} unreadable lines of the log", file=sys.stderr)
    return 0


def serve(run_dir: Path, host: str, port: int | None, stopping: threading.Event | None = None) -> int:
    """Serve the run's dashboard until Ctrl-C (or ``stopping``); follows the run live while it runs."""
    from trainmeter_web.follow import Follower, open_run, replay
    from trainmeter_web.guard import Guard
    from trainmeter_web.server import Server

    try:
        bound = webport.bind(host, port)
    except webport.WebPortError as exc:
        print(f"tm: {exc}", file=sys.stderr)
        return 2
    stopping = stopping or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopping.set())
    model, through_seq = open_run(run_dir)
    subscriber = None
    if rundir.is_live(run_dir):
        from trainmeter_core.bus import Subscriber, read_endpoints

        subscriber = Subscriber(read_endpoints(run_dir)["out"])
        follower = Follower(model, subscriber.recv, stopping, after_seq=through_seq)
        if not follower.catch_up():
            subscriber.close()
            return 0
    else:
        replay(model, run_dir, through_seq)
        if model.run_end is None:
            model.meta["lost"] = True  # no launcher holds it and it never ended: the run was lost
    server = Server(model, bound.sock, Guard(bound.host, bound.token))
    server.start()
    for line in bound.startup_lines():
        print(f"tm: {line}", file=sys.stderr)
    print(f"tm: viewing {run_dir.name} (Ctrl-C to stop)", file=sys.stderr)
    try:
        if subscriber is not None:
            follower.run_live(server.notify, until_run_end=False)
        else:
            server.notify()
            stopping.wait()
    finally:
        server.stop()
        if subscriber is not None:
            subscriber.close()
    return 0
