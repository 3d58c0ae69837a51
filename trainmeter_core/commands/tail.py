"""``tm tail``: a live run's records as JSON lines, or a finished run's log."""

from __future__ import annotations

import sys

from trainmeter_core.commands.stdout_lines import Output
from trainmeter_core.commands.usage import nearest, parser_for
from trainmeter_core.errors import UsageError


def cmd_tail(argv: list[str]) -> int:
    from trainmeter_core.model import records
    from trainmeter_core.runlog import rundir
    from trainmeter_core.runlog.reader import read_log

    parser = parser_for("tail", "A live run's records as JSON lines (or a finished run's log).")
    parser.add_argument(
        "run", nargs="?", help="a run directory, a run name or its unique prefix (default: the latest)"
    )
    parser.add_argument("--kind", action="append", help="only records of this kind (repeat for several)")
    parser.add_argument("--runs-dir")
    args = parser.parse_args(argv)
    for kind in args.kind or ():
        if kind not in records.KINDS:
            # A kind no record has would print nothing and look like a quiet run: name the kinds instead.
            guess = nearest(kind, records.KINDS)
            hint = f" (did you mean {guess}?)" if guess else ""
            raise UsageError(f"no record kind {kind}{hint}: the kinds are {', '.join(records.KINDS)}")
    run_dir = rundir.resolve_run(args.run, rundir.runs_dir(args.runs_dir) if args.runs_dir else None)
    kinds = set(args.kind) if args.kind else None
    out = Output()
    import msgspec

    encoder = msgspec.json.Encoder()

    def show(record) -> None:
        out.line(encoder.encode(records.to_builtins(record)).decode())

    if rundir.is_live(run_dir):
        from trainmeter_core.bus.client import subscribe

        for record in subscribe(run_dir, kinds):
            show(record)
            if out.broken:
                return 0
        return 0
    reader_stats: dict = {}
    for record in read_log(run_dir, kinds=kinds, stats=reader_stats):
        show(record)
        if out.broken:
            return 0
    if reader_stats.get("skipped"):
        print(f"tm: skipped {reader_stats['skipped']} unreadable lines of the log", file=sys.stderr)
    return 0
