"""``tm passport``: the run passport (passport.md, passport.json) for a model card."""

from __future__ import annotations

import sys

from trainmeter_core.commands.stdout_lines import Output
from trainmeter_core.commands.usage import parser_for
from trainmeter_core.errors import UsageError


def cmd_passport(argv: list[str]) -> int:
    from trainmeter_core.model import passport
    from trainmeter_core.runlog import replay, rundir

    parser = parser_for("passport", "The run passport (passport.md, passport.json) for a model card.")
    parser.add_argument(
        "run", nargs="?", help="a run directory, a run name or its unique prefix (default: the latest)"
    )
    parser.add_argument("--json", action="store_true", help="print passport.json instead of passport.md")
    parser.add_argument("--runs-dir")
    args = parser.parse_args(argv)
    run_dir = rundir.resolve_run(args.run, rundir.runs_dir(args.runs_dir) if args.runs_dir else None)
    stats: dict = {}
    snapshot = replay.final_snapshot(run_dir, stats)
    skipped = replay.skipped_line(stats)
    if skipped:  # as tm view --json says it: the passport leaves those lines out
        print(f"tm: {skipped}", file=sys.stderr)
    if snapshot is None:
        raise UsageError(f"{run_dir.name} has no records to make a passport from")
    data = passport.passport_data(snapshot, rundir.read_json(run_dir / "meta.json") or {})
    import json

    Output().line(json.dumps(data, indent=1) if args.json else passport.passport_markdown(data))
    return 0
