"""The formulas behind every derived number, each pinned by a value computed by hand (the arithmetic in a comment)."""

from __future__ import annotations

import pytest

from trainmeter_core.model import formulas

# The 1.04B model of SPEC.md under titan: 6(N-E) + 12·L·d·T = 6,282,928,128 FLOP per token (pinned in test_flops).
TITAN_1B_FLOPS_PER_TOKEN = 6_282_928_128
# H100 SXM dense BF16: 989.4 TFLOPS (Hopper whitepaper, Table 3); memory bandwidth 3.35 TB/s (nvidia.com/h100).
H100_SXM_PEAK_FLOPS = 989.4e12
H100_SXM_BANDWIDTH_BPS = 3.35e12


def test_ema_starts_at_the_first_sample_and_moves_by_alpha_of_the_gap():
    assert formulas.ema(None, 4.0) == 4.0
    # 4 + 0.1 × (6 − 4) = 4.2
    assert formulas.ema(4.0, 6.0, 0.1) == pytest.approx(4.2, rel=1e-15)
    assert formulas.EMA_ALPHA == 0.1


def test_a_rate_is_the_ratio_of_the_two_emas():
    # 8192 tokens per step / 0.5 s per step = 16,384 tokens/s
    assert formulas.rate_per_s(8192.0, 0.5) == 16384.0
    with pytest.raises(ValueError, match="step interval"):
        formulas.rate_per_s(8192.0, 0.0)


def test_mfu_matches_a_hand_calculation_on_eight_h100s():
    # 6,282,928,128 FLOP/token × 100,000 tokens/s = 6.282928128e14 FLOP/s
    # / (8 × 989.4e12 = 7.9152e15 FLOP/s) = 0.0793780084899939
    assert formulas.mfu(TITAN_1B_FLOPS_PER_TOKEN, 100_000, 8 * H100_SXM_PEAK_FLOPS) == pytest.approx(
        0.0793780084899939, rel=1e-12
    )


def test_mfu_refuses_a_zero_peak_instead_of_dividing_by_it():
    with pytest.raises(ValueError, match="total dense peak"):
        formulas.mfu(6e9, 1e5, 0.0)


def test_the_training_window_average_divides_tokens_by_window_seconds():
    # 6e9 FLOP/token × 3.6e9 tokens = 2.16e19 FLOP; 7.9152e15 FLOP/s × 3600 s = 2.849472e19 FLOP
    # 2.16e19 / 2.849472e19 = 0.758035172832019
    assert formulas.mfu_window_average(6e9, 3.6e9, 3600.0, 8 * H100_SXM_PEAK_FLOPS) == pytest.approx(
        0.758035172832019, rel=1e-12
    )
    with pytest.raises(ValueError, match="training window"):
        formulas.mfu_window_average(6e9, 3.6e9, 0.0, 1e15)


def test_ofu_is_not_credited_for_boosting_above_the_tensor_clock():
    # tensor active 0.5, SM clock 1980 (NVML's max on H100 SXM), tensor clock 1830: 0.5 × min(1980, 1830)/1830 = 0.5
    assert formulas.ofu(0.5, 1980.0, 1830.0) == 0.5


def test_ofu_scales_down_with_a_throttled_sm_clock():
    # 0.5 × 1500 / 1830 = 0.40983606557377
    assert formulas.ofu(0.5, 1500.0, 1830.0) == pytest.approx(0.40983606557377, rel=1e-12)


def test_ofu_refuses_a_tensor_activity_outside_zero_to_one():
    with pytest.raises(ValueError, match="tensor active"):
        formulas.ofu(1.5, 1500.0, 1830.0)


def test_observed_flop_are_ofu_seconds_times_the_peak():
    # Σ OFU × window = 0.5 × 1 s × 3600 samples = 1800 s; × 989.4e12 FLOP/s = 1.78092e18 FLOP
    assert formulas.observed_flop(1800.0, H100_SXM_PEAK_FLOPS) == pytest.approx(1.78092e18, rel=1e-12)


def test_arithmetic_intensity_is_the_ridge_times_mfu_over_dram_active():
    # ridge = 989.4e12 / 3.35e12 = 295.343283582090 FLOP/byte
    assert formulas.ridge_flop_per_byte(H100_SXM_PEAK_FLOPS, H100_SXM_BANDWIDTH_BPS) == pytest.approx(
        295.34328358209, rel=1e-12
    )
    # 295.343283582090 × 0.4 / 0.5 = 236.274626865672 FLOP/byte
    assert formulas.arithmetic_intensity(
        0.4, H100_SXM_PEAK_FLOPS, H100_SXM_BANDWIDTH_BPS, 0.5
    ) == pytest.approx(236.274626865672, rel=1e-12)
    with pytest.raises(ValueError, match="DRAM active"):
        formulas.arithmetic_intensity(0.4, H100_SXM_PEAK_FLOPS, H100_SXM_BANDWIDTH_BPS, 0.0)


def test_goodput_counts_productive_step_time_over_elapsed():
    # 3000 s of productive step time / 4000 s elapsed = 0.75 (a data wait is badput)
    assert formulas.goodput(3000.0, 4000.0) == pytest.approx(0.75, rel=1e-15)
    with pytest.raises(ValueError, match="elapsed"):
        formulas.goodput(1.0, 0.0)


def test_progress_is_a_fraction_that_stops_at_one():
    # 5e8 / 2e9 = 0.25
    assert formulas.progress(5e8, 2e9) == 0.25
    assert formulas.progress(3e9, 2e9) == 1.0
    with pytest.raises(ValueError, match="budget"):
        formulas.progress(1.0, 0.0)


def test_eta_is_remaining_over_rate():
    # 1e9 tokens left at 2e5 tokens/s = 5000 s
    assert formulas.eta_s(1e9, 2e5) == 5000.0
    assert formulas.eta_s(-5.0, 2e5) == 0.0  # past the budget: nothing left
    # projected: (elapsed 2 h = 7200 s + ETA 5000 s) / 3600 = 3.38888… h
    assert formulas.projected_hours(7200.0, 5000.0) == pytest.approx(12200 / 3600, rel=1e-15)


def test_gpu_hours_are_elapsed_times_devices():
    # 1800 s × 8 devices / 3600 = 4 device-hours
    assert formulas.gpu_hours(1800.0, 8) == 4.0


def test_straggler_spread_is_max_minus_min_over_median_and_names_the_slowest():
    # (1.3 − 1.0) / median 1.1 = 0.272727…; the slowest (1.3 s) is at position 1
    spread, slowest = formulas.straggler_spread([1.0, 1.3, 1.1])
    assert spread == pytest.approx(0.3 / 1.1, rel=1e-12)
    assert slowest == 1
    with pytest.raises(ValueError, match="2 ranks"):
        formulas.straggler_spread([1.0])


def test_median_of_an_even_count_is_the_mean_of_the_middle_two():
    assert formulas.median([4.0, 1.0, 3.0, 2.0]) == 2.5  # (2 + 3) / 2
    assert formulas.median([5.0, 1.0, 3.0]) == 3.0


def test_mean_needs_a_value():
    assert formulas.mean([0.25, 0.75]) == 0.5
    with pytest.raises(ValueError):
        formulas.mean([])


def test_time_split_names_every_bucket_and_adds_up_to_elapsed():
    # elapsed 130: 20 s start-up (less nothing), phases 2 compile + 10 data wait + 5 checkpoint + 3 load + 1 eval,
    # a 4 s hang, 6 s done again, 15 s down, 1 s after the last step, 60 s compute: 127, so 3 s are other
    split = formulas.time_split(
        elapsed_s=130.0,
        compute_s=60.0,
        startup_s=20.0,
        after_last_step_s=1.0,
        phase_s={"compile": 2.0, "data_wait": 10.0, "checkpoint": 5.0, "checkpoint_load": 3.0, "eval": 1.0},
        hang_s=4.0,
        superseded_s=6.0,
        down_s=15.0,
    )
    assert split == {
        "startup": 20.0, "compile": 2.0, "data_wait": 10.0, "checkpoint": 5.0, "checkpoint_load": 3.0, "eval": 1.0,
        "profiler": 0.0, "hang": 4.0, "superseded": 6.0, "down": 15.0, "after_last_step": 1.0, "other": 3.0,
        "compute": 60.0,
    }  # fmt: skip
    assert sum(split.values()) == 130.0


def test_a_startup_phase_joins_the_start_up_bucket():
    split = formulas.time_split(
        elapsed_s=15.0, compute_s=0.0, startup_s=13.0, after_last_step_s=0.0, phase_s={"startup": 2.0},
        hang_s=0.0, superseded_s=0.0, down_s=0.0,
    )  # fmt: skip
    assert (split["startup"], split["other"]) == (15.0, 0.0)
