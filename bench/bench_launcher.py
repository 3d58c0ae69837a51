"""What tm itself costs: fixed start cost, time to the child's start, idle CPU and memory, a component's restart.

Prints figures and ratios against a baseline measured in the same run; never fails on a time.
usage: python bench/bench_launcher.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
TM = str(BIN / "tm") if (BIN / "tm").exists() else shutil.which("tm")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_B = os.sysconf("SC_PAGE_SIZE")


def env_for(runs: Path) -> dict[str, str]:
    env = dict(os.environ, TM_RUNS_DIR=str(runs))
    for name in ("TM_ACTIVE", "LOCAL_RANK"):
        env.pop(name, None)
    return env


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def fixed_cost(repeat: int, env: dict[str, str]) -> None:
    plain = [timed([sys.executable, "-c", "pass"], env) for _ in range(repeat)]
    under = [timed([TM, "--", sys.executable, "-c", "pass"], env) for _ in range(repeat)]
    p, u = statistics.median(plain), statistics.median(under)
    print(f"python -c pass:            median {p * 1000:7.1f} ms over {repeat}")
    print(
        f"tm -- python -c pass:      median {u * 1000:7.1f} ms   (tm adds {(u - p) * 1000:.1f} ms; target <= 200 ms)"
    )


def to_child_start(repeat: int, env: dict[str, str]) -> None:
    # The child prints the wall time of its first line; the same script run plainly gives the interpreter's own share.
    code = "import time; print(time.time())"
    plain, under = [], []
    for _ in range(repeat):
        t0 = time.time()
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout
        plain.append(float(out) - t0)
        t0 = time.time()
        out = subprocess.run(
            [TM, "-q", "--", sys.executable, "-c", code], env=env, capture_output=True, text=True
        ).stdout
        under.append(float(out.split()[0]) - t0)
    p, u = statistics.median(plain), statistics.median(under)
    print(
        f"start -> child's first line: plain {p * 1000:6.1f} ms, under tm {u * 1000:6.1f} ms "
        f"(tm's share {(u - p) * 1000:.1f} ms; target <= 150 ms)"
    )


def tree(root: int) -> list[int]:
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                data = open(f"/proc/{entry}/stat", "rb").read()
            except OSError:
                continue
            stats[int(entry)] = int(data[data.rfind(b")") + 2 :].split()[1])
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(p for p, ppid in stats.items() if ppid == pid)
    return out


def cpu_s(pid: int) -> float:
    try:
        fields = open(f"/proc/{pid}/stat", "rb").read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_b(pid: int) -> int:
    try:
        return int(open(f"/proc/{pid}/statm").read().split()[1]) * PAGE_B
    except OSError:
        return 0


def idle_cost(env: dict[str, str], window_s: float = 10.0) -> None:
    proc = subprocess.Popen([TM, "-q", "--", sys.executable, "-c", "import time; time.sleep(40)"], env=env)
    time.sleep(3.0)  # let the components start and settle
    child = [p for p in tree(proc.pid) if p != proc.pid and "time.sleep" in open(f"/proc/{p}/cmdline").read()]
    child_tree = set(tree(child[0])) if child else set()
    ours = [p for p in tree(proc.pid) if p not in child_tree]
    before = {p: cpu_s(p) for p in ours}
    time.sleep(window_s)
    used = sum(cpu_s(p) - before[p] for p in ours)
    rss = sum(rss_b(p) for p in ours)
    print(
        f"idle run: tm's {len(ours)} processes use {used / window_s * 100:.2f}% of a core and {rss / 2**20:.1f} MiB RSS "
        "(targets <= 3%, <= 150 MB)"
    )
    proc.send_signal(signal.SIGTERM)
    proc.wait()


def restart_time(env: dict[str, str], runs: Path) -> None:
    env = dict(env, TM_HOST_INTERVAL_S="0.1")
    proc = subprocess.Popen([TM, "-q", "--", sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    deadline = time.monotonic() + 20

    def records():
        out = []
        for seg in sorted(runs.glob("*/events-*.jsonl")):
            for line in seg.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    pid = None
    while pid is None and time.monotonic() < deadline:
        started = [r for r in records() if r["kind"] == "component" and r["event"] == "started"]
        if started and any(r["kind"] == "sample.host" for r in records()):
            pid = started[0]["child_pid"]
        time.sleep(0.05)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    restarted_at = sample_at = None
    while time.monotonic() < deadline and sample_at is None:
        recs = records()
        again = [r for r in recs if r["kind"] == "component" and r["event"] == "restarted"]
        if again and restarted_at is None:
            restarted_at = time.monotonic()
        if again and any(r["kind"] == "sample.host" and r["seq"] > again[0]["seq"] for r in recs):
            sample_at = time.monotonic()
        time.sleep(0.01)
    print(
        f"kill -9 of the components process: restarted record after {(restarted_at - killed) * 1000:.0f} ms, "
        f"first host sample after {(sample_at - killed) * 1000:.0f} ms (includes the 0.2 s first backoff)"
    )
    proc.send_signal(signal.SIGTERM)
    proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        env = env_for(runs)
        fixed_cost(args.repeat, env)
        to_child_start(args.repeat, env)
        idle_cost(env)
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        restart_time(env_for(runs), runs)


if __name__ == "__main__":
    main()
