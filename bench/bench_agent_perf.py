"""Where the agent's time goes in the tight loop, by the shared library the CPU ran in: the loop of issue 16 plain, under
``tm`` and under trainmeter 0.0.7 (its own venv), each sampled by ``perf record`` for ``--seconds`` in its steady state,
its iterations in that window counted by the loop itself (``SIGUSR1`` makes it write its iteration count at the
window's start and end), so each library's samples become µs an iteration. Then the symbols whose time grew most
under tm, beside 0.0.7's.

What it separates that a time or an instruction count cannot: the interpreter running the agent's Python
(``libpython``), torch's own code run slower beside the agent's (``libtorch_cpu``: the same kernels, each a little slower,
hundreds of symbols at once), and what a second thread in the process costs (``libc``: every lock the process takes once
it has more than one thread; 0.0.7's agent has none). ``perf`` slows every variant alike (about a third here), so the
figures are read against each other, not against ``bench_agent.py``'s.

Needs ``perf`` (linux-perf) and permission to record another process (root, or ``kernel.perf_event_paranoid`` <= 1).

Run: ``.venv/bin/python bench/bench_agent_perf.py [--rounds 2] [--seconds 10] [--peer-venv /work/peer] [--top 25]``.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tight_loop import DATA_AND_MODEL

REPO = Path(__file__).resolve().parent.parent
FREQUENCY_HZ = 3999

# The loop, as bench_tree.py runs it, with its iteration count written at each SIGUSR1 (a store per iteration: the
# same in every variant).
LOOP = (
    """
import os, signal, sys
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
done = [0]
signal.signal(signal.SIGUSR1, lambda *_: os.write(2, b"ITERATIONS %d\\n" % done[0]))
"""
    + DATA_AND_MODEL
    + """
def batches():
    while True:
        yield from loader
source = batches()
for i in range(int(sys.argv[1])):
    done[0] = i
    (x,) = next(source)
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    optimizer.step()
"""
)
ITERATIONS = 10_000_000  # never reached: the loop is stopped after its window
SETTLE_S = 5.0  # start-up (torch's import, the agent's hello, the first windows) before the window opens


def variants(peer_venv: str | None) -> dict[str, list[str]]:
    bin_dir = Path(sys.executable).parent
    out = {
        "plain": [sys.executable, "-c", LOOP],
        "tm": [str(bin_dir / "tm"), "-q", "--no-web", "--", sys.executable, "-c", LOOP],
    }
    if peer_venv and (Path(peer_venv) / "bin" / "tm").exists():
        peer = Path(peer_venv) / "bin"
        out["0.0.7"] = [str(peer / "tm"), "--no-web", "--", str(peer / "python"), "-c", LOOP]
    return out


def training_pid(root: int) -> int | None:
    """The loop's own process under ``root`` (itself, or the child tm started): the one running ``-c`` with LOOP."""
    for pid in [root, *_descendants(root)]:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # python -c LOOP N, as the plain variant runs it and as tm starts it, untouched (tm's own argv holds it later)
        if len(argv) > 2 and argv[1] == b"-c" and b"ITERATIONS" in argv[2]:
            return pid
    return None


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def sample(argv: list[str], seconds: float, work: Path, label: str) -> tuple[Path, int]:
    """Run ``argv``, record its training process for ``seconds``; the perf data file and the iterations in it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TM_") and k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", TM_RUNS_DIR=str(work / "runs"), PYTHONPATH=str(REPO))
    stderr_path = work / f"{label}.stderr"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen([*argv, str(ITERATIONS)], env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            time.sleep(SETTLE_S)
            pid = training_pid(proc.pid)
            if pid is None:
                raise RuntimeError(f"{label}: the loop's process was not found under pid {proc.pid}")
            data = work / f"{label}.perf"
            os.kill(pid, signal.SIGUSR1)
            subprocess.run(
                ["perf", "record", "-q", "-F", str(FREQUENCY_HZ), "-p", str(pid), "-o", str(data), "--",
                 "sleep", str(seconds)],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            os.kill(pid, signal.SIGUSR1)
            time.sleep(0.3)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    counts = [int(n) for n in re.findall(rb"ITERATIONS (\d+)", stderr_path.read_bytes())]
    if len(counts) < 2 or counts[-1] <= counts[0]:
        raise RuntimeError(f"{label}: the loop did not report its iterations ({stderr_path})")
    return data, counts[-1] - counts[0]


def us_per_iteration(data: Path, iterations: int) -> dict[tuple[str, str], float]:
    """(library, symbol) -> µs an iteration: each sample stands for 1 / FREQUENCY_HZ s of the thread's CPU."""
    report = subprocess.run(
        ["perf", "report", "-i", str(data), "--sort", "dso,sym", "--stdio", "-n"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    out: dict[tuple[str, str], float] = {}
    for line in report.splitlines():
        match = re.match(r"\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\[[.k]\]\s+(.*)", line)
        if match:
            key = (match.group(2), match.group(3).strip())
            out[key] = out.get(key, 0.0) + int(match.group(1)) / FREQUENCY_HZ / iterations * 1e6
    return out


def mean(maps: list[dict]) -> dict:
    keys = set().union(*maps)
    return {k: sum(m.get(k, 0.0) for m in maps) / len(maps) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--peer-venv", default=os.environ.get("TM_PEER_VENV") or "/work/peer")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    if shutil.which("perf") is None:
        print("perf is not installed (linux-perf): nothing measured")
        return
    runs = variants(args.peer_venv)
    if "0.0.7" not in runs:
        print(f"no trainmeter 0.0.7 in {args.peer_venv}: plain and tm only")
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(
        f"load average {load}; reproduce: {sys.executable} bench/bench_agent_perf.py --rounds {args.rounds} "
        f"--seconds {args.seconds} --peer-venv {args.peer_venv}"
    )
    by_variant: dict[str, list[dict]] = {name: [] for name in runs}
    with tempfile.TemporaryDirectory(prefix="tm-bench-perf-") as tmp:
        work = Path(tmp)
        for round_ in range(args.rounds):
            for name, argv in runs.items():  # alternated, round by round
                data, iterations = sample(argv, args.seconds, work, f"{name}-{round_}")
                by_variant[name].append(us_per_iteration(data, iterations))
                print(f"  round {round_ + 1}, {name}: {iterations} iterations in {args.seconds:g} s")
    symbols = {name: mean(maps) for name, maps in by_variant.items()}
    libraries = {name: mean([_by_library(m) for m in maps]) for name, maps in by_variant.items()}
    names = list(runs)
    print(f"\nµs an iteration of the loop's thread by library, under perf (means of {args.rounds} rounds):")
    print(
        "  " + "".join(f"{n:>12}" for n in names) + "".join(f"{'+' + n:>12}" for n in names[1:]) + "  library"
    )
    print(_row({n: sum(libraries[n].values()) for n in names}, names, "all", 1))
    for lib in sorted(
        libraries["plain"].keys() | libraries["tm"].keys(), key=lambda k: -libraries["tm"].get(k, 0.0)
    )[:10]:
        print(_row({n: libraries[n].get(lib, 0.0) for n in names}, names, lib, 2))
    whole = {n: sum(libraries[n].values()) for n in names}
    print(
        "  added, of the plain loop: "
        + ", ".join(f"{n} {(whole[n] - whole['plain']) / whole['plain']:.1%}" for n in names[1:])
    )
    grown = sorted(
        symbols["tm"].keys() | symbols["plain"].keys(),
        key=lambda k: -(symbols["tm"].get(k, 0.0) - symbols["plain"].get(k, 0.0)),
    )
    print(f"\nthe {args.top} symbols that grew most under tm (µs an iteration added; 0.0.7's beside):")
    for key in grown[: args.top]:
        added = symbols["tm"].get(key, 0.0) - symbols["plain"].get(key, 0.0)
        peer = (
            f"{symbols['0.0.7'].get(key, 0.0) - symbols['plain'].get(key, 0.0):+7.2f}"
            if "0.0.7" in symbols
            else ""
        )
        print(f"  {added:+7.2f} {peer}  {key[0][:22]:22} {key[1][:90]}")
    torch_cpu = [k for k in symbols["tm"] if k[0].startswith("libtorch_cpu")]
    more = sum(1 for k in torch_cpu if symbols["tm"].get(k, 0.0) > symbols["plain"].get(k, 0.0))
    print(f"\nlibtorch_cpu: {more} of its {len(torch_cpu)} sampled symbols took longer under tm than plain")


def _row(values: dict[str, float], names: list[str], label: str, digits: int) -> str:
    """One line of the library table: each variant's µs, then what each adds to the plain loop's."""
    plain = values["plain"]
    cells = [f"{values[n]:12.{digits}f}" for n in names] + [
        f"{values[n] - plain:+12.{digits}f}" for n in names[1:]
    ]
    return "  " + "".join(cells) + f"  {label}"


def _by_library(symbols: dict[tuple[str, str], float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for (library, _), us in symbols.items():
        out[library] = out.get(library, 0.0) + us
    return out


if __name__ == "__main__":
    main()
