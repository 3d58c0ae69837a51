"""The ``tm`` command line: ``tm script.py [args]``, ``tm [options] -- CMD [args]``, and the subcommands.

Everything up to the script (or up to ``--``) is tm's; everything after belongs to the command, untouched. A wrong
option or value gets one line naming it and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from trainmeter_core import __version__

USAGE = """usage: tm [options] script.py [args...]
       tm [options] -- CMD [args...]
       tm COMMAND [...]

Run a training script or any command under trainmeter, or one of:
  runs                 the runs under .trainmeter/runs, newest first
  tail [RUN]           a live run's records (or a finished log) as JSON lines
  view [RUN]           a run in the dashboard, rebuilt from its log (--json: its final snapshot)
  passport [RUN]       the run passport for a model card
  plugins              every plugin loaded, its distribution, version and what it provides
  peak                 measure a device's dense matmul peak on this machine (for MFU with no datasheet figure)
  attach PID           watch a program already running, from outside only

Run options:
  --name NAME          the run's name (default: the script's name)
  --runs-dir DIR       where runs go (default: TM_RUNS_DIR, else ./.trainmeter/runs)
  --gpus LIST          the GPUs of the run (indices or UUIDs), when tm cannot tell
  --no-agent           watch from outside only: no agent inside the Python process
  --no-tap             do not read the trackers the loop uses (wandb, TensorBoard, MLflow)
  --no-web             no dashboard
  --port N             the dashboard's port (default 8765, or the next free one)
  --host ADDR          the dashboard's address (default 127.0.0.1; any other address requires the printed token)
  --heartbeat URL      ping URL (healthchecks.io style) every minute while the run lives and steps; off by default
  -q, --quiet          no start line, only the summary
  -h, --help           this help; tm COMMAND --help for a command's

What only you know (flags, or the same keys in tm.toml next to the script; 20B, 1.5e9, 300M accepted):
  --budget-tokens --budget-steps --budget-flops --tokens-per-step --flops-per-token --convention NAME
  --params --embedding-params --layers --d-model --seq-len --dp --plan-mfu --plan-hours
  --peak-tflops X --peak-source TEXT
"""


class UsageError(Exception):
    """A command line tm cannot take: one line, exit 2."""


class _RunParser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise UsageError(f"{message} (tm --help)")


def run_parser() -> argparse.ArgumentParser:
    from trainmeter_core.declared import add_declared_arguments

    parser = _RunParser(prog="tm", add_help=False, exit_on_error=False)
    parser.add_argument("--name")
    parser.add_argument("--runs-dir")
    parser.add_argument("--gpus", help="the GPUs of the run: indices or UUIDs, comma-separated")
    parser.add_argument("--no-agent", action="store_true")
    parser.add_argument("--no-tap", action="store_true")
    parser.add_argument("--no-web", action="store_true")
    parser.add_argument("--port", type=int)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--heartbeat", metavar="URL", help="ping URL every minute while the run lives and steps"
    )
    parser.add_argument("-q", "--quiet", action="store_true")
    add_declared_arguments(parser)
    return parser


def add_plugin_options(parser: argparse.ArgumentParser) -> list[str]:
    """Let plugins add their run options (``trainmeter_add_options``); returns the dests they added."""
    from trainmeter_core import plugins as plugins_mod

    before = {action.dest for action in parser._actions}
    plugins_mod.load().per_plugin("trainmeter_add_options", parser=parser)
    return [action.dest for action in parser._actions if action.dest not in before]


def declared_inputs(args: argparse.Namespace, command: list[str], script_mode: bool) -> dict:
    """Declared inputs from the flags and from ``tm.toml`` next to the script (or in the current directory)."""
    from pathlib import Path

    from trainmeter_core.declared import DeclaredInputError, load_tm_toml, parse_declared

    folder = Path(command[0]).resolve().parent if script_mode else Path.cwd()
    toml_path = folder / "tm.toml"
    try:
        document = load_tm_toml(toml_path) if toml_path.is_file() else {}
        declared = parse_declared(vars(args), document, str(toml_path) if document else None)
    except DeclaredInputError as exc:
        raise UsageError(str(exc)) from None
    from trainmeter_core.alert_rules import check_tm_toml

    problems = check_tm_toml(document, str(toml_path))
    if problems:
        raise UsageError(problems[0])
    return declared


def split_run_argv(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], list[str], bool]:
    """(tm's options, the command, script mode): tm's options end at ``--`` or at the first non-option."""
    takes_value = {
        opt
        for action in parser._actions
        for opt in action.option_strings
        if action.nargs != 0 and action.option_strings
    }
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return argv[:i], argv[i + 1 :], False
        if arg.startswith("-") and arg != "-":
            i += 2 if arg in takes_value else 1
            continue
        return argv[:i], argv[i:], True
    return argv, [], True


def cmd_run(argv: list[str]) -> int:
    from trainmeter_core.launcher import RunOptions, run

    parser = run_parser()
    head, command, script_mode = split_run_argv(argv, parser)
    plugin_dests: list[str] = []
    known = {opt for action in parser._actions for opt in action.option_strings}
    if any(tok.split("=")[0] not in known for tok in head if tok.startswith("-")):
        # An option tm does not know may belong to a plugin: load them (only now, to keep a plain start fast).
        plugin_dests = add_plugin_options(parser)
        head, command, script_mode = split_run_argv(argv, parser)
    if not command:
        raise UsageError("no command to run: tm script.py [args] or tm -- CMD [args] (tm --help)")
    try:
        args = parser.parse_args(head)
    except argparse.ArgumentError as exc:
        raise UsageError(str(exc)) from None
    except SystemExit:  # argparse exits for an unrecognised option even with exit_on_error=False
        raise UsageError(
            f"unknown option in `{' '.join(head)}`: tm --help lists tm's own, plugins add theirs"
        ) from None
    declared = declared_inputs(args, command, script_mode)
    # Plugin options travel to the plugin's component as environment variables named by their dest.
    plugin_env = {d: str(getattr(args, d)) for d in plugin_dests if getattr(args, d, None) is not None}
    if args.heartbeat:
        plugin_env["TM_HEARTBEAT_URL"] = args.heartbeat
    return run(
        RunOptions(
            command=command,
            script_mode=script_mode,
            name=args.name,
            runs_dir=args.runs_dir,
            agent=not args.no_agent,
            quiet=args.quiet,
            gpus=args.gpus,
            tap=not args.no_tap,
            web=not args.no_web,
            host=args.host,
            port=args.port,
            component_env=plugin_env,
            declared=declared,
        )
    )


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=f"tm {prog}", description=description)


def cmd_plugins(argv: list[str]) -> int:
    from trainmeter_core import plugins as plugins_mod

    parser = _parser("plugins", "Every plugin loaded, its distribution and version, and what it provides.")
    parser.add_argument("--json", action="store_true", help="one JSON object per plugin")
    args = parser.parse_args(argv)
    infos = plugins_mod.load(plugins_mod.GROUP).infos + plugins_mod.load(plugins_mod.AGENT_GROUP).infos
    out = Output()
    for info in infos:
        if args.json:
            import msgspec

            out.line(msgspec.json.encode(info).decode())
            continue
        dist = f"{info.distribution or '?'} {info.version or ''}".strip()
        if info.error:
            out.line(f"{info.name:<16} {info.group:<17} {dist:<24} FAILED: {info.error}")
        else:
            out.line(f"{info.name:<16} {info.group:<17} {dist:<24} {', '.join(info.provides) or '-'}")
    return 0


def cmd_runs(argv: list[str]) -> int:
    from trainmeter_core import rundir

    parser = _parser("runs", "The runs under the runs directory, newest first.")
    parser.add_argument("--runs-dir")
    args = parser.parse_args(argv)
    base = rundir.runs_dir(args.runs_dir)
    out = Output()
    runs = rundir.list_runs(base)
    if not runs:
        out.line(f"no runs under {base}")
        return 0
    for path in runs:
        info = rundir.run_info(path)
        steps = info.steps
        if steps is None:
            steps = count_steps(path)
        if info.start_wall is None:
            duration = "?"
        else:
            end = info.end_wall or (time.time() if info.state == "running" else last_wall(path))
            duration = _duration(end - info.start_wall) if end else "?"
        out.line(
            f"{info.name:<48} {info.state:<18} {duration:>9} {steps if steps is not None else '?':>8} steps"
        )
    return 0


def count_steps(run_dir) -> int | None:
    from trainmeter_core.logread import read_log

    n = 0
    for record in read_log(run_dir, kinds={"step"}):
        if getattr(record, "rank", None) in (None, 0):
            n += 1
    return n


def last_wall(run_dir) -> float | None:
    from trainmeter_core.logread import read_log

    wall = None
    for record in read_log(run_dir):
        wall = getattr(record, "wall", wall) or wall
    return wall


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def cmd_tail(argv: list[str]) -> int:
    from trainmeter_core import records as rec
    from trainmeter_core import rundir
    from trainmeter_core.logread import read_log

    parser = _parser("tail", "A live run's records as JSON lines (or a finished run's log).")
    parser.add_argument(
        "run", nargs="?", help="a run directory, a run name or its unique prefix (default: the latest)"
    )
    parser.add_argument("--kind", action="append", help="only records of this kind (repeat for several)")
    parser.add_argument("--runs-dir")
    args = parser.parse_args(argv)
    run_dir = rundir.resolve_run(args.run, rundir.runs_dir(args.runs_dir) if args.runs_dir else None)
    kinds = set(args.kind) if args.kind else None
    out = Output()
    import msgspec

    encoder = msgspec.json.Encoder()

    def show(record) -> None:
        out.line(encoder.encode(rec.to_builtins(record)).decode())

    if rundir.is_live(run_dir):
        from trainmeter_core.bus import subscribe

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


class Output:
    """stdout for tm's own output: a reader that went away (``| head -1``) ends it quietly."""

    def __init__(self) -> None:
        self.broken = False

    def line(self, text: str) -> None:
        if self.broken:
            return
        try:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            self.broken = True
            # Stop the interpreter from complaining when it flushes stdout at exit.
            import os

            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())


def cmd_view(argv: list[str]) -> int:
    from trainmeter_core import records as rec
    from trainmeter_core import replay, rundir

    parser = _parser("view", "A run in the dashboard, rebuilt from its log (or its final snapshot as JSON).")
    parser.add_argument(
        "run", nargs="?", help="a run directory, a run name or its unique prefix (default: the latest)"
    )
    parser.add_argument("--json", action="store_true", help="print the run's final snapshot as JSON and exit")
    parser.add_argument("--runs-dir")
    args, rest = parser.parse_known_args(argv)
    if not args.json:
        command = plugin_command("view", builtin_ok=True)
        if command is None:
            raise UsageError("the dashboard is not installed (trainmeter_web): use tm view --json RUN")
        sub = argparse.ArgumentParser(prog="tm view", description=command.help)
        command.add_arguments(sub)
        return int(command.run(sub.parse_args(argv)) or 0)
    run_dir = rundir.resolve_run(args.run, rundir.runs_dir(args.runs_dir) if args.runs_dir else None)
    stats: dict = {}
    snapshot = replay.final_snapshot(run_dir, stats)
    if stats.get("skipped"):
        reasons = ", ".join(f"{n} {r}" for r, n in sorted(stats["reasons"].items()))
        print(f"tm: skipped {stats['skipped']} unreadable lines of the log ({reasons})", file=sys.stderr)
    if snapshot is None:
        raise UsageError(f"{run_dir.name} has no records to replay")
    import msgspec

    Output().line(msgspec.json.encode(rec.to_builtins(snapshot)).decode())
    return 0


def cmd_passport(argv: list[str]) -> int:
    from trainmeter_core import passport, replay, rundir

    parser = _parser("passport", "The run passport (passport.md, passport.json) for a model card.")
    parser.add_argument(
        "run", nargs="?", help="a run directory, a run name or its unique prefix (default: the latest)"
    )
    parser.add_argument("--json", action="store_true", help="print passport.json instead of passport.md")
    parser.add_argument("--runs-dir")
    args = parser.parse_args(argv)
    run_dir = rundir.resolve_run(args.run, rundir.runs_dir(args.runs_dir) if args.runs_dir else None)
    snapshot = replay.final_snapshot(run_dir)
    if snapshot is None:
        raise UsageError(f"{run_dir.name} has no records to make a passport from")
    data = passport.passport_data(snapshot, rundir.read_json(run_dir / "meta.json") or {})
    import json

    Output().line(json.dumps(data, indent=1) if args.json else passport.passport_markdown(data))
    return 0


def cmd_attach(argv: list[str]) -> int:
    from trainmeter_core import attach

    return attach.main(argv)


def cmd_peak(argv: list[str]) -> int:
    from trainmeter_core import peak

    return peak.main(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "attach": cmd_attach,
    "passport": cmd_passport,
    "peak": cmd_peak,
    "view": cmd_view,
    "plugins": cmd_plugins,
    "runs": cmd_runs,
    "tail": cmd_tail,
}


def _looks_like_a_script(arg: str) -> bool:
    import os

    return arg.endswith(".py") or os.sep in arg or os.path.exists(arg)


def plugin_command(name: str, builtin_ok: bool = False):
    """A ``tm`` subcommand provided by a plugin (``trainmeter_commands``), or None.

    ``builtin_ok`` lets a plugin complete a built-in command (the dashboard serves ``tm view``).
    """
    from trainmeter_core import plugins as plugins_mod

    plugins = plugins_mod.load()
    for plugin_name, commands in plugins.per_plugin("trainmeter_commands"):
        for command in commands:
            if getattr(command, "name", None) == name:
                if name in COMMANDS and not builtin_ok:
                    print(
                        f"tm: plugin {plugin_name} offers `tm {name}`, which tm itself has: ignored",
                        file=sys.stderr,
                    )
                    return None
                return command
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if not argv or argv[0] in ("-h", "--help", "help"):
            sys.stdout.write(USAGE)
            return 0 if argv else 2
        if argv[0] == "--version":
            print(f"tm {__version__}")
            return 0
        handler = COMMANDS.get(argv[0])
        if handler is not None:
            return handler(argv[1:])
        if not argv[0].startswith("-") and not _looks_like_a_script(argv[0]):
            command = plugin_command(argv[0])
            if command is not None:
                parser = argparse.ArgumentParser(prog=f"tm {command.name}", description=command.help)
                command.add_arguments(parser)
                return int(command.run(parser.parse_args(argv[1:])) or 0)
        return cmd_run(argv)
    except UsageError as exc:
        print(f"tm: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from trainmeter_core.rundir import RunDirError

        if isinstance(exc, RunDirError):
            print(f"tm: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
