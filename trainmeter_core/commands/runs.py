"""``tm runs``: the runs under the runs directory, newest first, one line each (a resumed run once, with its attempts;
the scheduler's ids where it ran under one); ``tm runs RUN``: one run's job identity and where its paid GPU time went,
as Slurm's ``seff`` sums up a job."""

from __future__ import annotations

import os
import time

from trainmeter_core.commands.price_options import add_price_arguments, price_from
from trainmeter_core.commands.stdout_lines import Output
from trainmeter_core.commands.usage import parser_for
from trainmeter_core.model import money


def cmd_runs(argv: list[str]) -> int:
    from trainmeter_core.runlog import rundir

    parser = parser_for("runs", "The runs under the runs directory, newest first; one run's paid time.")
    parser.add_argument(
        "run",
        nargs="?",
        help="a run directory, a run name or its unique prefix: its job and paid time, as seff",
    )
    parser.add_argument("--runs-dir")
    add_price_arguments(parser)
    args = parser.parse_args(argv)
    price = price_from(args)
    if args.run is not None:
        return one_run(args.run, args.runs_dir, price)
    base = rundir.runs_dir(args.runs_dir)
    out = Output()
    runs = rundir.list_runs(base)
    if not runs:
        out.line(f"no runs under {base}{where_it_looked(args.runs_dir)}")
        return 0
    absent: dict[str, list[str]] = {}  # why a run has no money: the runs it holds for
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
        attempts = f"  {info.attempts} attempts" if info.attempts > 1 else ""
        cost = ""
        if price is not None:
            cost, why = money_cell(path, info.state, price)
            if why:
                absent.setdefault(why, []).append(info.name)
            cost = f" {cost:>14}"
        out.line(
            f"{info.name:<48} {info.state:<18} {duration:>9} {steps if steps is not None else '?':>8} steps"
            f"{cost}{attempts}{identity_words(info.job_identity)}"
        )
    if price is not None:
        out.line(f"money: spent so far at {price.words()}")
        for why, names in absent.items():
            out.line(f"  n/a ({len(names)} run{'s' if len(names) > 1 else ''}): {why}")
    return 0


def identity_words(ids: dict | None) -> str:
    """What a ``tm runs`` line ends with for a run under a scheduler: ``  slurm 4242.0 (array 4240_7)  pod ml/x``."""
    from trainmeter_core.model import job_identity

    words = job_identity.short_words(ids)
    return f"  {words}" if words else ""


def one_run(ref: str, runs_dir: str | None, price: money.Price | None = None) -> int:
    """``tm runs RUN``: the run's state, its job identity and its paid time (``model/paid_time``), one figure a line,
    each unknown one with its reason. The numbers are a replay's final snapshot and the log's GPU samples."""
    import sys

    from trainmeter_core.model import job_identity, paid_time
    from trainmeter_core.runlog import replay, rundir
    from trainmeter_core.runlog.gpu_usage import gpu_usage

    run_dir = rundir.resolve_run(ref, rundir.runs_dir(runs_dir) if runs_dir else None)
    info = rundir.run_info(run_dir)
    stats: dict = {}
    snapshot = replay.final_snapshot(run_dir, stats)
    skipped = replay.skipped_line(stats)
    if skipped:
        print(f"tm: {skipped}", file=sys.stderr)
    out = Output()
    out.line(f"Run: {info.name}")
    out.line(f"State: {info.state}")
    for line in job_identity.lines(info.job_identity):
        out.line(line if info.job_identity is not None else f"Job identity: {line}")
    if snapshot is None:
        out.line("Paid time: n/a (the run has no record the engine can use)")
        return 0
    for line in paid_time.lines(paid_time.paid_time(snapshot, gpu_usage(run_dir), price=price)):
        out.line(line)
    return 0


def money_cell(run_dir, state: str, price: money.Price) -> tuple[str, str | None]:
    """A run's money spent at ``price``: a finished run's from its summary's final snapshot, a live or lost one's from
    its engine's last checkpointed snapshot; the text and, where it is n/a, why."""
    from trainmeter_core.runlog import rundir

    if state.startswith("finished"):
        doc = money.overlay_of_summary(rundir.read_json(run_dir / "summary.json") or {}, price)
    else:
        from trainmeter_core.runlog.checkpoint import load_history

        found = load_history(run_dir)
        if found is None or found.snapshot is None:
            return "n/a", "no snapshot yet (the engine checkpoints a live run's now and then)"
        doc = money.overlay(found.snapshot, price)
    spent = doc.get("figures", {}).get("spent", doc)
    if "value" in spent:
        return money.money_text(spent["value"], price.currency), None
    return "n/a", spent.get("absent", money.NO_PRICE)


def where_it_looked(flag: str | None, environ: dict | None = None) -> str:
    """What follows ``no runs under DIR``: what chose DIR (``--runs-dir``, ``TM_RUNS_DIR``), or, for the working
    folder's own ``.trainmeter/runs``, that a run started in another folder is under that folder's, and how to look."""
    env = os.environ if environ is None else environ
    if flag:
        return " (from --runs-dir)"
    if env.get("TM_RUNS_DIR"):
        return " (from TM_RUNS_DIR)"
    return (
        ": tm keeps a run under the folder it was started in; "
        "pass --runs-dir DIR (or set TM_RUNS_DIR) to look elsewhere"
    )


def count_steps(run_dir) -> int | None:
    """Rank 0's steps in the log, each step once: where a resumed attempt went back to an earlier step, the steps
    after it that the attempt before had done are counted again only once (as the engine counts them)."""
    from trainmeter_core.model.records import RunStart
    from trainmeter_core.runlog.reader import read_log

    n = 0
    last = None  # the last step number before the current attempt's first step
    new_attempt = False
    for record in read_log(run_dir, kinds={"step", "run.start"}):
        if isinstance(record, RunStart):
            new_attempt = record.attempt > 1
            continue
        if getattr(record, "rank", None) not in (None, 0):
            continue
        if new_attempt and last is not None:
            n -= max(0, min(n, last - (record.step - 1)))
        new_attempt = False
        n += 1
        last = record.step
    return n


def last_wall(run_dir) -> float | None:
    from trainmeter_core.runlog.reader import read_log

    wall = None
    for record in read_log(run_dir):
        wall = getattr(record, "wall", wall) or wall
    return wall


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
