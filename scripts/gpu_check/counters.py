"""Part 1 of gpu-check's report: the counters tm recorded during the matmul loop, next to what its FLOP count implies.

A fraction read as a percent, or a sparse peak, is off by x100 or x2: both land outside the bounds below and read
``SCALE OFF``, a failure on a GPU. GPM blocked by the provider is a note, not a failure. With ``--cpu`` the GPUs are
fakes and every row is a note.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from run_energy import show_energy

from trainmeter_core.model import records
from trainmeter_core.runlog.reader import read_log


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("loop_json", type=Path)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--cpu", action="store_true", help="fake GPUs: every row is a note")
    args = parser.parse_args()
    loop = json.loads(args.loop_json.read_text())
    t0, t1 = loop["t0"] + 1.0, loop["t1"]  # the first second's window may start before the loop did
    rows: list[records.SampleGpu] = []
    every_row: list[records.SampleGpu] = []  # the energy lines read the whole loop, its first second included
    facts: dict[int, dict] = {}
    notices: list[str] = []
    for record in read_log(args.run_dir, kinds={"sample.gpu", "fact", "notice"}):
        if isinstance(record, records.SampleGpu):
            every_row.append(record)
        if isinstance(record, records.SampleGpu) and t0 <= record.t <= t1:
            rows.append(record)
        elif isinstance(record, records.Fact) and record.name == "gpu" and isinstance(record.value, dict):
            facts[record.value.get("index")] = record.value
        elif isinstance(record, records.Notice):
            notices.append(record.message)
    if not rows:
        print(
            "matmul loop: FAIL: no sample.gpu rows during the loop: " + ("; ".join(notices) or "see tm tail")
        )
        return 0 if args.cpu else 1

    def busy(index: int) -> float:
        return statistics.fmean([r.util_gpu or 0.0 for r in rows if r.index == index])

    busiest = max({r.index for r in rows}, key=busy)
    rows = [r for r in rows if r.index == busiest]
    fact = facts.get(busiest, {})
    achieved = loop["flop"] / (loop["t1"] - loop["t0"])
    # Schema 2 names the peak dense_bf16_flop_per_s; logs of schema 1 said dense_bf16_flops.
    peak = fact.get("dense_bf16_flop_per_s", fact.get("dense_bf16_flops"))
    tensor_clock = fact.get("tensor_clock_mhz")
    bandwidth = fact.get("memory_bandwidth_bps")
    failed: list[str] = []

    def mean(field: str) -> float | None:
        values = [getattr(r, field) for r in rows if getattr(r, field) is not None]
        return statistics.fmean(values) if values else None

    def why(field: str) -> str:
        reasons = {(r.absent or {}).get(field) for r in rows if getattr(r, field) is None}
        return "; ".join(sorted(x for x in reasons if x)) or "n/a"

    def show(
        name: str, measured, expected, note: str = "", field: str | None = None, floor: bool = False
    ) -> None:
        shown = f"{measured:.3g}" if measured is not None else "n/a"
        wanted = (">=" if floor else "") + (f"{expected:.3g}" if expected is not None else "n/a")
        if measured is not None and expected:
            ratio = measured / expected
            good = (ratio >= 0.5 and measured <= 1.0) if floor else 0.5 <= ratio < 2
            verdict = "scale ok" if good else f"SCALE OFF x{ratio:.2f}"
            if not good and not args.cpu:
                failed.append(name)
        elif measured is None and field:
            verdict = why(field)
        else:
            verdict = ""
        print(f"  {name:<22} {shown:>10} {wanted:>10}   {verdict}{'  (' + note + ')' if note else ''}")

    sm_clock, sm_max = mean("clock_sm_mhz"), mean("clock_sm_max_mhz")
    clock_ratio = min(sm_clock, tensor_clock) / tensor_clock if sm_clock and tensor_clock else None
    mfu = achieved / peak if peak else None
    print(
        f"gpu{busiest} {fact.get('name')} ({'fake' if fact.get('fake') else 'real'}), spec {fact.get('spec_id')}, "
        f"{len(rows)} samples over {t1 - t0:.0f} s"
    )
    peak_text = f"{peak / 1e12:.1f} TFLOP/s" if peak else "n/a"
    print(
        f"matmul loop: {loop['products']} products of {loop['n']}^3, {achieved / 1e12:.3g} TFLOP/s achieved; "
        f"dense peak {peak_text} ({fact.get('peak_source') or fact.get('peak_absent')})"
    )
    print(f"  {'quantity':<22} {'tm':>10} {'expected':>10}")
    summary = json.loads((args.run_dir / "summary.json").read_text())
    snapshot = summary.get("snapshot") or {}
    show("MFU (loop's count)", mfu, mfu, "achieved / dense peak")
    print(
        f"  {'MFU (tm engine)':<22} {'n/a':>10} {'':>10}   a loop without steps or tokens has none (part 2 has)"
    )
    tensor = mean("tensor_active")
    if tensor is None:
        print(
            f"  GPM: {why('tensor_active')}: nothing to compare for tensor, SM and DRAM activity on this machine"
        )
    else:
        ofu_values = [
            r.tensor_active * min(r.clock_sm_mhz, tensor_clock) / tensor_clock
            for r in rows
            if tensor_clock and r.tensor_active is not None and r.clock_sm_mhz
        ]
        ofu = statistics.fmean(ofu_values) if ofu_values else None
        show(
            "OFU (counters)",
            ofu,
            mfu,
            "a pure matmul loop: OFU ~ MFU" if tensor_clock else "no tensor clock in the spec",
        )
        expected_tensor = mfu / clock_ratio if mfu and clock_ratio else mfu
        show(
            "tensor active",
            tensor,
            expected_tensor,
            "MFU x tensor clock / min(SM clock, tensor clock)"
            if clock_ratio
            else "~ MFU at the peak's clock (the spec has no tensor clock)",
            "tensor_active",
        )
        show("SM active", mean("sm_active"), 1.0, "every SM runs a big matmul", "sm_active")
        moved_b = loop["products"] * 3 * loop["n"] ** 2 * 2  # A and B read, C written, 2 bytes each, once
        dram_floor = moved_b / (loop["t1"] - loop["t0"]) / bandwidth if bandwidth else None
        show(
            "DRAM active",
            mean("dram_active"),
            dram_floor,
            "floor: A, B read and C written once",
            "dram_active",
            True,
        )
    show("GPU-Util", mean("util_gpu"), 1.0, "a kernel runs all the time", "util_gpu")
    nan = float("nan")
    print(
        f"  {'SM clock MHz':<22} {sm_clock or nan:>10.0f} {tensor_clock or nan:>10.0f}   "
        f"max {sm_max or nan:.0f}; expected column: the clock the peak is stated at"
    )
    throttles = sorted({t for r in rows for t in (r.throttle or [])})
    print(
        f"  throttle reasons seen: {', '.join(throttles) or 'none'}; memory clock {mean('clock_mem_mhz') or 'n/a'} MHz"
    )
    engine_ofu = ((snapshot.get("metrics") or {}).get("ofu") or {}).get("value")
    if engine_ofu is not None:
        print(f"  tm's own OFU at the end of the run: {engine_ofu:.3g}")
    energy_failed = show_energy(loop, every_row, busiest, snapshot, args.cpu)
    if energy_failed:
        failed.append(energy_failed)
    if failed:
        print(f"matmul loop: FAIL: {', '.join(failed)}")
        return 1
    print("matmul loop: PASS" if not args.cpu else "matmul loop: ran (fake GPUs: the numbers mean nothing)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
