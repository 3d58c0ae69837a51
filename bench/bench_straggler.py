"""The straggler under the real ``tm -- torchrun`` (4 ranks, gloo DDP on the CPU, ``tests/agent_scripts/
ddp_straggler.py``), measured two ways. Prints figures; asserts nothing.

1. Naming: ``--runs`` runs (default 20) of 60 steps, each with a rank k and a cause drawn at random (k slowed 200 ms a
   step in its forward, cause compute, or in its DataLoader, cause data wait); a run counts as right when a snapshot
   of its replayed log at step 50 or before names rank k with that cause (``straggler_rank``, the label of
   ``straggler_wait_s``). Prints each run and how many were right.
2. Cost: the CPU the collective probe adds to a DDP step, by the slope method: the CPU seconds of every process of
   the tree (tm, torchrun, the four ranks: ``treecpu.py``) of a short and a long clean run, probe on and off
   (``TM_NO_COLLECTIVES=1``); (long - short) / (long_steps - short_steps) is each one's CPU per step, and the
   difference on - off what the probe adds, printed beside the step's wall time (by the same slope) and the tree's
   CPU per step with the probe off; the median of the rounds, and the mean with its standard error. Beside it, by the
   same slope, the parts inside the ranks, free of the other processes' noise: the CPU of the probe's own thread
   and of the training thread (each rank's ``/proc/self/task/<tid>/schedstat``, nanoseconds, over its steps: the
   loop's ``THREAD_CPU``), and the share of the long run's steps the probe sent a row for (it reads the flight
   recorder at most 0.2% of the time, so a loop of thousands of steps a second has rows for some of its steps).
   ``--ranks`` (default 4) sets the ranks of this part: on a machine with fewer cores than ranks, gloo's ranks wait
   for each other on shared cores and the noise of the slope hides a 1% figure; fewer ranks than cores measure the
   same probe work per collective (it grows with a step's collectives, not its ranks). The short run should be long
   enough to hold the probe's first read (a second after its first step) and a full ring of the recorder (2,000
   collectives), so that both cancel in the slope: 10,000 steps here. ``--pin`` runs tm's processes on the first CPU
   and torchrun with its ranks on the others (``taskset``): on the 2-core machine this was measured on, one rank's
   training thread then took 255-260 µs a step from run to run, against 275-285 µs moving between the cores.

Run: ``.venv/bin/python bench/bench_straggler.py [--runs 20] [--seed S] [--short 100 --long 500 --rounds 2]``
(``--skip-naming`` or ``--skip-cost`` for one part, ``--ranks N`` for the cost's ranks, ``--pin`` to keep them off
tm's core).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from treecpu import run_tree

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "tests"))

from tm_runs import log_records  # noqa: E402 - after the tests are on the path

from trainmeter_core.runlog import replay  # noqa: E402 - after the repository is on the path

SCRIPT = REPO / "tests" / "agent_scripts" / "ddp_straggler.py"
TM = Path(sys.executable).parent / "tm"
RANKS = 4
CAUSES = {"forward": "compute", "data": "data wait"}
WITHIN_STEPS = 50
PROBE, PROBE_THREAD = "collectives", "tm-agent-collectives"  # the probe's rows' origin, its thread's name


def pinned(argv: list[str], ranks_argv: list[str]) -> list[str]:
    """``argv`` (tm and its ``--``) on this process's first CPU, and ``ranks_argv`` (torchrun and so its ranks) on the
    others (``taskset``): no rank shares a core with tm's processes or moves between cores."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs two CPUs or more")
    others = ",".join(str(cpu) for cpu in cpus[1:])
    return ["taskset", "-c", str(cpus[0]), *argv, "taskset", "-c", others, *ranks_argv]


def tm_torchrun(workdir: Path, ranks: int = RANKS, pin: bool = False, **env: str):
    run_env = dict(
        os.environ, TM_RUNS_DIR=str(workdir / "runs"), TM_DISABLE_COMPONENTS="web", OMP_NUM_THREADS="1"
    )
    run_env.update(env)
    for name in ("TM_ACTIVE", "TM_AGENT_ENDPOINT", "TM_RUN_DIR", "TM_LAUNCHER_PID"):
        run_env.pop(name, None)
    ranks_argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    ranks_argv.append(str(SCRIPT))
    argv = pinned([str(TM), "--"], ranks_argv) if pin else [str(TM), "--", *ranks_argv]
    for attempt in (1, 2):
        shutil.rmtree(workdir / "runs", ignore_errors=True)
        done = run_tree(argv, run_env, cwd=str(workdir))
        if done.returncode == 0:
            return done
        # Said, never hidden: a failed run is run once more, its figures left out.
        print(
            f"tm -- torchrun failed ({done.returncode}), attempt {attempt}:\n{done.stderr[-2000:]}",
            flush=True,
        )
    raise SystemExit("tm -- torchrun failed twice")


def named_within(run_dir: Path, rank: int, cause: str) -> tuple[bool, str]:
    """Whether a snapshot at step 50 or before names ``rank`` with ``cause``; and what the last one named."""
    right, last = False, None
    for snapshot in replay.snapshots(run_dir):
        last = snapshot
        named = snapshot.metrics.get("straggler_rank")
        wait = snapshot.metrics.get("straggler_wait_s")
        if named is None or named.value is None or wait is None:
            continue
        if snapshot.steps <= WITHIN_STEPS and int(named.value) == rank and wait.label == cause:
            right = True
    final = last.metrics.get("straggler_rank") if last is not None else None
    said = "none" if final is None or final.value is None else f"rank {final.value:.0f}"
    if final is not None and final.value is not None:
        said += f", {last.metrics['straggler_wait_s'].label}"
    return right, said


def naming(runs: int, seed: int) -> None:
    draw = random.Random(seed)
    right = 0
    for n in range(1, runs + 1):
        rank, where = draw.randrange(RANKS), draw.choice(sorted(CAUSES))
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            tm_torchrun(workdir, STEPS="60", SLOW_RANK=str(rank), SLOW_WHERE=where)
            (run_dir,) = [p for p in (workdir / "runs").iterdir() if p.is_dir()]
            ok, said = named_within(run_dir, rank, CAUSES[where])
        right += ok
        print(
            f"run {n:2d}: rank {rank} slowed in its {where:7s} -> {'right' if ok else 'WRONG'} (the last snapshot: {said})"
        )
    print(f"named the right rank and cause within {WITHIN_STEPS} steps: {right} of {runs}")


def thread_cpu_s(prefix: Path, ranks: int) -> dict[str, float]:
    """The CPU seconds of each named thread, over the run's steps, all ranks added (the loop's ``THREAD_CPU`` files)."""
    out: dict[str, float] = {}
    for rank in range(ranks):
        figures = json.loads(Path(f"{prefix}.rank{rank}").read_text())
        for name, seconds in figures["threads"].items():
            out[name] = out.get(name, 0.0) + seconds
    return out


def steps_read(run_dir: Path) -> int:
    """The steps a ``collectives`` row of the probe came for, all ranks added."""
    return sum(
        1 for record in log_records(run_dir) if record["kind"] == "metric" and record.get("origin") == PROBE
    )


def per_step(short: int, long: int, probe_on: bool, ranks: int, pin: bool) -> dict[str, float]:
    """Per step, by the slope between a short and a long run: the whole tree's CPU seconds (``cpu``), the wall
    seconds (``wall``), the training threads' and the probe's threads' CPU seconds, all ranks added (``main``,
    ``probe``: each rank's ``/proc``, from its first step to its last); and the share of the long run's steps the
    probe sent a row for (``read``)."""
    figures, threads = [], []
    read = 0.0
    for steps in (short, long):
        env = {"STEPS": str(steps)}
        if not probe_on:
            env["TM_NO_COLLECTIVES"] = "1"
        with tempfile.TemporaryDirectory() as tmp:
            env["THREAD_CPU"] = str(Path(tmp) / "threads")
            figures.append(tm_torchrun(Path(tmp), ranks, pin, **env))
            threads.append(thread_cpu_s(Path(tmp) / "threads", ranks))
            if probe_on and steps == long:
                (run_dir,) = [p for p in (Path(tmp) / "runs").iterdir() if p.is_dir()]
                read = steps_read(run_dir) / (steps * ranks)
    span = long - short
    return {
        "cpu": (figures[1].cpu_s - figures[0].cpu_s) / span,
        "wall": (figures[1].wall_s - figures[0].wall_s) / span,
        "main": (threads[1]["MainThread"] - threads[0]["MainThread"]) / span,
        "probe": (threads[1].get(PROBE_THREAD, 0.0) - threads[0].get(PROBE_THREAD, 0.0)) / span,
        "read": read,
    }


def cost(short: int, long: int, rounds: int, ranks: int, pin: bool) -> None:
    added, shares, probe, main_added = [], [], [], []
    for n in range(1, rounds + 1):
        off = per_step(short, long, False, ranks, pin)
        on = per_step(short, long, True, ranks, pin)
        added.append(on["cpu"] - off["cpu"])
        shares.append((on["cpu"] - off["cpu"]) / off["cpu"])
        probe.append(on["probe"])
        main_added.append(on["main"] - off["main"])
        print(
            f"round {n}: per DDP step, the whole tree's CPU: probe off {off['cpu'] * 1e3:.3f} ms,"
            f" on {on['cpu'] * 1e3:.3f} ms, added {added[-1] * 1e6:+.1f} µs ({shares[-1]:+.2%} of the step's CPU);"
            f" of it the probe's threads {on['probe'] * 1e6:.2f} µs, the training threads"
            f" {main_added[-1] * 1e6:+.1f} µs (off {off['main'] * 1e6:.1f}, on {on['main'] * 1e6:.1f});"
            f" the step's wall time off {off['wall'] * 1e3:.3f} ms, on {on['wall'] * 1e3:.3f} ms;"
            f" steps with the probe's row {on['read']:.1%}",
            flush=True,
        )
    mean = statistics.fmean(added)
    spread = statistics.stdev(added) / math.sqrt(rounds) if rounds > 1 else math.nan
    print(
        f"the probe adds {statistics.median(added) * 1e6:+.1f} µs of CPU per DDP step over {ranks} ranks"
        f" ({statistics.median(shares):+.2%} of the step's CPU; median of {rounds} rounds, {short} and {long} steps);"
        f" mean {mean * 1e6:+.1f} µs, its standard error {spread * 1e6:.1f} µs; the probe's own threads"
        f" {statistics.median(probe) * 1e6:.2f} µs a step (median), the training threads"
        f" {statistics.median(main_added) * 1e6:+.1f} µs"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--short", type=int, default=100)
    parser.add_argument("--long", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=RANKS, help="ranks of the cost part (the naming has 4)")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the cost's tm on the first CPU, torchrun and its ranks on the others",
    )
    parser.add_argument("--skip-naming", action="store_true")
    parser.add_argument("--skip-cost", action="store_true")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"seed {seed}")
    if not args.skip_naming:
        naming(args.runs, seed)
    if not args.skip_cost:
        cost(args.short, args.long, args.rounds, args.ranks, args.pin)


if __name__ == "__main__":
    main()
