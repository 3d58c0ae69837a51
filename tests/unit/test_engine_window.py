"""The counters over the training window: each sample weighted by the overlap of its own measurement window with the
span from its host's first step to its last; the live view's latest sample, the finished run's window; the host
counters alike; and the time goodput does not count, named."""

from __future__ import annotations

import random

import pytest
from test_engine import Run, feed

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine, training_window


def sample(t, window_s, **readings):
    return records.SampleGpu(t=t, host="n1", index=0, uuid="GPU-0", gpm_window_s=window_s, **readings)


def windowed_run():
    """One H100 SXM of rank 0; steps every 0.5 s from 110 to 120 (the window is [110, 120], 10 s); three samples:

    t 110.5, GPM window [109.5, 110.5] (0.5 s inside): util 0.9, tensor 0.2, SM clock 1500, power 300 W
    t 115.5, GPM window [110.5, 115.5] (5 s inside):   util 0.8, tensor 0.6, SM clock 1980, power 600 W
    t 120.5, GPM window [115.5, 120.5] (4.5 s inside): util 0.0, tensor 0.4, SM clock 1830, power 400 W
    """
    run = Run()
    run.shape("titan")
    run.gpu(0, "GPU-0")
    run.device(0, index=0, uuid="GPU-0")
    readings = {
        110.5: dict(util_gpu=0.9, tensor_active=0.2, clock_sm_mhz=1500.0, power_w=300.0),
        115.5: dict(util_gpu=0.8, tensor_active=0.6, clock_sm_mhz=1980.0, power_w=600.0),
        120.5: dict(util_gpu=0.0, tensor_active=0.4, clock_sm_mhz=1830.0, power_w=400.0),
    }
    windows = {110.5: 1.0, 115.5: 5.0, 120.5: 5.0}
    pending = sorted(readings)
    for i in range(21):
        t = 110.0 + 0.5 * i
        while pending and pending[0] < t:  # each record in the order the hub would see it
            at = pending.pop(0)
            run.add(sample(at, windows[at], clock_sm_max_mhz=1980.0, **readings[at]))
        run.step(t, i + 1, step_time_s=0.5 if i else None, tokens_global=32768)
    run.tick(120.2, 1)
    at = pending.pop(0)
    run.add(sample(at, windows[at], clock_sm_max_mhz=1980.0, **readings[at]))
    run.tick(120.6, 2)
    run.end(121.0)
    return run


def test_the_finished_run_shows_each_counter_weighted_by_its_samples_overlap_with_the_window():
    _, snaps = feed(windowed_run().records)
    final = snaps[-1]
    tensor = final.metrics["tensor_active"]
    # (0.2 × 0.5 + 0.6 × 5 + 0.4 × 4.5) / (0.5 + 5 + 4.5) = 4.9 / 10 = 0.49
    assert tensor.value == pytest.approx(0.49, rel=1e-12)
    assert tensor.label == "counters, training window"
    assert (tensor.window_start_t, tensor.window_end_t) == (110.0, 120.0)
    # GPU-Util has no window of its own: each reading stands for the time since the previous sample, so the first
    # (no previous) weighs nothing: (0.8 × 5 + 0.0 × 4.5) / 9.5 = 0.421053
    assert final.metrics["util_gpu"].value == pytest.approx(4.0 / 9.5, rel=1e-12)
    assert (
        "each reading stands for the time since the GPU's previous sample" in final.explain["util_gpu"].note
    )
    # OFU per sample: 0.2 × 1500 / 1830 = 0.163934, 0.6 × 1830 / 1830, 0.4 × 1830 / 1830;
    # (0.163934 × 0.5 + 0.6 × 5 + 0.4 × 4.5) / 10 = 0.488197
    assert final.metrics["ofu"].value == pytest.approx((0.2 * 1500 / 1830 * 0.5 + 3.0 + 1.8) / 10, rel=1e-12)
    assert final.metrics["ofu"].label == "counters, training window, scaled to the 1830 MHz tensor clock"
    # power: (600 × 5 + 400 × 4.5) / 9.5 = 505.263 W
    assert final.metrics["power_w_avg"].value == pytest.approx(4800 / 9.5, rel=1e-12)
    assert final.metrics["power_w_avg"].unit == "W"
    for key in ("util_gpu", "tensor_active", "ofu", "power_w", "clock_sm_mhz"):
        assert final.metrics[f"{key}_avg.n1/gpu0"] == final.metrics[f"{key}_avg"], key  # one GPU: the same


def test_while_the_run_lives_the_counters_are_the_latest_samples_and_say_so():
    _, snaps = feed(windowed_run().records)
    live = snaps[1]  # after the sample at 120.5
    tensor = live.metrics["tensor_active"]
    assert (tensor.value, tensor.label) == (0.4, "counters, latest sample")
    assert (tensor.window_start_t, tensor.window_end_t) == (115.5, 120.5)  # that sample's GPM window
    # … and the window so far beside it, as the finished run will show it
    assert live.metrics["tensor_active_avg"].value == pytest.approx(0.49, rel=1e-12)
    assert live.metrics["ofu"].label == "counters, latest sample, scaled to the 1830 MHz tensor clock"


def test_the_final_gap_and_intensity_pair_the_windows_ofu_and_dram_with_the_windows_mfu():
    run = windowed_run()
    for record in run.records:
        if isinstance(record, records.SampleGpu):
            record.dram_active = 0.5
    _, snaps = feed(run.records)
    final = snaps[-1].metrics
    # OFU over the window − MFU over the window
    assert final["mfu_ofu_gap"].value == pytest.approx(final["ofu"].value - final["mfu_avg"].value, rel=1e-12)
    # ridge 989.4e12 / 3.35e12 = 295.343 FLOP/byte × MFU over the window / DRAM over the window (0.5)
    assert final["arithmetic_intensity"].value == pytest.approx(989.4 / 3.35 * final["mfu_avg"].value / 0.5)


def test_the_window_state_survives_a_checkpoint_at_every_record():
    logged = windowed_run().records
    _, expected = feed(logged)
    for cut in range(1, len(logged)):
        engine, head = feed(logged[:cut])
        _, tail = feed(logged[cut:], Engine.from_state(engine.state_bytes()))
        assert head + tail == expected, f"cut at {cut}"


def test_a_run_that_never_stepped_ends_on_its_latest_sample_and_says_so():
    run = Run()
    run.gpu(0, "GPU-0")
    run.add(sample(101.0, 1.0, tensor_active=0.3, clock_sm_mhz=1500.0))
    run.add(sample(102.0, 1.0, tensor_active=0.7, clock_sm_mhz=1500.0))
    run.end(103.0)
    _, (final,) = feed(run.records)
    tensor = final.metrics["tensor_active"]
    assert (tensor.value, tensor.label) == (0.7, "counters, latest sample")  # no training window ever opened
    assert (
        final.metrics["tensor_active_avg"].absent
        == "no training step on n1 yet: its training window is not open"
    )


def test_the_host_counters_are_averaged_over_the_window_too():
    run = Run()
    run.steps(1, 11, tokens=100)  # 110 .. 115
    for t, cores, rss in ((110.5, 1.0, 100), (113.0, 3.0, 300), (116.0, 2.0, 200)):
        if t > 115.5:
            run.tick(115.5, 1)
        run.add(
            records.SampleHost(t=t, host="n1", root_pid=1, procs=1, cpu_cores=cores, rss_b=rss, window_s=2.5)
        )
    run.end(116.5)
    _, (live, final) = feed(run.records)
    assert live.metrics["host_cpu_cores"].value == 3.0  # the latest sample at the tick (113.0)
    assert live.metrics["host_cpu_cores"].label == "latest sample"
    # cores: windows [108, 110.5] (0.5 s in [110, 115]), [110.5, 113] (2.5 s), [113.5, 116] (1.5 s):
    # (1 × 0.5 + 3 × 2.5 + 2 × 1.5) / 4.5 = 11 / 4.5 = 2.444…
    assert final.metrics["host_cpu_cores"].value == pytest.approx(11 / 4.5, rel=1e-12)
    assert final.metrics["host_cpu_cores"].label == "training window"
    # RSS is a level: each reading holds since the previous sample: [110.5, 113] 2.5 s of 300, [113, 116] 2 s of 200
    # in the window: (300 × 2.5 + 200 × 2) / 4.5 = 255.6
    assert final.metrics["host_rss_b"].value == pytest.approx(1150 / 4.5, rel=1e-12)


def test_goodput_names_its_lost_time_bucket_by_bucket_and_the_compiling_apart_from_the_startup():
    run = Run()  # starts at 100
    run.add(records.Phase(t=108.0, start_t=104.0, end_t=108.0, phase="compile"))  # before the first step
    run.steps(1, 21, tokens=100)  # 110 .. 120
    run.add(records.Phase(t=116.0, start_t=114.0, end_t=116.0, phase="checkpoint"))
    run.add(records.Phase(t=118.0, start_t=117.5, end_t=118.0, phase="data_wait"))
    run.end(121.0)
    _, (final,) = feed(run.records)
    explain = final.explain["goodput"]
    # elapsed 21 s: 10 s before the first step (4 compiling, 6 start-up), 2 s of checkpoint, 0.5 s of data wait (badput,
    # as in ml-goodput-measurement), 1 s after the last step: 13.5 s lost, 7.5 s productive
    assert explain.note.startswith(
        "lost 13.5 s of 21.0 s: start-up and imports 6.0 s, compiling 4.0 s, checkpoints saved 2.0 s, "
        "after the last step 1.0 s, data wait 0.5 s"
    )
    assert explain.inputs["lost_s"].value == pytest.approx(13.5)
    assert explain.inputs["compile_s"].value == pytest.approx(4.0)
    assert final.metrics["goodput"].value == pytest.approx(7.5 / 21)


def test_gpu_hours_count_the_runs_gpus_only():
    run = Run()
    run.gpu(0, "GPU-0")
    run.device(0, index=0, uuid="GPU-0")
    run.device(1, "cpu")
    run.steps(1, 3, tokens=100)
    run.tick(136.0, 1)  # 36 s after the start at 100
    _, (snap,) = feed(run.records)
    # 36 s × 1 GPU / 3600 = 0.01 h (the CPU rank's device is not a GPU)
    assert snap.metrics["gpu_hours"].value == pytest.approx(0.01)


def test_a_window_keeps_few_pending_samples_and_stays_exact_when_the_steps_resume_past_them():
    sums: dict[str, training_window.WindowSum] = {}
    spans: dict[str, training_window.StepSpan] = {}
    training_window.extend_span(spans, "n1", 0.0)
    # 30 one-second samples while no step comes (a long eval), then a step at 30 s: the window is [0, 30]
    for i in range(30):
        training_window.add_sample(sums, "x", float(i), float(i + 1), float(i % 3), spans["n1"])
        assert len(sums["x"].pending) <= training_window.MAX_PENDING
    training_window.extend_span(spans, "n1", 30.0)
    mean, covered = training_window.average(sums["x"], spans["n1"])
    # values 0, 1, 2 repeated ten times: mean 1.0 over 30 s
    assert (mean, covered) == (pytest.approx(1.0, rel=1e-12), pytest.approx(30.0))


def test_a_sample_settled_on_the_spot_adds_what_the_pending_way_adds_pauses_and_all():
    """``add_sample`` settles a sample that ends inside the window with nothing pending at once, without a Pending:
    it must leave the window exactly as the general way (queue it, then ``_settle``), across a resume's pause too."""
    rng = random.Random(16)
    for gaps in ([], [(12.0, 15.5)], [(3.0, 4.0), (20.0, 26.0)]):
        span = training_window.StepSpan(first_t=2.0, last_t=2.0, gaps=list(gaps))
        fast: dict[str, training_window.WindowSum] = {}
        general: dict[str, training_window.WindowSum] = {}
        on_the_spot = 0
        for i in range(300):
            span.last_t = 2.0 + i * 0.2  # the steps go on
            # A reading just before, at or just after the last step, over no time or up to 2 s
            end = span.last_t + rng.choice((-0.1, -0.05, 0.0, 0.05))
            start = end - rng.choice((0.0, 0.1, 0.5, 2.0))
            value = rng.uniform(0.0, 1.0)
            on_the_spot += start < end <= span.last_t and not (fast and fast["x"].pending)
            training_window.add_sample(fast, "x", start, end, value, span)
            if start < end:  # the general way, as add_sample took it before it settled samples on the spot
                window = general.setdefault("x", training_window.WindowSum())
                window.pending.append(training_window.Pending(start, end, value))
                training_window.settle(window, span)
        assert on_the_spot > 100  # the way under test is the one taken
        assert fast["x"].weighted == general["x"].weighted
        assert fast["x"].covered_s == general["x"].covered_s
        assert fast["x"].pending == general["x"].pending


def test_a_sample_whose_window_began_before_the_first_step_counts_only_its_part_inside():
    # Each sample comes after a step later than its end (as a sampler's usually does), so each settles at once;
    # the third's GPM window [108, 116] began 2 s before the first step (110): 6 s of it count, not 8.
    run = Run()
    run.shape("titan")
    run.gpu(0, "GPU-0")
    run.device(0, index=0, uuid="GPU-0")
    samples = [(111.0, 1.0, 0.2), (113.0, 2.0, 0.4), (116.0, 8.0, 0.6)]  # t, GPM window, tensor_active
    for i in range(21):
        t = 110.0 + 0.5 * i
        run.step(t, i + 1, step_time_s=0.5 if i else None, tokens_global=32768)
        while samples and samples[0][0] < t - 0.25:
            at, window_s, tensor = samples.pop(0)
            run.add(sample(at, window_s, tensor_active=tensor, clock_sm_mhz=1830.0, clock_sm_max_mhz=1980.0))
    run.tick(120.2, 1)
    run.end(121.0)
    _, snaps = feed(run.records)
    # (0.2 × 1 + 0.4 × 2 + 0.6 × 6) / (1 + 2 + 6)
    assert snaps[-1].metrics["tensor_active"].value == pytest.approx(4.6 / 9, rel=1e-12)


def _settle_as_written_first(window: training_window.WindowSum, span: training_window.StepSpan) -> None:
    """``settle`` as it was first written (one sample at a time through ``_overlap``, into the window's attributes):
    the reference the settle of today must equal bit for bit."""
    kept = []
    for sample in window.pending:
        if sample.end_t <= span.last_t:
            overlap = training_window._overlap(span, sample.start_t, sample.end_t, sample.end_t)
            if overlap > 0:
                window.weighted += sample.value * overlap
                window.covered_s += overlap
        else:
            kept.append(sample)
    while len(kept) > training_window.MAX_PENDING:
        first, second = kept[1], kept[2]
        length = (first.end_t - first.start_t) + (second.end_t - second.start_t)
        mean = (
            first.value * (first.end_t - first.start_t) + second.value * (second.end_t - second.start_t)
        ) / length
        kept[1:3] = [
            training_window.Pending(min(first.start_t, second.start_t), max(first.end_t, second.end_t), mean)
        ]
    window.pending = kept


def test_settling_a_pending_sample_adds_exactly_what_it_added_one_sample_at_a_time():
    """A sampler's readings that reach past the latest step (a GPU sampled before the agent's window of steps comes)
    wait and settle: the settle that works the no-pause overlap out in place must leave every window as the
    reference above, bit for bit, with and without a resume's pauses, samples straddling the first step included."""
    rng = random.Random(42)
    settled = 0
    for gaps in ([], [(12.0, 15.5)], [(3.0, 4.0), (20.0, 26.0)]):
        span = training_window.StepSpan(first_t=2.0, last_t=2.0, gaps=list(gaps))
        ours = training_window.WindowSum()
        reference = training_window.WindowSum()
        for i in range(400):
            span.last_t = 2.0 + i * 0.1 + rng.choice((0.0, 0.0, 0.3))  # the steps come in windows
            end = 2.0 + i * 0.1 + rng.uniform(-2.5, 1.5)  # before the first step, inside, or past the last
            start = end - rng.choice((0.05, 0.5, 1.0, 3.0))
            value = rng.uniform(0.0, 700.0)
            for window in (ours, reference):
                window.pending.append(training_window.Pending(start, end, value))
            before = len(ours.pending)
            training_window.settle(ours, span)
            _settle_as_written_first(reference, span)
            settled += before > len(ours.pending)
            assert (ours.weighted, ours.covered_s) == (reference.weighted, reference.covered_s)
            assert ours.pending == reference.pending
    assert settled > 300  # the ways under test are the ones taken
