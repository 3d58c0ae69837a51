"""Which FLOPs conventions a run's numbers are under, as the summary line and the passport say it: one computable
convention gives one number under it, with the others named and what each lacks; a range names the conventions it
is over; never "the conventions agree" for a single convention."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmeter_core.model import passport, records
from trainmeter_core.model.engine import Engine
from trainmeter_core.run.summary import summary_line

SUMMARY = {"exit_status": 0, "elapsed_s": 12.0, "steps": 21, "skipped_steps": 0, "bus": {"dropped_total": 0}}
# 6 × (N − E) = 6 × (6,000,000 − 64,000) = 35,616,000 FLOP per token under hf; no layers nor width for the others
SHAPE = {"params": 6_000_000, "embedding_params": 64_000, "seq_len": 512}
LACK = "layers unknown: pass --layers; model width unknown: pass --d-model"


def run(shape: dict, peak_flop_per_s: float | None = 1e12) -> records.Snapshot:
    """A 1-rank CPU run of 1,000 tokens per step every 0.5 s, 21 steps, with a declared peak and these shape facts."""
    logged: list = [
        records.RunStart(
            t=100.0, host="vm", run_id="r1", name="t", run_dir="/runs/r1", command=["python", "t.py"], cwd="/w",
            tm_version="0.1.0", python="3.11", platform="linux", env={},
        )
    ]  # fmt: skip
    for name, value in shape.items():
        logged.append(
            records.Fact(t=100.0, host="vm", name=name, value=value, provenance="detected", origin="agent")
        )
    if peak_flop_per_s is not None:
        value = {
            "flop_per_s": peak_flop_per_s,
            "label": "declared",
            "source": "a test's figure",
            "device_type": None,
        }
        logged.append(
            records.Fact(
                t=100.0, host="vm", name="peak", value=value, provenance="declared", origin="--peak-tflops"
            )
        )
    device = {"type": "cpu", "index": None, "uuid": None, "dtype": "float32", "threads": 1}
    logged.append(records.Fact(t=100.0, host="vm", rank=0, name="device", value=device, provenance="detected",
                               origin="agent"))  # fmt: skip
    for i in range(21):
        logged.append(records.Step(t=110.0 + 0.5 * i, host="vm", rank=0, step=i + 1, tokens=1000,
                                   step_time_s=0.5 if i else None))  # fmt: skip
    logged.append(records.RunEnd(t=121.0, status=0, reason="exited", exit_code=0, elapsed_s=21.0))
    engine = Engine()
    for seq, record in enumerate(logged, 1):
        record.seq = seq
    return [s for record in logged for s in engine.feed(record)][-1]


def test_a_model_with_one_computable_convention_has_one_number_under_it_and_names_the_others():
    snap = run(SHAPE)
    fpt = snap.metrics["flop_per_token"]
    assert fpt.value == 35_616_000 and fpt.convention == "hf" and fpt.low is None
    # the MFU too: 35,616,000 × 2,000 tokens/s / 1e12 = 0.071232, one number under hf
    assert snap.metrics["mfu_avg"].value == pytest.approx(0.071232, rel=1e-12)
    assert snap.metrics["mfu_avg"].convention == "hf"
    assert "only hf could be computed" in snap.explain["flop_per_token"].note


def test_the_summary_line_names_the_one_convention_and_what_each_missing_one_needs(tmp_path):
    line = summary_line(Path(tmp_path / "r1"), SUMMARY, run(SHAPE))
    # 35,616,000 × 21,000 tokens = 7.479e11 FLOP
    assert f"FLOPs 7.48e+11 FLOP (hf; titan, megatron, all_params not computed ({LACK}))" in line
    assert "MFU 7.12% (hf, declared; against 1 TFLOP/s (CPU, declared peak: a test's figure))" in line
    assert "agree" not in line and "range" not in line


def test_the_passport_names_the_one_convention_and_what_each_missing_one_needs():
    data = passport.passport_data(run(SHAPE), {})
    assert data["conventions"] == {
        "computed": ["hf"],
        "missing": {"titan": LACK, "megatron": LACK, "all_params": LACK},
    }
    markdown = passport.passport_markdown(data)
    assert f"- FLOPs spent: 7.479e+11 (hf); titan, megatron, all_params not computed ({LACK})" in markdown
    assert (
        "- MFU: 7.123% (hf, declared); against the peak 1 TFLOP/s (CPU, declared peak: a test's figure)"
        in (markdown)
    )
    assert "range over the four conventions" not in markdown
    assert f"| titan | n/a ({LACK}) |" in markdown


def test_a_range_names_the_conventions_it_is_over():
    snap = run({**SHAPE, "layers": 4, "d_model": 256})
    assert snap.metrics["flop_per_token"].low is not None
    line = summary_line(Path("/runs/r1"), SUMMARY, snap)
    assert "(range over titan, megatron, hf, all_params)" in line
    markdown = passport.passport_markdown(passport.passport_data(snap, {}))
    assert "(range over titan, megatron, hf, all_params)" in markdown and "not computed" not in markdown
