"""``tm view [RUN]``: a run in the dashboard, or its final snapshot as JSON; ``tm view A B ...``: runs side by side.

A finished run is replayed here from its engine's checkpoint and the log after it (no engine runs then); a live one is
followed like the web component does, its numbers from the run's engine. It only reads the run directory and binds
loopback unless told otherwise (then with a token).
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from trainmeter_core.model import money, records
from trainmeter_core.runlog import rundir


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run",
        nargs="*",
        metavar="RUN",
        help="a run directory, a run name or its unique prefix (default: the latest); two or more: side by side",
    )
    p.add_argument(
        "--json", action="store_true", help="print the final snapshot as JSON and exit (no server)"
    )
    p.add_argument("--runs-dir", help="where runs are (default: TM_RUNS_DIR, else ./.trainmeter/runs)")
    p.add_argument("--port", type=int, help="the dashboard's port (default 8765, or the next free one)")
    p.add_argument(
        "--host", default="127.0.0.1", help="the dashboard's address (non-loopback needs the token)"
    )
    from trainmeter_core.commands.price_options import add_price_arguments

    add_price_arguments(p)


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
    from trainmeter_core.commands.price_options import price_from
    from trainmeter_core.errors import UsageError

    refs = args.run if isinstance(args.run, list) else [args.run] if args.run else []
    try:
        price = price_from(args)
    except UsageError as exc:
        print(f"tm: {exc}", file=sys.stderr)
        return 2
    if len(refs) > 1:
        from trainmeter_core.commands.compare import resolve_runs
        from trainmeter_core.errors import UsageError
        from trainmeter_web import compare

        try:
            if args.json:
                raise UsageError(
                    "tm view --json prints one run's snapshot: tm compare --json A B compares runs"
                )
            return compare.serve(resolve_runs(refs, args.runs_dir), args.host, args.port, price=price)
        except UsageError as exc:
            print(f"tm: {exc}", file=sys.stderr)
            return 2
    try:
        run_dir = rundir.resolve_run(
            refs[0] if refs else None, rundir.runs_dir(args.runs_dir) if args.runs_dir else None
        )
    except rundir.RunDirError as exc:
        print(f"tm: {exc}", file=sys.stderr)
        return 2
    if args.json:
        return print_final_snapshot(run_dir)
    return serve(run_dir, args.host, args.port, price=price)


def print_final_snapshot(run_dir: Path) -> int:
    import msgspec

    from trainmeter_core.runlog.replay import final_snapshot, skipped_line

    stats: dict = {}
    snapshot = final_snapshot(run_dir, stats=stats)
    if snapshot is None:
        print(f"tm: {run_dir.name} has no record the engine can use yet", file=sys.stderr)
        return 1
    sys.stdout.write(msgspec.json.encode(records.to_builtins(snapshot)).decode() + "\n")
    skipped = skipped_line(stats)
    if skipped:
        print(f"tm: {skipped}", file=sys.stderr)
    return 0


def serve(
    run_dir: Path,
    host: str,
    port: int | None,
    stopping: threading.Event | None = None,
    price: money.Price | None = None,
) -> int:
    """Serve the run's dashboard until Ctrl-C (or ``stopping``). A live run is followed like the web component does
    (its engine's numbers); a finished one is replayed here, since no engine runs then: either way, one engine.
    ``price`` (the viewer's) puts money on the page; it stays in this process's memory."""
    from trainmeter_web.follow import Following, finished_dashboard
    from trainmeter_web.guard import Guard
    from trainmeter_web.server import Server, listen

    listening = listen(host, port, stopping)
    if listening is None:
        return 2
    bound, stopping = listening
    following = None
    if rundir.is_live(run_dir):
        following = Following(run_dir, stopping)
        if following.dashboard is None:
            following.close()
            return 0
        dashboard = following.dashboard
    else:
        dashboard = finished_dashboard(run_dir)
    dashboard.set_price(price)
    server = Server(dashboard, bound.sock, Guard(bound.host, bound.token))
    server.start()
    for line in bound.startup_lines():
        print(f"tm: {line}", file=sys.stderr)
    skipped = dashboard.skipped_line()
    if skipped:
        print(f"tm: {skipped}", file=sys.stderr)  # the page says it too, among the run's warnings
    print(f"tm: viewing {run_dir.name} (Ctrl-C to stop)", file=sys.stderr)
    try:
        if following is not None:
            following.follower.run_live(server.notify)
        else:
            server.notify()
            stopping.wait()
    finally:
        server.stop()
        if following is not None:
            following.close()
    return 0
