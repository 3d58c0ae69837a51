"""``tm view``: the dashboard's command when it is installed, else (and with ``--json``) the final snapshot as JSON.

Its options are the dashboard's (``--port``, ``--host``) when the dashboard is installed, so ``tm view --help`` shows
them; it only reads the run directory.
"""

from __future__ import annotations

import sys

from trainmeter_core.commands.plugin_commands import plugin_command
from trainmeter_core.commands.price_options import add_price_arguments, price_from
from trainmeter_core.commands.stdout_lines import Output
from trainmeter_core.commands.usage import parser_for
from trainmeter_core.errors import UsageError
from trainmeter_core.model import money

DESCRIPTION = "A run in the dashboard, rebuilt from its log (or its final snapshot as JSON)."


def cmd_view(argv: list[str]) -> int:
    command = plugin_command("view")
    parser = parser_for("view", command.help if command is not None else DESCRIPTION)
    if command is not None:
        command.add_arguments(parser)
    else:
        parser.add_argument(
            "run", nargs="?", help="a run directory, a run name or its unique prefix (default: the latest)"
        )
        parser.add_argument(
            "--json", action="store_true", help="print the run's final snapshot as JSON and exit"
        )
        parser.add_argument(
            "--runs-dir", help="where runs are (default: TM_RUNS_DIR, else ./.trainmeter/runs)"
        )
        add_price_arguments(parser)
    args = parser.parse_args(argv)
    if not args.json:
        if command is None:
            raise UsageError("the dashboard is not installed (trainmeter_web): use tm view --json RUN")
        return int(command.run(args) or 0)
    runs = args.run if isinstance(args.run, list) else [args.run] if args.run else []
    if len(runs) > 1:
        raise UsageError("tm view --json prints one run's snapshot: tm compare --json A B compares runs")
    return print_final_snapshot(runs[0] if runs else None, args.runs_dir, price_from(args))


def print_final_snapshot(run: str | None, runs_dir: str | None, price: money.Price | None = None) -> int:
    """The run's final snapshot as one line of JSON; with a price, its money beside the snapshot's keys (``money``,
    ``model/money.py``), which the snapshot itself never holds."""
    from trainmeter_core.model import records
    from trainmeter_core.runlog import replay, rundir

    run_dir = rundir.resolve_run(run, rundir.runs_dir(runs_dir) if runs_dir else None)
    stats: dict = {}
    snapshot = replay.final_snapshot(run_dir, stats)
    skipped = replay.skipped_line(stats)
    if skipped:
        print(f"tm: {skipped}", file=sys.stderr)
    if snapshot is None:
        raise UsageError(f"{run_dir.name} has no records to replay")
    import msgspec

    doc = records.to_builtins(snapshot)
    if price is not None:
        doc["money"] = money.overlay(snapshot, price)
    Output().line(msgspec.json.encode(doc).decode())
    return 0
