"""The ``tm`` command line: ``tm script.py [args]``, ``tm [options] -- CMD [args]``, and the subcommands.

Everything up to the script (or up to ``--``) is tm's; everything after belongs to the command, untouched. A wrong
option or value gets one line naming it and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainmeter_core import __version__
from trainmeter_core.commands.attach import cmd_attach
from trainmeter_core.commands.compare import cmd_compare
from trainmeter_core.commands.passport import cmd_passport
from trainmeter_core.commands.plugin_commands import plugin_command, plugin_commands
from trainmeter_core.commands.plugin_list import cmd_plugins
from trainmeter_core.commands.profile_import import cmd_import
from trainmeter_core.commands.runs import cmd_runs
from trainmeter_core.commands.tail import cmd_tail
from trainmeter_core.commands.usage import ArgumentParser, nearest, unknown_option
from trainmeter_core.commands.view import cmd_view
from trainmeter_core.errors import TmError, UsageError
from trainmeter_core.run.stderr_lines import Say

if TYPE_CHECKING:
    from trainmeter_core.run.run_options import RunOptions

USAGE = """usage: tm [options] script.py [args...]
       tm [options] -- CMD [args...]
       tm COMMAND [...]

Run a training script or any command under trainmeter, or one of:
  runs                 the runs under .trainmeter/runs, newest first
  tail [RUN]           a live run's records (or a finished log) as JSON lines
  view [RUN]           a run in the dashboard, rebuilt from its log (--json: its final snapshot)
  view A B [C ...]     runs side by side in the dashboard, their curves overlaid
  compare A B [C ...]  what differs between runs, and their headline numbers side by side (--json)
  passport [RUN]       the run passport for a model card
  import RUN FILE...   profiler results (torch.profiler traces; Nsight Systems with a plugin) into a run
  plugins              every plugin loaded, its distribution, version and what it provides
  peak                 measure a device's dense matmul peak on this machine (for MFU with no datasheet figure)
  attach PID           watch a program already running, from outside only
{plugin_commands}
Run options:
  --name NAME          the run's name (default: the script's name)
  --runs-dir DIR       where runs go (default: TM_RUNS_DIR, else ./.trainmeter/runs)
  --resume RUN         continue RUN (a preempted or crashed run) as its next attempt: one run, one timeline
  --new-run            a new run, even beside a live run of the same command or from an unfinished run's checkpoint
  --gpus LIST          the GPUs of the run (indices or UUIDs), when tm cannot tell
  --no-agent           watch from outside only: no agent inside the Python process
  --no-tap             do not read the trackers the loop uses (wandb, TensorBoard, MLflow)
  --no-web             no dashboard
  --port N             the dashboard's port (default 8765, or the next free one)
  --host ADDR          the dashboard's address (default 127.0.0.1; any other address requires the printed token)
  --heartbeat URL      ping URL (healthchecks.io style) every minute while the run lives and steps; off by default
  --profile-dir DIR    import the profiler traces in DIR at the end (torch.profiler's are found without it)
  --job HOST:PORT      the job hub of a job of several nodes, when tm cannot tell from torchrun or Slurm
  --node-rank K        this node's rank in the job (0 hosts the job hub)
  --nnodes N           the number of nodes in the job
  --job-keys DIR       a folder every node shares for the job's keys (default: TM_JOB_KEYS, else ~/.trainmeter/jobs)
  --no-job             run alone even under torchrun or Slurm with several nodes (docs/multinode.md)
  -q, --quiet          no start line, only the summary
  -h, --help           this help; tm COMMAND --help for a command's

What only you know (flags, or the same keys in tm.toml next to the script; 20B, 1.5e9, 300M accepted):
  --budget-tokens --budget-steps --budget-flops --tokens-per-step --flops-per-token --convention NAME
  --params --embedding-params --layers --d-model --seq-len --dp --plan-mfu --plan-hours
  --peak-tflops X --peak-source TEXT

Money, a view (never stored; the same options for view, report, compare and runs; docs/metrics.md#money):
  --price-per-gpu-hour PRICE
                       a price per GPU-hour such as 2.49 (else TM_PRICE_PER_GPU_HOUR, else tm.toml's price_per_gpu_hour)
  --price-currency CODE
                       the price's currency (default USD)
{plugin_options}"""


def _help_line(names: str, text: str | None) -> str:
    # The same columns as the lines above: two spaces, the names in 19, the help after.
    return (
        f"  {names:<19}  {text or ''}".rstrip() + "\n"
        if len(names) <= 19
        else f"  {names}\n{'':21}  {text or ''}\n"
    )


def usage_text() -> str:
    """``tm --help``: the built-in commands and options, then what the loaded plugins add (commands and options)."""
    commands = "".join(
        _help_line(command.name, (command.help or "").split("\n")[0])
        for _, command in plugin_commands()
        if command.name not in COMMANDS
    )
    parser = ArgumentParser(prog="tm", add_help=False)
    before = len(parser._actions)
    from trainmeter_core import plugins as plugins_mod

    plugins_mod.load().per_plugin("trainmeter_add_options", parser=parser)
    options = ""
    groups = [g for g in parser._action_groups if g._group_actions]
    for group in groups:
        actions = [a for a in group._group_actions if parser._actions.index(a) >= before]
        if not actions:
            continue
        title = group.title if group.title not in ("options", "optional arguments") else "plugins"
        options += f"\nRun options from {title}:\n"
        for action in actions:
            # A plugin's dest is an environment variable's name (TM_WEBHOOK_FORMAT), no word to show a user.
            shown = action.metavar or (
                "{" + ",".join(map(str, action.choices)) + "}" if action.choices else "VALUE"
            )
            metavar = f" {shown}" if action.nargs != 0 else ""
            options += _help_line(", ".join(action.option_strings) + metavar, action.help)
    return USAGE.format(plugin_commands=commands, plugin_options=options)


def run_parser() -> argparse.ArgumentParser:
    from trainmeter_core.model.declared import add_declared_arguments

    parser = ArgumentParser(prog="tm", add_help=False)
    parser.add_argument("--name")
    parser.add_argument("--runs-dir")
    parser.add_argument("--resume", metavar="RUN")
    parser.add_argument("--new-run", action="store_true")
    parser.add_argument("--gpus", help="the GPUs of the run: indices or UUIDs, comma-separated")
    parser.add_argument("--no-agent", action="store_true")
    parser.add_argument("--no-tap", action="store_true")
    parser.add_argument("--no-web", action="store_true")
    parser.add_argument("--port", type=int)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--heartbeat", metavar="URL", help="ping URL every minute while the run lives and steps"
    )
    parser.add_argument("--job", metavar="HOST:PORT")
    parser.add_argument("--node-rank", type=int)
    parser.add_argument("--nnodes", type=int)
    parser.add_argument("--job-keys", metavar="DIR")
    parser.add_argument("--no-job", action="store_true")
    parser.add_argument("-q", "--quiet", action="store_true")
    parser.add_argument(
        "--profile-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of profiler traces to import at the end of the run (torch.profiler's are found without it)",
    )
    add_declared_arguments(parser)
    from trainmeter_core.commands.price_options import add_price_arguments

    add_price_arguments(parser)
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

    from trainmeter_core.model.declared import DeclaredInputError, load_tm_toml, parse_declared

    folder = Path(command[0]).resolve().parent if script_mode else Path.cwd()
    toml_path = folder / "tm.toml"
    try:
        document = load_tm_toml(toml_path) if toml_path.is_file() else {}
        declared = parse_declared(vars(args), document, str(toml_path) if document else None)
    except DeclaredInputError as exc:
        raise UsageError(str(exc)) from None
    if not document:
        return declared  # no tm.toml: no [alerts] table to check (and the alert rules stay unimported)
    from trainmeter_core.model.alerts import check_tm_toml, unknown_rule_tables

    rules = None
    if unknown_rule_tables(document):
        # A table no built-in rule owns may be a plugin's rule: load the plugins' rules (only now: a plain start
        # imports no plugin) and refuse the table only if none of them has that name either.
        from trainmeter_core import plugins as plugins_mod
        from trainmeter_core.components.alerts import collect_rules

        rules, _ = collect_rules(plugins_mod.load())
    problems = check_tm_toml(document, str(toml_path), rules)
    if problems:
        raise UsageError(problems[0])
    return declared


def run_price(args: argparse.Namespace, command: list[str], script_mode: bool) -> dict[str, str]:
    """The price a run was given (``--price-per-gpu-hour``, else the environment, else tm.toml next to the script),
    as the variables that hand it to the components; none without one."""
    from pathlib import Path

    from trainmeter_core.commands.price_options import price_from
    from trainmeter_core.model import money

    folder = Path(command[0]).resolve().parent if script_mode else Path.cwd()
    return money.handed_on(price_from(args, folder))


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


def _unknown_options(head: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """The options in tm's part of the command line that the parser does not have (a value such as -5 is no option)."""
    takes_value = {opt for action in parser._actions if action.nargs != 0 for opt in action.option_strings}
    known = {opt for action in parser._actions for opt in action.option_strings}
    unknown = []
    i = 0
    while i < len(head):
        token = head[i]
        i += 1
        if token in takes_value:
            i += 1  # its value, whatever it looks like
        elif token.startswith("-") and token.split("=", 1)[0] not in known:
            unknown.append(token)
    return unknown


def cmd_run(argv: list[str]) -> int:
    """``tm [options] script.py [args]`` or ``tm [options] -- CMD [args]``: run the command under tm."""
    from trainmeter_core.run.launcher import run

    return run(run_options(argv))


def run_options(argv: list[str]) -> RunOptions:
    """tm's options and the command, taken apart; a ``UsageError`` for an option no one has or a missing command."""
    from pathlib import Path

    from trainmeter_core.run.run_options import RunOptions

    parser = run_parser()
    head, command, script_mode = split_run_argv(argv, parser)
    plugin_dests: list[str] = []
    if _unknown_options(head, parser):
        # An option tm does not know may belong to a plugin: load them (only now, to keep a plain start fast).
        plugin_dests = add_plugin_options(parser)
        head, command, script_mode = split_run_argv(argv, parser)
    unknown = _unknown_options(head, parser)
    if unknown:
        # Before anything else: the value after a misspelt option would otherwise pass for the command.
        raise unknown_option(unknown[0], parser, "tm --help lists tm's options and the plugins'")
    if not command:
        raise UsageError("no command to run: tm script.py [args] or tm -- CMD [args] (tm --help)")
    args = parser.parse_args(head)
    declared = declared_inputs(args, command, script_mode)
    # Plugin options travel to the plugin's component as environment variables named by their dest.
    plugin_env = {d: str(getattr(args, d)) for d in plugin_dests if getattr(args, d, None) is not None}
    if args.heartbeat:
        plugin_env["TM_HEARTBEAT_URL"] = args.heartbeat
    # The price goes to the components alone (the dashboard, the exporter), which hold it in memory; never to the log.
    plugin_env.update(run_price(args, command, script_mode))
    return RunOptions(
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
        profile_dirs=[str(Path(d).absolute()) for d in args.profile_dir],
        job=args.job,
        node_rank=args.node_rank,
        nnodes=args.nnodes,
        job_keys=args.job_keys,
        no_job=args.no_job,
        resume=args.resume,
        new_run=args.new_run,
    )


def cmd_peak(argv: list[str]) -> int:
    from trainmeter_core.commands import peak

    return peak.main(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "attach": cmd_attach,
    "import": cmd_import,
    "compare": cmd_compare,
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


def main(argv: list[str] | None = None) -> int:
    """tm's edge: the one place a ``TmError`` (or a run directory that is not there) becomes one line on stderr and
    its exit status; anything else is a bug, and keeps its traceback."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return dispatch(argv)
    except TmError as exc:
        return refuse(exc)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from trainmeter_core.runlog.rundir import RunDirError

        if isinstance(exc, RunDirError):
            return refuse(UsageError(str(exc)))
        raise


def refuse(error: TmError) -> int:
    """The error's one line on stderr, in tm's voice; returns its exit status."""
    Say()(str(error), always=True)
    return error.exit_status


def dispatch(argv: list[str]) -> int:
    """The help, the version, a built-in subcommand, a plugin's, or else a command to run."""
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(usage_text())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"tm {__version__}")
        return 0
    handler = COMMANDS.get(argv[0])
    if handler is not None:
        return handler(argv[1:])
    if not argv[0].startswith("-") and not _looks_like_a_script(argv[0]):
        offered = plugin_commands()
        command = plugin_command(argv[0], builtin_names=COMMANDS, offered=offered)
        if command is not None:
            parser = ArgumentParser(prog=f"tm {command.name}", description=command.help)
            command.add_arguments(parser)
            return int(command.run(parser.parse_args(argv[1:])) or 0)
        guess = nearest(argv[0], [*COMMANDS, *(c.name for _, c in offered)])
        if guess is not None:
            raise UsageError(f"no command `tm {argv[0]}` and no file {argv[0]}: did you mean `tm {guess}`?")
    return cmd_run(argv)


if __name__ == "__main__":
    sys.exit(main())
