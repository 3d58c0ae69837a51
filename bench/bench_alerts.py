"""How long from a hung loop's last step to the hung alert on tm's stderr, against the rule's threshold.

A loop steps every 0.1 s, then stops stepping (the process lives on); tm.toml sets the hung rule's floor. The alert
can come no sooner than the threshold, and snapshots come once a second, so the figure to read is the excess over the
threshold. Prints figures; never fails on a time.
usage: python bench/bench_alerts.py [--floors 3,5,10] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
TM = str(BIN / "tm") if (BIN / "tm").exists() else shutil.which("tm")

LOOP = """
import sys, time
from trainmeter_agent import emit
for i in range(1, 41):
    emit(step=i, tokens=1024)
    if i < 40:
        time.sleep(0.1)
with open(sys.argv[1], "w") as f:
    f.write(repr(time.time()))   # the last step's wall time
time.sleep(float(sys.argv[2]))   # hung: alive, no step
"""


def one_run(work: Path, floor_s: float) -> tuple[float, float]:
    """(seconds from the last step to the alert line on stderr, the threshold the alert reported)."""
    for old in work.iterdir():
        if old.name != "runs":
            old.unlink()
    (work / "loop.py").write_text(LOOP)
    (work / "tm.toml").write_text(f"[alerts.hung]\nfloor_s = {floor_s}\n")
    env = dict(os.environ, TM_RUNS_DIR=str(work / "runs"), TM_DISABLE_COMPONENTS="web")
    for name in ("TM_ACTIVE", "LOCAL_RANK"):
        env.pop(name, None)
    marker = work / "last_step"
    proc = subprocess.Popen(
        [TM, str(work / "loop.py"), str(marker), str(floor_s + 4)],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    seen_at = None
    line = ""
    buffered = b""
    deadline = time.time() + floor_s + 60
    assert proc.stderr is not None
    while seen_at is None and time.time() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if not ready:
            continue
        chunk = os.read(proc.stderr.fileno(), 65536)
        if not chunk:
            break
        now = time.time()
        buffered += chunk
        for raw in buffered.split(b"\n")[:-1]:
            if b" ALERT hung " in raw and seen_at is None:
                seen_at, line = now, raw.decode()
        buffered = buffered.rsplit(b"\n", 1)[-1]
    proc.wait(timeout=floor_s + 120)
    if seen_at is None:
        raise SystemExit(f"no hung alert within {floor_s + 60:.0f} s")
    threshold = float(line.split("(threshold ")[1].split(" s")[0])
    return seen_at - float(marker.read_text()), threshold


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floors", default="3,5,10", help="hung floors to try, in seconds")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    floors = [float(x) for x in args.floors.split(",")]
    print(f"hung alert latency: last step -> 'ALERT hung' on tm's stderr ({args.repeat} runs per floor)")
    print(f"{'floor s':>8} {'threshold s':>12} {'delay s (median)':>17} {'excess s (min..max)':>20}")
    with tempfile.TemporaryDirectory(prefix="tmba") as tmp:
        work = Path(tmp)
        for floor_s in floors:
            delays, thresholds = [], []
            for _ in range(args.repeat):
                delay, threshold = one_run(work, floor_s)
                delays.append(delay)
                thresholds.append(threshold)
            excess = [d - t for d, t in zip(delays, thresholds, strict=True)]
            print(
                f"{floor_s:8.0f} {statistics.median(thresholds):12.1f} {statistics.median(delays):17.2f} "
                f"{min(excess):9.2f}..{max(excess):.2f}"
            )
    print(
        "the threshold is max(10 x the median step, floor); snapshots come once a second, so up to ~1 s of the"
    )
    print("excess is the tick that first sees the step too old, the rest is the bus and the terminal sink")


if __name__ == "__main__":
    main()
