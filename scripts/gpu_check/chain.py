"""Part 2 of gpu-check's report: what tm said of the GPT loop, next to the loop's own count of itself.

Reads the loop's JSON (gpt_loop.py) and the run directory tm made; prints one table and exits 1 if a check failed.
It checks the whole chain: the agent's steps, tokens and loss, the model's shape, and the engine's FLOPs per token,
tokens/s and MFU. On the CPU (``--cpu``) timing is noisy and the counters are fakes: those rows are notes there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainmeter_core.model import records
from trainmeter_core.runlog.reader import read_log

#: How far tm's tokens/s over the loop's own window may be from the loop's (both time the same steps).
WINDOW_TOLERANCE = {"gpu": 0.03, "cpu": 0.10}
#: How far tm's live tokens/s (EMA, median) and its run MFU may be from the loop's own figures.
RATE_TOLERANCE = {"gpu": 0.05, "cpu": None}  # None: a note, never a failure (a shared CPU is not steady)


class Report:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def row(self, name: str, tm: str, loop: str, verdict: str, note: str = "") -> None:
        if verdict.startswith("FAIL"):
            self.failed.append(name)
        print(f"  {name:<34} {tm:>16} {loop:>16}   {verdict}{'  (' + note + ')' if note else ''}")

    def compare(
        self, name: str, tm: float | None, loop: float | None, tolerance: float | None, fmt: str, note=""
    ):
        shown_tm = format(tm, fmt) if tm is not None else "n/a"
        shown_loop = format(loop, fmt) if loop is not None else "n/a"
        if tm is None or loop is None or not loop:
            self.row(name, shown_tm, shown_loop, "FAIL: missing" if tolerance is not None else "note", note)
            return
        off = tm / loop - 1
        if tolerance is None:
            verdict = f"note ({off:+.1%})"
        elif abs(off) <= tolerance:
            verdict = f"PASS ({off:+.1%}, within {tolerance:.1%})"
        else:
            verdict = f"FAIL ({off:+.1%}, beyond {tolerance:.1%})"
        self.row(name, shown_tm, shown_loop, verdict, note)


def metric(snapshot: dict, key: str) -> tuple[float | None, dict]:
    entry = (snapshot.get("metrics") or {}).get(key) or {}
    return entry.get("value"), entry


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("loop_json", type=Path)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--cpu", action="store_true", help="a CPU check: timing rows are notes")
    args = parser.parse_args()
    kind = "cpu" if args.cpu else "gpu"
    loop = json.loads(args.loop_json.read_text())
    summary = json.loads((args.run_dir / "summary.json").read_text())
    snapshot = summary.get("snapshot") or {}
    explain = snapshot.get("explain") or {}

    steps: dict[int, object] = {}
    from_backward: dict[int, float] = {}
    for record in read_log(args.run_dir, kinds={"step", "metric"}):
        if isinstance(record, records.Step) and (record.rank or 0) == 0:
            steps[record.step] = record
        elif isinstance(record, records.Metric) and record.origin == "backward" and record.step is not None:
            from_backward[record.step] = record.values.get("train_loss")

    report = Report()
    print(
        f"GPT loop: {loop['shape']} ({loop['layers']} layers, d {loop['d_model']}, T {loop['seq_len']}, "
        f"batch {loop['batch']}), {loop['dtype']} on {loop['device']}, torch {loop['torch']}; "
        f"{len(loop['losses'])} steps, the loop's window steps {loop['window_first_step']}-{loop['window_last_step']}"
    )
    print(f"  {'quantity':<34} {'tm':>16} {'the loop':>16}")

    # FLOPs per token under the titan convention: the same formula over the same shape, so exactly equal.
    titan, _ = metric(snapshot, "flop_per_token.titan")
    mine = loop["flop_per_token_titan"]
    verdict = "PASS (equal)" if titan == mine else "FAIL (differs)"
    report.row("FLOPs/token, titan", f"{titan:,.0f}" if titan else "n/a", f"{mine:,}", verdict)
    counted, counted_entry = metric(snapshot, "flop_per_token.counted")
    report.row(
        "FLOPs/token, counted",
        f"{counted:,.0f}" if counted else "n/a",
        "",
        "note" if counted else f"note: {counted_entry.get('absent')}",
        f"{counted / mine:.3f} x titan; FlopCounterMode, attention as its math" if counted else "",
    )

    # tokens/s over the loop's own window, from tm's step records (the agent's clock and token count).
    first, last = loop["window_first_step"], loop["window_last_step"]
    window_rate = None
    if first in steps and last in steps:
        tokens = 0
        for step in range(first + 1, last + 1):
            record = steps.get(step)
            count = None if record is None else (record.tokens_global or record.tokens)
            if count is None:
                tokens = None
                break
            tokens += count
        span = steps[last].t - steps[first].t
        window_rate = tokens / span if tokens is not None and span > 0 else None
    report.compare(
        f"tokens/s, steps {first}-{last}",
        window_rate,
        loop["tokens_per_s"],
        WINDOW_TOLERANCE[kind],
        ",.0f",
        "tm's step records against the loop's own clock",
    )
    ema, _ = metric(snapshot, "tokens_per_s")
    median, _ = metric(snapshot, "tokens_per_s_median")
    report.compare("tokens/s, tm's EMA at the end", ema, loop["tokens_per_s"], RATE_TOLERANCE[kind], ",.0f")
    report.compare("tokens/s, tm's median", median, loop["tokens_per_s"], RATE_TOLERANCE[kind], ",.0f")

    # MFU: the engine's run MFU, and the loop's own count over the same peak (the peak is tm's, with its source).
    mfu, mfu_entry = metric(snapshot, "mfu_avg")
    inputs = (explain.get("mfu_avg") or {}).get("inputs") or {}
    peak = (inputs.get("peak_total_flop_per_s") or {}).get("value")
    peak_source = (inputs.get("peak_flop_per_s_per_device") or {}).get("source", "")
    loop_mfu = mine * loop["tokens_per_s"] / peak if peak else None
    if mfu is None:
        report.row(
            "MFU (titan), run",
            "n/a",
            f"{loop_mfu:.4f}" if loop_mfu else "n/a",
            f"FAIL: {mfu_entry.get('absent')}",
        )
    else:
        window_tokens = (inputs.get("window_tokens") or {}).get("value")
        window_s = (inputs.get("window_s") or {}).get("value")
        recomputed = titan * window_tokens / window_s / peak if window_tokens and window_s and peak else None
        report.compare(
            "MFU (titan), tm's arithmetic", mfu, recomputed, 0.001, ".4f", "titan x window tokens / s / peak"
        )
        report.compare(
            "MFU (titan), run",
            mfu,
            loop_mfu,
            RATE_TOLERANCE[kind],
            ".4f",
            f"peak {peak / 1e12:.4g} TFLOP/s: {peak_source}",
        )

    # OFU: counters, never the model's count; a scale error (percent as fraction, a sparse peak) is a factor 2 or 100.
    ofu, ofu_entry = metric(snapshot, "ofu")
    if args.cpu:
        report.row(
            "OFU", f"{ofu:.4f}" if ofu is not None else "n/a", "", "note: fake GPUs or none on a CPU check"
        )
    elif ofu is None:
        report.row("OFU", "n/a", f"{loop_mfu:.4f}" if loop_mfu else "n/a", f"note: {ofu_entry.get('absent')}")
    elif loop_mfu:
        ratio = ofu / loop_mfu
        verdict = (
            f"PASS (x{ratio:.2f} of the loop's MFU)" if 0.5 <= ratio < 2 else f"FAIL: SCALE OFF x{ratio:.2f}"
        )
        report.row("OFU", f"{ofu:.4f}", f"{loop_mfu:.4f}", verdict, ofu_entry.get("label") or "")

    # The loss: every step's loss passed to backward, read by the agent without a sync, against the loop's own.
    printed = [float.fromhex(h) for h in loop["losses"]]
    equal = sum(1 for step, value in enumerate(printed, start=1) if from_backward.get(step) == value)
    differ = [s for s, v in enumerate(printed, start=1) if s in from_backward and from_backward[s] != v]
    missing = len(printed) - equal - len(differ)
    # The last copy may still be in flight when the process exits (the agent never waits for it).
    ok = not differ and missing <= 1
    report.row(
        "train_loss from backward()",
        f"{equal} equal",
        f"{len(printed)} steps",
        "PASS" if ok else f"FAIL ({len(differ)} differ, {missing} missing)",
        "bit for bit, as float.hex",
    )
    series = (snapshot.get("series") or {}).get("train_loss") or {}
    report.row(
        "train_loss, final snapshot", f"{series.get('value', float('nan')):.6g}", f"{printed[-1]:.6g}", "note"
    )
    if report.failed:
        print(f"GPT loop: FAIL: {', '.join(report.failed)}")
        return 1
    print("GPT loop: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
