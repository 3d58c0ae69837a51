"""Where the paid GPU time went, as seff sums up a job (model/paid_time.py): GPU-hours allocated and used, idle GPUs,
peak memory per GPU, energy, money and goodput, each absent with its reason where unknown; and the end of a run's one
summary line, which gains the energy."""

from __future__ import annotations

from pathlib import Path

from tm_runs import REPO

from trainmeter_core.model import paid_time, records
from trainmeter_core.run.summary import summary_line

H200 = REPO / "tests" / "fixtures" / "real" / "h200-nanogpt-eager"
GIB = 2**30


def snapshot(**metrics: records.MetricValue) -> records.Snapshot:
    """A finished two-GPU run of an hour: 2 GPU-hours."""
    return records.Snapshot(
        tick=3600,
        t=3600.0,
        elapsed_s=3600.0,
        steps=100,
        state="finished",
        ranks=[
            records.RankStat(rank=0, host="n1", steps=100, device="n1/gpu0"),
            records.RankStat(rank=1, host="n1", steps=100, device="n1/gpu1"),
        ],
        metrics={
            "gpu_hours": records.MetricValue(value=2.0, unit="h"),
            "energy_j": records.MetricValue(value=7.2e6, unit="J"),
            "goodput": records.MetricValue(value=0.8),
            **metrics,
        },
    )


def sample(index: int, util: float, mem_gib: float, host: str = "n1") -> records.SampleGpu:
    return records.SampleGpu(
        host=host, index=index, util_gpu=util, mem_used_b=int(mem_gib * GIB), mem_total_b=80 * GIB
    )


def usage(*samples: records.SampleGpu) -> paid_time.GpuUsage:
    found = paid_time.GpuUsage()
    for s in samples:
        found.feed(s)
    return found


def test_used_gpu_hours_are_the_allocated_ones_times_the_run_s_mean_gpu_util_and_an_idle_gpu_is_named():
    # gpu0: GPU-Util 0.9 and 0.7 (mean 0.8); gpu1: 0.02 and 0.04 (mean 0.03, under 5%: idle); the node's gpu2 is not
    # the run's. Efficiency (0.8 + 0.03) / 2 = 0.415; used = 2 h × 0.415 = 0.83 h.
    got = paid_time.paid_time(
        snapshot(),
        usage(
            sample(0, 0.9, 30), sample(0, 0.7, 42), sample(1, 0.02, 1), sample(1, 0.04, 2), sample(2, 0.0, 70)
        ),
    )
    assert got["gpus"] == {"value": ["n1/gpu0", "n1/gpu1"]}
    assert got["allocated_gpu_hours"]["value"] == 2.0
    assert abs(got["used_gpu_hours"]["value"] - 0.83) < 1e-12
    assert abs(got["used_gpu_hours"]["efficiency"] - 0.415) < 1e-12
    assert got["idle_gpus"] == {"value": 1, "of": 2, "which": ["n1/gpu1"], "below": paid_time.IDLE_UTIL}
    assert got["peak_memory"]["value"] == {
        "n1/gpu0": {"peak_b": 42 * GIB, "total_b": 80 * GIB},
        "n1/gpu1": {"peak_b": 2 * GIB, "total_b": 80 * GIB},
    }
    lines = paid_time.lines(got)
    assert "GPU-hours used: 0.83 h (GPU efficiency 41.5%: the run's mean GPU-Util)" in lines
    assert "Idle GPUs: 1 of 2 (mean GPU-Util under 5%): n1/gpu1" in lines
    assert "Peak memory per GPU: n1/gpu0 42.0 GiB of 80.0 GiB; n1/gpu1 2.0 GiB of 80.0 GiB" in lines
    assert "Energy: 7.2 MJ (2 kWh)" in lines  # 7.2e6 J / 3.6e6 J per kWh
    assert "Goodput: 80.0%" in lines


def test_money_is_absent_without_a_price_and_is_gpu_hours_times_the_price_given_with_its_source():
    got = paid_time.paid_time(snapshot(), usage(sample(0, 0.9, 1), sample(1, 0.9, 1)))
    assert got["money"] == {"absent": paid_time.NO_PRICE}
    priced = paid_time.paid_time(
        snapshot(), None, paid_time.Price(per_gpu_hour=2.5, currency="USD", source="--price-per-gpu-hour")
    )
    assert priced["money"]["value"] == 5.0  # 2 GPU-hours × 2.5
    assert "Money: 5.00 USD (2.5 per GPU-hour, from --price-per-gpu-hour)" in paid_time.lines(priced)


def test_a_cpu_run_has_no_gpu_figure_and_says_why_once_per_figure():
    cpu = records.Snapshot(
        tick=1,
        elapsed_s=10.0,
        steps=5,
        ranks=[records.RankStat(rank=0, host="n1", steps=5, device="n1/cpu/rank0")],
        metrics={
            "gpu_hours": records.MetricValue(absent="the run computes on no GPU (its devices: cpu)"),
            "energy_j": records.MetricValue(absent="no GPU on this node: no NVML"),
        },
    )
    got = paid_time.paid_time(cpu, paid_time.GpuUsage())
    why = "the run computes on no GPU (its devices: cpu)"
    for key in ("gpus", "allocated_gpu_hours", "used_gpu_hours", "idle_gpus", "peak_memory"):
        assert got[key] == {"absent": why}, key
    assert got["energy_j"] == {"absent": "no GPU on this node: no NVML"}
    assert got["goodput"] == {"absent": "the snapshot has no goodput"}
    assert "GPU-hours used: n/a (the run computes on no GPU (its devices: cpu))" in paid_time.lines(got)


def test_a_gpu_of_the_run_with_no_sample_leaves_the_figures_made_from_samples_absent_and_names_it():
    got = paid_time.paid_time(snapshot(), usage(sample(0, 0.9, 1)))
    assert got["used_gpu_hours"] == {"absent": "no GPU-Util sample of n1/gpu1 in the run's log"}
    assert got["idle_gpus"] == got["used_gpu_hours"]
    assert got["allocated_gpu_hours"]["value"] == 2.0  # the engine's figure needs no sample
    assert paid_time.paid_time(snapshot(), None)["peak_memory"] == {
        "absent": "the run's GPU samples were not read"
    }


def test_the_real_h200_run_s_summary_from_its_log():
    from trainmeter_core.runlog import replay
    from trainmeter_core.runlog.gpu_usage import gpu_usage

    final = replay.final_snapshot(Path(H200), {})
    got = paid_time.paid_time(final, gpu_usage(Path(H200)))
    # The log's 27 samples of vm/gpu0 sum to a GPU-Util of 12.45: a mean of 0.4611 over the run, start-up included.
    assert got["gpus"]["value"] == ["vm/gpu0"]
    assert abs(got["used_gpu_hours"]["efficiency"] - 12.45 / 27) < 1e-9
    assert (
        got["used_gpu_hours"]["value"]
        == got["allocated_gpu_hours"]["value"] * got["used_gpu_hours"]["efficiency"]
    )
    assert got["idle_gpus"]["value"] == 0
    assert got["peak_memory"]["value"]["vm/gpu0"]["peak_b"] == 22410035200
    assert got["energy_j"]["value"] == final.metrics["energy_j"].value  # the engine's figure, whatever it is
    assert got["goodput"]["value"] == final.metrics["goodput"].value


def test_the_end_of_a_run_keeps_one_summary_line_and_the_energy_joins_it(tmp_path):
    summary = {
        "exit_status": 0,
        "elapsed_s": 3600.0,
        "steps": 100,
        "skipped_steps": 0,
        "bus": {"dropped_total": 0},
    }
    line = summary_line(tmp_path, summary, snapshot())
    assert "\n" not in line and " · energy 7.2 MJ · " in line
    without = snapshot(energy_j=records.MetricValue(absent="no two power readings"))
    assert "energy" not in summary_line(tmp_path, summary, without)
    words = paid_time.end_words(
        snapshot(), paid_time.Price(per_gpu_hour=2.5, currency="USD", source="TM_PRICE")
    )
    assert words == ["energy 7.2 MJ", "money 5.00 USD (price from TM_PRICE)"]
