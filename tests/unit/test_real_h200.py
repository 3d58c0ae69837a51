"""The H200 runs of tests/fixtures/real (nanoGPT, GPT-2 124M, bf16) replayed: OFU scaled to the max SM clock the
samples report, and the counters of the finished run taken over its training window, not from the sample after it."""

from __future__ import annotations

import json

import pytest
from tm_runs import REPO

from trainmeter_core.model import passport
from trainmeter_core.runlog import replay

EAGER = REPO / "tests" / "fixtures" / "real" / "h200-nanogpt-eager"
KILL = REPO / "tests" / "fixtures" / "real" / "h200-nanogpt-kill"


def gpu_samples(run_dir):
    rows = []
    for line in (run_dir / "events-0001.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the kill run's log may end in a cut line
        if record.get("kind") == "sample.gpu" and "util_gpu" in record and "tensor_active" in record:
            rows.append(record)
    return rows


def steady_state(run_dir):
    """The mean tensor active of the samples taken while the loop ran flat out (GPU-Util >= 0.9)."""
    steady = [r["tensor_active"] for r in gpu_samples(run_dir) if r["util_gpu"] >= 0.9]
    return sum(steady) / len(steady)


@pytest.fixture(scope="module")
def final():
    return replay.final_snapshot(EAGER, use_checkpoint=False)


def test_the_steady_state_of_the_eager_run_is_what_the_readme_says():
    # 12 samples with GPU-Util 0.95 to 0.98; their tensor active: 3.8324 / 12 = 0.31937
    assert steady_state(EAGER) == pytest.approx(0.319, abs=0.0005)


def test_ofu_of_the_eager_run_is_present_and_scaled_to_the_max_sm_clock_its_samples_report(final):
    ofu = final.metrics["ofu"]
    # The log holds neither an SM count nor a tensor clock: the basis can only be NVML's 1980 MHz max SM clock.
    assert ofu.label == "counters, training window, scaled to the 1980 MHz max SM clock"
    assert "the 1980 MHz max SM clock NVML reports" in final.explain["ofu"].note
    # Per sample tensor active × SM clock / 1980 (1965 MHz mostly: × 0.9924), over the window: 0.3038, within 0.03 of
    # the steady state 0.3194 (the window's first 0.43 s and last 0.39 s are partly idle samples)
    assert abs(ofu.value - steady_state(EAGER)) <= 0.03
    assert ofu.value <= final.metrics["tensor_active"].value
    assert (ofu.window_start_t, ofu.window_end_t) == (329.131287948, 341.945050927)  # first and last step


def test_the_finished_run_shows_gpu_util_and_tensor_active_over_the_training_window(final):
    util, tensor = final.metrics["util_gpu"], final.metrics["tensor_active"]
    # The sample after the loop read GPU-Util 0.0 and tensor active 0.17; over the window [329.131, 341.945] (12.814 s):
    # util (0.86 × 0.426 + 11.58 × 1 s + 0.0 × 0.387) / 12.814 = 0.932; tensor (0.0708 × 0.426 + 3.8324 + 0.1715 × 0.387)
    # / 12.814 = 0.3066, within 0.02 of the steady state
    assert util.label == tensor.label == "counters, training window"
    assert util.value >= 0.9
    assert util.value == pytest.approx(0.9323, abs=5e-5)
    assert abs(tensor.value - steady_state(EAGER)) <= 0.02
    assert tensor.value == pytest.approx(0.3066, abs=5e-5)


def test_the_mfu_of_the_run_covers_the_same_window_as_its_counters(final):
    mfu, util = final.metrics["mfu_avg"], final.metrics["util_gpu"]
    assert (mfu.window_start_t, mfu.window_end_t) == (util.window_start_t, util.window_end_t)


def test_the_passport_of_the_eager_run_gives_the_window_averages_and_the_lost_time(final):
    data = passport.passport_data(final, {"run_id": "ng"})
    window = data["training_window"]
    assert window["util_gpu"]["value"] >= 0.9
    assert window["ofu"]["label"].endswith("scaled to the 1980 MHz max SM clock")
    assert data["ofu"] == window["ofu"]
    # 26.9 s elapsed, 13.2 s before the first step and 0.9 s after the last: 14.1 s lost (goodput 0.476)
    assert data["lost_time"]["note"] == (
        "lost 14.1 s of 26.9 s: start-up and imports 13.2 s, after the last step 0.9 s"
    )
    markdown = passport.passport_markdown(data)
    assert "## Counters over the training window" in markdown
    assert "- GPU-Util: 0.9323 (counters, training window)" in markdown
    # MFU and OFU read as percentages: the training window's MFU over the conventions (28.9% to 33.5%, each named),
    # against the datasheet's 989.5 TFLOP/s, and OFU 30.38%.
    mfu = data["mfu"]
    assert (
        f"- MFU: {mfu['low'] * 100:.4g} to {mfu['high'] * 100:.4g}% (datasheet, range over titan, megatron, hf, "
        "all_params); against the peak 989.5 TFLOP/s (NVIDIA H200 SXM, datasheet peak: "
        "https://www.nvidia.com/en-us/data-center/h200/)" in markdown
    )
    assert f"- OFU: {data['ofu']['value'] * 100:.4g}% (counters, training window," in markdown
    # passport.json keeps schema 1's names of the FLOP counts beside the new ones for one release
    assert data["flops_per_token"] == data["flop_per_token"] and data["flops_spent"] == data["spent_flop"]


def test_the_killed_run_keeps_ofu_and_its_window_through_both_restarts():
    snapshot = replay.final_snapshot(KILL, use_checkpoint=False)
    ofu = snapshot.metrics["ofu"]
    assert ofu.label == "counters, training window, scaled to the 1980 MHz max SM clock"
    assert abs(ofu.value - steady_state(KILL)) <= 0.03
    assert snapshot.metrics["util_gpu"].value >= 0.9


def test_the_dashboards_ofu_chart_is_labelled_as_its_points_were_taken():
    # The chart's points are what each tick showed: the latest sample's OFU. The finished run's headline OFU is the
    # training window's, under the same key; the chart must not borrow that label.
    from trainmeter_web.follow import replayed_dashboard

    model = replayed_dashboard(EAGER)
    assert model.current_snapshot().metrics["ofu"].label.startswith("counters, training window")
    label = model.catalog()["tm:ofu"]["label"]
    assert label == "counters, latest sample, scaled to the 1980 MHz max SM clock"
