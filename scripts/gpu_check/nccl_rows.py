"""Part 3 of gpu-check's report: the collective probe's rows of the one-process NCCL world (``nccl_loop.py``), each
step's operations and bytes beside what the loop says it ran. Exits 1 if a step's all_reduces or their bytes differ,
or the probe sent no row.

Usage: nccl_rows.py LOOP_JSON RUN_DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainmeter_core.model import records
from trainmeter_core.runlog.reader import read_log

SHOWN_STEPS = 5
IGNORED = ("collective_count", "collective_all_reduce_count")  # the total, and what the table shows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("loop_json", type=Path)
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    loop = json.loads(args.loop_json.read_text())
    rows: dict[int, dict] = {}
    attached = None
    for record in read_log(args.run_dir, kinds={"metric", "fact"}):
        if (
            isinstance(record, records.Metric)
            and record.origin == "collectives:0"
            and record.step is not None
        ):
            rows[record.step] = dict(record.values)
        elif isinstance(record, records.Fact) and record.name == "probe.collectives":
            attached = record.value
    print(f"  backend {loop['backend']}, world size {loop['world_size']}; the probe: {attached}")
    print(f"  {'step':>5} {'op':<12} {'count':>6} {'bytes, tm':>12} {'bytes, loop':>12}   verdict")
    failed = []
    # Step 1 may hold the world's start-up too; from step 2 on, each step is the loop's two all_reduces alone.
    for step in range(2, loop["steps"] + 1):
        values = rows.get(step)
        count = values.get("collective_all_reduce_count") if values else None
        size = values.get("collective_all_reduce_bytes") if values else None
        ok = count == loop["all_reduce_per_step"] and size == loop["all_reduce_bytes_per_step"]
        if not ok:
            failed.append(step)
        if step <= SHOWN_STEPS + 1 or not ok:
            shown = "n/a" if size is None else f"{size:,.0f}"
            print(
                f"  {step:>5} {'all_reduce':<12} {count if count is not None else 'n/a':>6} {shown:>12}"
                f" {loop['all_reduce_bytes_per_step']:>12,}   {'PASS' if ok else 'FAIL'}"
            )
    others = sorted({k for v in rows.values() for k in v if k.endswith("_count") and k not in IGNORED})
    print(
        f"  steps with rows: {len(rows)} of {loop['steps']}; other counts seen: {', '.join(others) or 'none'}"
    )
    if failed:
        print(f"FAIL: the probe's all_reduces differ from the loop's at steps {failed[:10]}")
        return 1
    print(
        f"  PASS: every step from 2 to {loop['steps']}: {loop['all_reduce_per_step']} all_reduces, "
        f"{loop['all_reduce_bytes_per_step']:,} bytes"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
