"""On a machine without GPUs no GPU metric has a value: the GPU sampler's one "no NVML" row is no GPU (never a phantom
gpu0 whose Xid count reads 0), and a CPU run spends no GPU-hours. Unknown is absent, with the reason."""

from __future__ import annotations

import pytest
from tm_runs import REPO

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.model.platform_adapters import NO_NVML
from trainmeter_core.runlog import replay
from trainmeter_sources.gpu.sampler import no_nvml_row

GOLDEN = REPO / "tests" / "fixtures" / "golden"
#: Every metric that only a GPU can give a value to (with its per-GPU keys, ``<name>.<host>/gpu<i>``).
GPU_METRICS = (
    "util_gpu", "sm_active", "tensor_active", "dram_active", "ofu", "mfu_ofu_gap", "observed_flop", "observed_flops",
    "arithmetic_intensity", "energy_j", "gpu_hours", "util_gpu_avg", "sm_active_avg", "tensor_active_avg",
    "dram_active_avg", "ofu_avg", "power_w_avg", "clock_sm_mhz_avg", "gpu_power_throttle", "gpu_thermal_throttle",
    "gpu_xid", "gpu_xid_last", "gpu_ecc_uncorrected", "gpu_lost",
)  # fmt: skip


def gpu_values(snapshot: records.Snapshot) -> dict[str, records.MetricValue]:
    """The GPU metrics of a snapshot that hold a number (there must be none)."""
    found = {}
    for key, metric in snapshot.metrics.items():
        if key.split(".")[0] in GPU_METRICS or "/gpu" in key:
            if metric.value is not None or metric.low is not None or metric.high is not None:
                found[key] = metric
    return found


def cpu_run_without_nvml() -> list[records.Record]:
    logged: list = [
        records.RunStart(t=100.0, host="n1", run_id="r", name="t", run_dir="/r", command=["python"], cwd="/",
                     tm_version="0", python="3.11", platform="linux"),
        records.Fact(name="flop_per_token", value=1e6, provenance="declared", origin="--flops-per-token", host="n1"),
        records.Fact(name="device", value={"type": "cpu"}, provenance="detected", origin="agent", host="n1", rank=0),
    ]  # fmt: skip
    row = no_nvml_row(NO_NVML)
    row.t, row.host = 100.5, "n1"
    logged.append(row)
    for step in range(1, 6):
        logged.append(records.Step(t=100.0 + step, host="n1", step=step, tokens=100, step_time_s=1.0))
        logged.append(
            records.SampleHost(t=100.2 + step, host="n1", root_pid=1, procs=1, cpu_cores=1.0, window_s=1.0)
        )
        logged.append(records.Tick(t=100.5 + step, n=step, interval_s=1.0))
    logged.append(records.RunEnd(t=106.0, status=0, reason="exited", exit_code=0, elapsed_s=6.0))
    for seq, record in enumerate(logged, 1):
        record.seq = seq
    return logged


def test_a_cpu_run_on_a_node_without_nvml_has_no_gpu_metric_with_a_value():
    engine = Engine()
    snapshots = [s for r in cpu_run_without_nvml() for s in engine.feed(r)]
    assert len(snapshots) == 6 and snapshots[-1].final
    for snapshot in snapshots:
        assert gpu_values(snapshot) == {}, snapshot.tick
        assert not [k for k in snapshot.metrics if "/gpu" in k], snapshot.tick  # no phantom gpu0 at all
    final = snapshots[-1].metrics
    assert final["gpu_hours"].absent == "the run computes on no GPU (its devices: cpu)"
    assert final["util_gpu"].absent == (
        "the run's devices are not sampled GPUs (a CPU run is never scored against the node's GPUs)"
    )
    assert final["host_cpu_cores"].value == 1.0  # the host counters are still there, over the training window


def test_before_a_rank_reports_its_device_the_gpu_numbers_name_the_missing_nvml():
    engine = Engine()
    logged = [r for r in cpu_run_without_nvml() if not (isinstance(r, records.Fact) and r.name == "device")]
    snapshots = [s for r in logged for s in engine.feed(r)]
    metrics = snapshots[0].metrics
    for key in ("util_gpu", "tensor_active", "ofu", "energy_j", "util_gpu_avg"):
        assert metrics[key].value is None and metrics[key].absent == "no GPU on this node: no NVML", key


@pytest.mark.parametrize("name", ["cpu-measured", "no-budget", "two-rank"])
def test_the_golden_cpu_runs_recorded_without_nvml_replay_with_no_gpu_metric_valued(name):
    snapshots = list(replay.snapshots(GOLDEN / name))
    assert len(snapshots) > 1
    for snapshot in snapshots:
        assert gpu_values(snapshot) == {}, (name, snapshot.tick)
