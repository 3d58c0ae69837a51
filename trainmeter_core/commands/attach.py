"""``tm attach PID``: its command line. The watch itself (``run/attach.py``) runs only once the line is taken and the
pid is one tm can watch; anything else is one line and exit status 2.
"""

from __future__ import annotations

import os

from trainmeter_core.commands.usage import parser_for

DESCRIPTION = "Watch a running program from outside (process tree, node, GPUs); Ctrl-C stops the watch, never the program."


def cmd_attach(argv: list[str]) -> int:
    parser = parser_for("attach", DESCRIPTION)
    parser.add_argument("pid", help="the process id of the running program")
    parser.add_argument("--name", help="the run's name (default: the program's name)")
    parser.add_argument("--runs-dir", help="where runs go (default: TM_RUNS_DIR, else ./.trainmeter/runs)")
    parser.add_argument(
        "--gpus", metavar="LIST", help="the GPUs it uses: indices or UUIDs (default: from its environment)"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no start line, only the summary")
    args = parser.parse_args(argv)
    # Imported only now: the watch loads the hub and the supervisor, which no other command needs.
    from trainmeter_core.bus.proctree import read_cmdline
    from trainmeter_core.run import attach
    from trainmeter_core.run.stderr_lines import Say

    pid = attach.check_pid(args.pid)
    target = attach.Target(pid)
    command = read_cmdline(pid) or []
    name = args.name or attach.program_name(command, pid)
    if args.gpus:
        os.environ["TM_GPUS"] = args.gpus  # components read it, as they do for `tm --gpus`
    return attach.watch(target, command, name, args.runs_dir, Say(args.quiet))
