"""Which of tm's processes spends the "other processes" CPU of ``bench_tree.py``: the tight loop under ``tm --no-web``
for ``--short`` and ``--long`` steps; after its last step the loop waits ``--drain`` seconds (for tm's processes to
take what it sent), then reads ``/proc`` for the launcher (its parent) and every process under it. Per process, the
slope between the two runs' CPU times per step, the median of ``--rounds`` rounds. A process's CPU is the sum of its
live threads' ``schedstat`` (nanoseconds; a thread that already ended is not in it, and tm's processes keep theirs);
where that cannot be read, ``/proc/PID/stat``'s clock ticks (10 ms: good to about 10 ms / (long - short) steps, 1.7 µs
at the defaults), and the figure says which.

With ``--idle``: what tm's processes spend per second of a run that makes no step (its command sleeps; after 3 s, its
processes' CPU and voluntary context switches read from ``/proc`` twice, 5 s apart), per process, and with
``--baseline DIR`` the same for another checkout, alternated: the part of the per-step slope that grows with the run's
time rather than its steps (wakes on a timer, ticks, snapshots, samplers).

With ``--during``: tm's processes while the tight loop runs (40,000 steps; 6 s into it, the CPU of the training process
and of every other process under the launcher read twice, 5 s apart) as a share of the training process's CPU, with
``--baseline DIR``, ``--window S`` (an agent flush window, repeatable) and ``--peer-venv DIR`` (trainmeter 0.0.7, its
own tm and Python) to compare; the steadiest of these figures. ``--web`` lets each tm serve its dashboard (no page
open), as ``tm train.py`` does by default; without it, ``--no-web``.

With ``--whole``: tm's processes over their whole lives, the end of the run included: the tree's CPU (every process,
through a subreaper, ``treecpu.py``) less the training process's own, which ``bash``'s ``times`` around it reports at
its exit to the millisecond (its exit and the agent's last flush are its own here, not "other processes" as in
``bench_tree.py``).

usage: python bench/bench_tree_processes.py [--rounds 3] [--short 2000] [--long 8000] [--drain 1.5] [--idle [--baseline DIR]]
       [--during [--web] [--baseline DIR] [--window S ...]] [--whole]
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from bench_tree import LOOP, REPO
from treecpu import become_subreaper, run_tree

# After the loop: the CPU of the launcher and of every process under it, by a short name, as JSON on one line.
READ_TREE = """
import os, time
time.sleep(float(os.environ["DRAIN_S"]))
launcher, tick = os.getppid(), os.sysconf("SC_CLK_TCK")
procs = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{pid}/stat").read()
        cmd = open(f"/proc/{pid}/cmdline").read().split("\\0")
    except OSError:
        continue
    fields = stat.rsplit(")", 1)[1].split()
    # The CPU time of its live threads to the nanosecond (the first field of each one's schedstat); a process whose
    # threads cannot be read that way counts in clock ticks, and the figure says so.
    try:
        seconds = sum(int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
                      for tid in os.listdir(f"/proc/{pid}/task")) / 1e9
        clock = "schedstat"
    except (OSError, ValueError, IndexError):
        seconds, clock = (int(fields[11]) + int(fields[12])) / tick, "ticks"
    procs[int(pid)] = (int(fields[1]), seconds, " ".join(cmd[1:3])[:60], clock)
def under_launcher(pid):
    while pid > 1:
        if pid == launcher:
            return True
        pid = procs.get(pid, (0,))[0]
    return False
cpu, clocks = {}, set()
for pid, (parent, seconds, name, clock) in procs.items():
    if pid == launcher or (pid != os.getpid() and under_launcher(pid)):
        name = "launcher (hub, recorder)" if pid == launcher else name
        cpu[name] = cpu.get(name, 0.0) + seconds
        clocks.add(clock)
print("TREE " + json.dumps({"cpu": cpu, "clocks": sorted(clocks)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--short", type=int, default=2000)
    parser.add_argument("--long", type=int, default=8000)
    parser.add_argument("--drain", type=float, default=1.5)
    parser.add_argument(
        "--idle", action="store_true", help="tm's whole tree per second of a run with no step"
    )
    parser.add_argument(
        "--during",
        action="store_true",
        help="tm's processes as a share of the training process's CPU, mid-loop",
    )
    parser.add_argument(
        "--web",
        action="store_true",
        help="with --during: each tm serves its dashboard (no page open), as tm train.py does by default",
    )
    parser.add_argument(
        "--window", action="append", default=[], help="with --during: an agent flush window (s)"
    )
    parser.add_argument(
        "--peer-venv", help="with --during: trainmeter 0.0.7's venv, measured in the same run"
    )
    parser.add_argument(
        "--baseline", help="with --idle or --during: another checkout, measured in the same run, alternated"
    )
    parser.add_argument(
        "--whole",
        action="store_true",
        help="tm's processes over their whole lives (the training process by bash's times)",
    )
    args = parser.parse_args()
    runs = tempfile.mkdtemp(prefix="tm-bench-procs-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TM_") and k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", TM_RUNS_DIR=runs, PYTHONPATH=REPO, DRAIN_S=str(args.drain))
    tm = os.path.join(os.path.dirname(sys.executable), "tm")
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(
        f"load average {load}; reproduce: {sys.executable} bench/bench_tree_processes.py --rounds {args.rounds} "
        f"--short {args.short} --long {args.long} --drain {args.drain}{' --idle' if args.idle else ''}"
        f"{' --whole' if args.whole else ''}{' --during' if args.during else ''}{' --web' if args.web else ''}"
        f"{''.join(' --window ' + w for w in args.window)}{' --peer-venv ' + args.peer_venv if args.peer_venv else ''}"
        f"{' --baseline ' + args.baseline if args.baseline else ''}"
    )
    if args.idle:
        idle(tm, env, args.rounds, args.baseline)
        return
    if args.during:
        during(
            during_shares(tm, env, args.rounds, args.baseline, args.window, args.peer_venv, args.web),
            args.web,
        )
        return
    if args.whole:
        whole(tm, env, args)
        return
    seen: dict[int, list[dict]] = {args.short: [], args.long: []}
    clocks: set[str] = set()
    for _ in range(args.rounds):
        for steps in (args.short, args.long):
            argv = [tm, "-q", "--no-web", "--", sys.executable, "-c", LOOP + READ_TREE, str(steps)]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith("TREE ")]
            if done.returncode != 0 or not lines:
                raise SystemExit(f"failed ({done.returncode}): {done.stderr.strip()[-400:]}")
            tree = json.loads(lines[0][5:])
            seen[steps].append(tree["cpu"])
            clocks.update(tree["clocks"])
    names = sorted(set().union(*(run.keys() for runs_ in seen.values() for run in runs_)))
    how = (
        "each live thread's schedstat, to the nanosecond"
        if clocks == {"schedstat"}
        else "clock ticks (10 ms) for some: schedstat could not be read"
    )
    print(
        f"CPU per step of tm's processes by the slope between {args.short:,} and {args.long:,} steps ({how}):"
    )
    for name in names:
        slopes = [
            (long_run.get(name, 0.0) - short_run.get(name, 0.0)) / (args.long - args.short) * 1e6
            for short_run, long_run in zip(seen[args.short], seen[args.long], strict=True)
        ]
        rounds = ", ".join(f"{s:.1f}" for s in slopes)
        print(f"  {statistics.median(slopes):6.1f} µs per step (rounds {rounds})  {name}")


# Code for a process beside tm's: ``tree(launcher)`` reads, for the launcher and every process under it (not the
# reader), its name, CPU (each live thread's schedstat, ns) and voluntary context switches (its wakes).
_TREE = """
import json, os, sys, time
def tree(launcher):
    out, parents = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
            name = " ".join(open(f"/proc/{pid}/cmdline").read().split("\\0")[1:3])[:60]
            cpu = wakes = 0
            for tid in os.listdir(f"/proc/{pid}/task"):
                cpu += int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
                for line in open(f"/proc/{pid}/task/{tid}/status"):
                    if line.startswith("voluntary_ctxt_switches"):
                        wakes += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents[int(pid)] = int(stat.rsplit(")", 1)[1].split()[1])
        out[int(pid)] = ("launcher (hub, recorder)" if int(pid) == launcher else name, cpu, wakes)
    def under(pid):
        while pid > 1:
            if pid == launcher:
                return True
            pid = parents.get(pid, 0)
        return False
    return {pid: v for pid, v in out.items() if pid != os.getpid() and (pid == launcher or under(pid))}
"""

# The command of an idle run: it waits SETTLE_S for tm's start to be over, then reads its launcher's tree twice,
# WINDOW_S apart; prints the rates per process as JSON on one line.
IDLE_TREE = (
    _TREE
    + """
time.sleep(float(os.environ["SETTLE_S"]))
window = float(os.environ["WINDOW_S"])
before = tree(os.getppid())
time.sleep(window)
after = tree(os.getppid())
rates = {}
for pid, (name, cpu, wakes) in after.items():
    if pid in before:
        ms, per_s = rates.get(name, (0.0, 0.0))
        rates[name] = (ms + (cpu - before[pid][1]) / 1e6 / window, per_s + (wakes - before[pid][2]) / window)
print("IDLE " + json.dumps(rates))
"""
)


def idle(tm: str, env: dict, rounds: int, baseline: str | None) -> None:
    """tm's processes while the run makes no step: CPU and wakes per second, read from ``/proc`` over a window of a
    run whose command only sleeps (after its start is over), per process; with ``baseline``, the same for that
    checkout (its ``trainmeter_core`` first on ``PYTHONPATH``), alternated. The slope between a 1 s and a 4 s run,
    measured before, spread from -3.5 to 25 ms a second: a run's start and end move by more than 3 s of idling."""
    trees = {"this checkout": env["PYTHONPATH"]}
    if baseline:
        trees["baseline " + baseline] = baseline
    seen: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            run_env = dict(env, PYTHONPATH=tree, SETTLE_S="3", WINDOW_S="5")
            argv = [tm, "-q", "--no-web", "--", sys.executable, "-c", IDLE_TREE]
            # cwd: the component processes run ``python -m``, which puts the working folder before PYTHONPATH
            done = subprocess.run(argv, env=run_env, cwd=tree, capture_output=True, text=True, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith("IDLE ")]
            if done.returncode != 0 or not lines:
                raise SystemExit(f"failed ({done.returncode}): {done.stderr.strip()[-400:]}")
            seen[name].append(json.loads(lines[0][5:]))
    print(
        "tm's processes in a run that makes no step, CPU and wakes a second over 5 s (medians of the rounds):"
    )
    for name, runs_ in seen.items():
        totals = [sum(ms for ms, _ in run.values()) for run in runs_]
        wakes = [sum(w for _, w in run.values()) for run in runs_]
        spread = ", ".join(f"{t:.1f}" for t in totals)
        print(
            f"  {name}: {statistics.median(totals):.1f} ms of CPU a second (rounds {spread}), "
            f"{statistics.median(wakes):.0f} wakes a second"
        )
        for process in sorted({p for run in runs_ for p in run}):
            ms = statistics.median(run.get(process, (0.0, 0.0))[0] for run in runs_)
            per_s = statistics.median(run.get(process, (0.0, 0.0))[1] for run in runs_)
            print(f"    {ms:5.1f} ms/s, {per_s:5.0f} wakes/s  {process}")


# Beside the loop, in its own process: waits SETTLE_S, then reads the CPU (each live thread's schedstat) of the training
# process and of every other process under the launcher twice, WINDOW_S apart; prints both as JSON on one line.
DURING_TREE = (
    _TREE
    + """
launcher, loop_pid = int(sys.argv[1]), int(sys.argv[2])
time.sleep(float(os.environ["SETTLE_S"]))
before = tree(launcher)
time.sleep(float(os.environ["WINDOW_S"]))
after = tree(launcher)
loop = others = 0
for pid, (_, ns, _) in after.items():
    if pid in before:
        if pid == loop_pid:
            loop += ns - before[pid][1]
        else:
            others += ns - before[pid][1]
print("DURING " + json.dumps({"loop_s": loop / 1e9, "others_s": others / 1e9}))
"""
)


def during(seen: dict[tuple[str, str | None], list[float]], web: bool) -> None:
    """tm's processes while the tight loop runs (``during_shares``' figures), as a share of the training process's CPU
    over the same 5 s (read from ``/proc`` after 6 s of the loop, beside it): no start, no end, no slope, so a few rounds
    agree to a tenth of a percent where the slope's rounds spread by tens of µs a step. With a baseline, the same for
    that checkout; with windows, each agent flush window (``TM_AGENT_FLUSH_S``) in turn; with ``web``, each tm serving
    its dashboard (no page open), as ``tm train.py`` does by default."""
    print(
        "tm's processes while the tight loop runs, % of the training process's CPU over 5 s (medians of the rounds"
        + ("; each tm serving its dashboard, no page open" if web else "; --no-web")
        + "):"
    )
    for (name, window), shares in seen.items():
        label = name if window is None else f"{name}, TM_AGENT_FLUSH_S={window}"
        spread = ", ".join(f"{x:.2f}" for x in shares)
        print(f"  {label}: {statistics.median(shares):.2f}% (rounds {spread})")


def during_shares(
    tm: str,
    env: dict,
    rounds: int,
    baseline: str | None,
    windows: list[str],
    peer_venv: str | None,
    web: bool = False,
) -> dict[tuple[str, str | None], list[float]]:
    """``during``'s figures, (variant, window) -> each round's share in %; also ``bench_tree.py``'s steady figure of
    the other processes. ``env`` holds this checkout's ``PYTHONPATH``; ``web``: each tm serves its dashboard."""
    web_flag = [] if web else ["--no-web"]
    trees = {"this checkout": env["PYTHONPATH"]}
    if baseline:
        trees["baseline " + baseline] = baseline
    variants = [(name, tree, window) for name, tree in trees.items() for window in (windows or [None])]
    peer_tm = os.path.join(peer_venv, "bin", "tm") if peer_venv else None
    if peer_tm and os.path.exists(peer_tm):
        variants.append(("trainmeter 0.0.7 (its own venv)", None, None))
    elif peer_venv:
        print(f"trainmeter 0.0.7 not found in {peer_venv} (bin/tm): its line is left out")
    seen: dict[tuple, list[float]] = {(name, window): [] for name, _, window in variants}
    for _ in range(rounds):
        for name, tree, window in variants:
            if tree is None:  # 0.0.7: its tm and its Python, nothing of this checkout on the path
                run_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
                python = os.path.join(peer_venv, "bin", "python")  # type: ignore[arg-type]
                argv = [peer_tm, "-q", *web_flag, "--", python, "-c", LOOP, "40000"]
                tree = tempfile.gettempdir()
            else:
                run_env = dict(env, PYTHONPATH=tree)
                argv = [tm, "-q", *web_flag, "--", sys.executable, "-c", LOOP, "40000"]
            if window is not None:
                run_env["TM_AGENT_FLUSH_S"] = window
                run_env["TM_AGENT_FLUSH_RECORDS"] = str(max(1000, int(float(window) * 16000)))
            # cwd: the component processes run ``python -m``, which puts the working folder before PYTHONPATH
            run = subprocess.Popen(
                argv, env=run_env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            loop_pid = None
            for _ in range(200):
                time.sleep(0.05)
                found = subprocess.run(["pgrep", "-P", str(run.pid), "-f", "json, sys, time"], capture_output=True,
                                       text=True, check=False).stdout.split()  # fmt: skip
                if found:
                    loop_pid = int(found[0])
                    break
            if loop_pid is None:
                run.kill()
                raise SystemExit("the training process did not start")
            watch_env = dict(run_env, SETTLE_S="6", WINDOW_S="5")
            watch = subprocess.run([sys.executable, "-c", DURING_TREE, str(run.pid), str(loop_pid)], env=watch_env,
                                   capture_output=True, text=True, check=False)  # fmt: skip
            _end(run, loop_pid)
            lines = [line for line in watch.stdout.splitlines() if line.startswith("DURING ")]
            if not lines:
                raise SystemExit(f"failed: {watch.stderr.strip()[-400:]}")
            figures = json.loads(lines[0][7:])
            seen[(name, window)].append(figures["others_s"] / figures["loop_s"] * 100)
    return seen


def _end(run: subprocess.Popen, loop_pid: int) -> None:
    """Stop a run the figures are read from: its training loop first, then tm. Killed alone, tm cannot take its
    command with it, and the loop (40,000 steps) ran on beside the next round's, on one of this machine's two cores:
    on a slow day a later round read tm's processes beside that stray loop (docs/performance.md, "tm's other processes
    while the loop runs, without a stray loop beside them")."""
    try:
        os.kill(loop_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    run.kill()
    run.wait()
    for _ in range(100):
        try:
            if os.waitpid(loop_pid, os.WNOHANG)[0]:
                return  # an orphan handed to this process (a subreaper: bench_tree.py), reaped here
        except ChildProcessError:
            pass  # init's to reap
        if not _running(loop_pid):
            return
        time.sleep(0.02)
    raise SystemExit(f"the training process {loop_pid} did not end after SIGKILL")


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that still runs (not gone, not a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# The training process run by bash, which prints its children's CPU (user, system) to the millisecond once it ended:
# getrusage's totals, counted by the kernel to the nanosecond (``/usr/bin/time``, used before, prints 10 ms).
_CHILD_TIMES = '"$@"; status=$?; echo TIMECPU >&2; times >&2; exit $status'


def whole(tm: str, env: dict, args: argparse.Namespace) -> None:
    """tm's processes, CPU per step over their whole lives: the tree less the training process (bash's ``times``)."""
    become_subreaper()
    slopes = []
    for _ in range(args.rounds):
        others = {}
        for steps in (args.short, args.long):
            argv = [tm, "-q", "--no-web", "--", "bash", "-c", _CHILD_TIMES, "bash"]
            argv += [sys.executable, "-c", LOOP, str(steps)]
            run = run_tree(argv, env)
            found = re.search(r"TIMECPU\n\S+ \S+\n(\d+)m([\d.]+)s (\d+)m([\d.]+)s", run.stderr)
            if run.returncode != 0 or found is None:
                raise SystemExit(f"failed ({run.returncode}): {run.stderr.strip()[-400:]}")
            minutes_user, user, minutes_system, system = (float(x) for x in found.groups())
            others[steps] = run.cpu_s - (60 * minutes_user + user + 60 * minutes_system + system)
        slopes.append((others[args.long] - others[args.short]) / (args.long - args.short) * 1e6)
    rounds = ", ".join(f"{s:.1f}" for s in slopes)
    print(
        f"tm's processes over their whole lives: {statistics.median(slopes):.1f} µs per step (rounds {rounds}; "
        "the training process's CPU from bash's times, to the millisecond: 0.2 µs a step at the defaults)"
    )


if __name__ == "__main__":
    main()
