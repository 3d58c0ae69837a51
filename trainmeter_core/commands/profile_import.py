"""``tm import RUN FILE_OR_DIR...``: profiler results into a run, through the importer plugins.

Everything is read and checked before anything is written; a refusal is one line and exit status 2, with nothing
written. Into a live run the records go through its hub; into a finished one its log is reopened as a new segment
and its ``summary.json`` and passport are rewritten (``run/profile_import.py``).
"""

from __future__ import annotations

from pathlib import Path

from trainmeter_core.commands.stdout_lines import Output
from trainmeter_core.commands.usage import parser_for
from trainmeter_core.errors import UsageError

DESCRIPTION = "Import profiler results (torch.profiler Chrome traces built in; more through importer plugins) into a run."


def cmd_import(argv: list[str]) -> int:
    from trainmeter_core import plugins as plugins_mod
    from trainmeter_core.run import profile_import
    from trainmeter_core.run.stderr_lines import Say
    from trainmeter_core.runlog import rundir

    parser = parser_for("import", DESCRIPTION)
    parser.add_argument("run", help="a run directory, a run name or its unique prefix")
    parser.add_argument("paths", nargs="+", metavar="FILE_OR_DIR", help="trace files, or folders of them")
    parser.add_argument(
        "--force", action="store_true", help="import a trace from another host, process or time all the same"
    )
    parser.add_argument("--runs-dir", help="where runs are (default: TM_RUNS_DIR, else ./.trainmeter/runs)")
    args = parser.parse_args(argv)
    say = Say()
    run_dir = rundir.resolve_run(args.run, rundir.runs_dir(args.runs_dir) if args.runs_dir else None)
    importers, problems = profile_import.load_importers(plugins_mod.load())
    for line in problems:
        say(line)
    try:
        found, problems = profile_import.choose([Path(p) for p in args.paths], importers)
        for line in problems:
            say(line)
        live = rundir.is_live(run_dir)
        prepared = profile_import.prepare(run_dir, found, live=live, force=args.force, say=say)
        if live:
            profile_import.send_live(run_dir, prepared.records)
        elif not profile_import.write_finished(run_dir, prepared.records, say):
            profile_import.send_live(
                run_dir, prepared.records
            )  # it started living meanwhile: its hub takes them
    except profile_import.ImportRefused as exc:
        raise UsageError(f"{exc}; nothing imported") from None
    out = Output()
    for trace in prepared.traces:
        out.line(profile_import.describe(trace))
    files = len(prepared.files)
    where = "through its hub" if live else "into its log, summary and passport"
    say(
        f"imported {files} file{'s' if files != 1 else ''} ({len(prepared.records)} records) into {run_dir.name} {where}"
    )
    return 0


__all__ = ["cmd_import"]
