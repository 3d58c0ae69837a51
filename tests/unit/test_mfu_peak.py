"""The peak MFU is against: a peak measured with ``tm peak`` belongs to the thread count and dtype it was measured
with, a run is scored against the one that matches its own (else MFU is absent, naming the command that measures
it), and the summary line and the passport say which peak it was: its value, its source and when it was measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmeter_core.model import passport, records
from trainmeter_core.model.engine import Engine
from trainmeter_core.run.summary import summary_line

SOURCE_1 = (
    "tm peak: best of repeated 1024x1024x1024 float32 matmuls on cpu, 1 thread(s), torch 2.13.0+cpu, "
    "measured 2026-12-01 09:30 UTC"
)
SOURCE_2 = SOURCE_1.replace("1 thread(s)", "2 thread(s)").replace("12-01 09:30", "12-04 23:10")
SUMMARY = {"exit_status": 0, "elapsed_s": 12.0, "steps": 21, "skipped_steps": 0, "bus": {"dropped_total": 0}}


def fact(seq: int, name: str, value, provenance="detected", origin="agent", **header) -> records.Fact:
    return records.Fact(
        seq=seq, t=100.0 + seq * 1e-3, host="vm", name=name, value=value, provenance=provenance, origin=origin,
        **header,
    )  # fmt: skip


def measured(seq: int, flop_per_s: float, threads: int, source: str, dtype="float32") -> records.Fact:
    """A peak the launcher copied from the peaks file, as it records one now: with its dtype and threads."""
    value = {
        "flop_per_s": flop_per_s, "label": "measured", "source": source, "device_type": "cpu", "dtype": dtype,
        "threads": threads, "measured_wall": 1.8e9, "spread_flop_per_s": 1e8,
    }  # fmt: skip
    return fact(seq, "peak", value, origin="tm peak", device="vm/cpu")


def cpu_run(peaks: list[records.Fact], threads: int = 1, dtype: str = "float32") -> records.Snapshot:
    """A 1-rank CPU run of 1e6 FLOP per token, 1,000 tokens per step every 0.5 s (2,000 tokens/s), 21 steps."""
    logged: list = [
        records.RunStart(
            seq=1, t=100.0, host="vm", run_id="r1", name="t", run_dir="/runs/r1", command=["python", "t.py"],
            cwd="/w", tm_version="0.1.0", python="3.11", platform="linux", env={},
        ),
        fact(2, "flop_per_token", 1e6, "declared", "--flops-per-token"),
    ]  # fmt: skip
    seq = 3
    for peak in peaks:
        peak.seq = seq
        logged.append(peak)
        seq += 1
    device = {"type": "cpu", "index": None, "uuid": None, "dtype": dtype, "threads": threads}
    logged.append(fact(seq, "device", device, rank=0))
    for i in range(21):
        seq += 1
        logged.append(
            records.Step(seq=seq, t=110.0 + 0.5 * i, host="vm", rank=0, step=i + 1, tokens=1000,
                         step_time_s=0.5 if i else None)
        )  # fmt: skip
    logged.append(
        records.RunEnd(seq=seq + 1, t=121.0, status=0, reason="exited", exit_code=0, elapsed_s=21.0)
    )
    engine = Engine()
    snapshots = [s for record in logged for s in engine.feed(record)]
    return snapshots[-1]


@pytest.mark.parametrize("order", ["two-thread peak stored last", "two-thread peak stored first"])
def test_a_peak_measured_with_two_threads_does_not_change_the_mfu_of_a_one_thread_run(order):
    one = measured(0, 16e9, 1, SOURCE_1)
    two = measured(0, 32e9, 2, SOURCE_2)
    snap = cpu_run([one, two] if order.endswith("last") else [two, one], threads=1)
    mfu = snap.metrics["mfu_avg"]
    # 1e6 FLOP/token × 20,000 tokens over the 10 s window (steps 2-21) / 16e9 FLOP/s = 2e9 / 16e9 = 0.125
    assert mfu.value == pytest.approx(0.125, rel=1e-12) and mfu.label == "measured"
    peak = snap.explain["mfu_avg"].inputs["peak_flop_per_s_per_device"]
    assert peak.value == 16e9 and peak.source == f"CPU, measured peak: {SOURCE_1}"
    # The same run with two threads is scored against the two-thread peak: 2e9 / 32e9.
    assert cpu_run([one, two], threads=2).metrics["mfu_avg"].value == pytest.approx(0.0625, rel=1e-12)


def test_where_no_stored_peak_matches_the_runs_threads_and_dtype_mfu_is_absent_naming_the_command():
    snap = cpu_run([measured(0, 32e9, 2, SOURCE_2)], threads=1)
    mfu = snap.metrics["mfu_avg"]
    assert mfu.value is None and mfu.low is None
    assert (
        "no peak measured on vm with what the run computes with (float32, 1 thread), only with float32, "
        in (mfu.absent)
    )
    assert "2 threads: measure one with tm peak --threads 1, or pass --peak-tflops" in mfu.absent
    # A float64 run names the dtype too.
    absent = cpu_run([measured(0, 16e9, 4, SOURCE_1)], threads=4, dtype="float64").metrics["mfu_avg"].absent
    assert "tm peak --threads 4 --dtype float64" in absent
    # No peak stored at all: the same command, in the "no peak" reason.
    absent = cpu_run([], threads=3).metrics["mfu"].absent
    assert "(or measure one with tm peak --threads 3)" in absent


def test_the_summary_line_and_the_passport_name_the_peak_mfu_is_against_with_its_source_and_date(tmp_path):
    snap = cpu_run([measured(0, 16e9, 1, SOURCE_1), measured(0, 32e9, 2, SOURCE_2)], threads=1)
    line = summary_line(Path(tmp_path / "r1"), SUMMARY, snap)
    assert f"MFU 12.5% (declared, measured; against 16 GFLOP/s (CPU, measured peak: {SOURCE_1}))" in line
    markdown = passport.passport_markdown(passport.passport_data(snap, {}))
    assert (
        f"- MFU: 12.5% (declared, measured); against the peak 16 GFLOP/s (CPU, measured peak: {SOURCE_1})"
        in (markdown)
    )
    assert "2026-12-01 09:30 UTC" in line and "2 thread(s)" not in line
