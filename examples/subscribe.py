"""Print a run's steps as they happen: subscribing to trainmeter's bus from your own tool.

usage: python examples/subscribe.py [RUN]
RUN is a run directory, a run name or its unique prefix. Without it: the run going on now, else the next to start.
"""

import sys
import time

from trainmeter_core.api import subscribe
from trainmeter_core.runlog import rundir


def run_to_follow(ref):
    """RUN if given; else the latest run while it is live, else the next run to start (saying that it waits)."""
    if ref is not None:
        return rundir.resolve_run(ref)
    base = rundir.runs_dir()
    runs = rundir.list_runs(base)
    if runs and rundir.is_live(runs[0]):
        return runs[0]
    if runs:
        said = f"{runs[0].name} is {rundir.run_info(runs[0]).state}; waiting for the next run under {base} to start"
    else:
        said = f"no run under {base} yet: waiting for one to start"
    print(f"{said} (Ctrl-C to stop)", flush=True)
    while True:
        new = [run for run in rundir.list_runs(base) if run not in runs]
        if new and (new[0] / "endpoints.json").exists():
            return new[0]
        time.sleep(0.2)


def step_line(step):
    # A one-process run has no rank: the rank is named only where there are several.
    where = f" (rank {step.rank} on {step.host})" if step.rank is not None else ""
    took = f": {step.step_time_s * 1000:.1f} ms" if step.step_time_s is not None else ": the first step"
    tokens = f", {step.tokens:,} tokens" if step.tokens is not None else ""
    return f"step {step.step}{where}{took}{tokens}"


def main(ref):
    try:
        run = run_to_follow(ref)
    except rundir.RunDirError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not rundir.is_live(run):
        print(f"{run.name} is {rundir.run_info(run).state}: `tm tail {run.name}` prints its log")
        return 0
    print(f"following {run.name}", flush=True)
    for record in subscribe(run, kinds=["step", "run.end"]):
        if record.kind == "run.end":
            print(
                f"{run.name} ended: exit {record.status} after {record.elapsed_s:.1f} s and {record.steps} steps"
            )
            return 0
        print(step_line(record), flush=True)
    print(f"{run.name} ended without a word: its launcher is gone (`tm runs` shows it lost)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
    except KeyboardInterrupt:
        sys.exit(130)
