"""The run's energy (``engine/energy.py``): NVML's total energy counter, its rises between samples on the run's GPUs
only; the integral of sampled power, labelled, where a GPU has no counter; an interval where the counter goes back
dropped and counted; absent on a MIG slice, on a GPU another process uses, on a CPU run; kWh, J per token and J per
step. Also the sampler's side of it (which processes on a GPU are not the run's), and the fake NVML's rows through the
sampler into the engine (the fake's counter itself: ``test_fake_pynvml.py``)."""

from __future__ import annotations

import pytest

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.model.platform_adapters import NOT_ON_THIS_DEVICE
from trainmeter_sources.gpu import fake_pynvml as nvml
from trainmeter_sources.gpu.sampler import HOST_PIDS, NO_RUN_PIDS, GpuSession, mark_other_processes


def feed(engine: Engine, *logged: records.Record) -> list[records.Snapshot]:
    out: list[records.Snapshot] = []
    for seq, record in enumerate(logged, start=(engine.state.through_seq or 0) + 1):
        record.seq = seq
        out += engine.feed(record)
    return out


def tick(n: int, t: float) -> records.Tick:
    return records.Tick(n=n, interval_s=1.0, child_alive=True, t=t, wall=1e9 + t)


def row(index: int, t: float, counter_j: float | None, power_w: float = 100.0, **fields) -> records.SampleGpu:
    absent = {"energy_j": NOT_ON_THIS_DEVICE} if counter_j is None else {}
    return records.SampleGpu(
        host="n1", index=index, t=t, energy_j=counter_j, power_w=power_w, absent=absent, **fields
    )


def last(engine: Engine, *logged: records.Record) -> records.Snapshot:
    snapshots = feed(engine, *logged, tick(99, 100.0))
    return snapshots[-1]


def test_energy_is_the_sum_of_each_gpus_counter_rises():
    snap = last(
        Engine(),
        *[row(0, t, 5000.0 + 300.0 * t, power_w=1.0) for t in (1.0, 2.0, 3.0)],
        *[row(1, t, 9000.0 + 100.0 * t, power_w=1.0) for t in (1.0, 2.0, 3.0)],
    )
    energy = snap.metrics["energy_j"]
    # gpu0: 300 J/s × 2 s = 600 J; gpu1: 100 J/s × 2 s = 200 J. The power (1 W) would have said 4 J: not used.
    assert energy.value == pytest.approx(800.0) and energy.label == "energy counter"
    inputs = snap.explain["energy_j"].inputs
    assert inputs["n1/gpu0"].value == pytest.approx(600.0) and inputs["n1/gpu1"].value == pytest.approx(200.0)
    assert snap.metrics["energy_kwh"].value == pytest.approx(800.0 / 3.6e6)


def test_a_gpu_watched_for_the_hardware_view_only_is_never_the_runs():
    engine = Engine()
    snap = last(
        engine,
        *[row(0, t, 300.0 * t) for t in (1.0, 2.0, 3.0)],
        *[row(1, t, 100.0 * t, for_run=False) for t in (1.0, 2.0, 3.0)],
    )
    assert snap.metrics["energy_j"].value == pytest.approx(600.0)  # gpu0's 300 J/s × 2 s, nothing of gpu1
    assert "n1/gpu1" not in snap.explain["energy_j"].inputs
    only_watched = last(Engine(), *[row(1, t, 100.0 * t, for_run=False) for t in (1.0, 2.0)])
    assert only_watched.metrics["energy_j"].absent.startswith("no GPU is known to be the run's")


def test_a_gpu_the_ranks_reported_is_the_runs_even_while_the_sampler_only_watches_it():
    uuid = "GPU-run"
    gpu_fact = {"index": 0, "uuid": uuid, "name": "NVIDIA H100 80GB HBM3", "spec_id": "h100-sxm"}
    facts = [
        records.Fact(
            name="gpu",
            value=gpu_fact,
            provenance="detected",
            origin="sampler:nvml",
            host="n1",
            device="n1/gpu0",
        ),
        records.Fact(
            name="device",
            value={"type": "cuda", "index": 0, "uuid": uuid},
            provenance="detected",
            origin="agent",
            host="n1",
            rank=0,
        ),
    ]
    # The selection waits for the run's processes (a container whose NVML lists none): every row is for_run False.
    snap = last(
        Engine(),
        *facts,
        *[row(0, t, 300.0 * t, for_run=False) for t in (1.0, 2.0, 3.0)],
        *[row(1, t, 100.0 * t, for_run=False) for t in (1.0, 2.0, 3.0)],
    )
    assert snap.metrics["energy_j"].value == pytest.approx(600.0)  # gpu0, the rank's: 300 J/s × 2 s
    assert set(snap.explain["energy_j"].inputs) == {"n1/gpu0"}
    assert "held_util_gpu.n1/gpu0" in snap.metrics and "held_util_gpu.n1/gpu1" not in snap.metrics


def test_an_interval_where_the_counter_goes_back_is_dropped_and_counted():
    # rises of 300 J, then a driver reload (back to 50 J), then 300 J again: 600 J, one interval dropped
    counters = [(1.0, 1000.0), (2.0, 1300.0), (3.0, 50.0), (4.0, 350.0)]
    snap = last(Engine(), *[row(0, t, c) for t, c in counters])
    energy = snap.metrics["energy_j"]
    assert energy.value == pytest.approx(600.0)
    assert energy.label == "energy counter, 1 interval dropped (counter went backwards)"
    assert snap.explain["energy_j"].inputs["dropped_intervals"].value == 1


def start(t: float, attempt: int) -> records.RunStart:
    return records.RunStart(
        t=t, run_id="r1", name="train", run_dir="/runs/r1", command=["python", "train.py"], cwd="/w",
        tm_version="0.1.0", python="3.11", platform="linux", attempt=attempt, host="n1", wall=1e9 + t,
    )  # fmt: skip


def test_a_resumed_runs_down_time_is_not_its_energy():
    # attempt 1 reads 300 J/s from t=1 to 3; the run is down until 30, when attempt 2 reads on at 300 J/s; the GPU
    # went on drawing meanwhile (the counter rose 9000 J), which is no energy of the run's
    logged = [start(0.5, 1), *[row(0, t, 300.0 * t) for t in (1.0, 2.0, 3.0)]]
    logged += [start(30.0, 2), *[row(0, t, 300.0 * t) for t in (31.0, 32.0)]]
    snap = last(Engine(), *logged)
    assert snap.metrics["energy_j"].value == pytest.approx(900.0)  # 300 × 2 s + 300 × 1 s


def test_a_gpu_without_the_counter_gives_the_integral_of_its_power_labelled():
    snap = last(
        Engine(),
        *[row(0, t, 300.0 * t) for t in (1.0, 2.0, 3.0)],
        *[row(1, t, None, power_w=150.0) for t in (1.0, 2.0, 3.0)],
    )
    energy = snap.metrics["energy_j"]
    # gpu0 counter 600 J; gpu1 150 W × (1 s + 1 s) = 300 J from its samples
    assert energy.value == pytest.approx(900.0)
    assert energy.label == "energy counter; ∫ sampled power on n1/gpu1 (no counter)"
    source = snap.explain["energy_j"].inputs["n1/gpu1"].source
    assert source == f"∫ sampled power over 2 samples: no energy counter ({NOT_ON_THIS_DEVICE})"
    alone = last(Engine(), *[row(1, t, None, power_w=150.0) for t in (1.0, 2.0, 3.0)])
    assert alone.metrics["energy_j"].label == "∫ sampled power (no energy counter)"


def test_energy_is_absent_on_a_gpu_another_process_also_uses():
    snap = last(
        Engine(),
        row(0, 1.0, 100.0),
        row(0, 2.0, 400.0, other_pids=[4242]),
        row(0, 3.0, 700.0),
    )
    reason = "another process also uses n1/gpu0 (pid 4242): its energy counter counts both"
    for key in ("energy_j", "energy_kwh", "energy_j_per_token", "energy_j_per_step"):
        assert snap.metrics[key].absent == reason


def test_energy_is_absent_on_a_mig_slice():
    parent = "GPU-0a1b"
    snap = last(Engine(), *[row(0, t, None, mig_parent_uuid=parent) for t in (1.0, 2.0)])
    assert snap.metrics["energy_j"].absent == (
        f"n1/gpu0 is a MIG slice: NVML's energy counter and power are the whole GPU's ({parent}), shared with its "
        "other slices"
    )


def test_energy_is_absent_on_a_cpu_node_with_the_nodes_reason():
    no_nvml = records.SampleGpu(host="n1", index=0, t=1.0, absent={"index": "no NVML"})
    snap = last(Engine(), no_nvml)
    assert snap.metrics["energy_j"].absent == "no GPU on this node: no NVML"
    assert snap.metrics["energy_j_per_step"].absent == "no GPU on this node: no NVML"


def test_joules_per_token_and_per_step_divide_the_whole_runs_energy():
    steps = [records.Step(step=i, t=1.0 + i, tokens=1000) for i in range(1, 5)]
    snap = last(Engine(), *[row(0, t, 250.0 * t) for t in (1.0, 2.0, 3.0, 4.0, 5.0)], *steps)
    # 250 J/s × 4 s = 1000 J over 4 steps of 1000 tokens: 250 J/step, 0.25 J/token
    assert snap.metrics["energy_j_per_step"].value == pytest.approx(250.0)
    assert snap.metrics["energy_j_per_token"].value == pytest.approx(0.25)
    without_tokens = last(Engine(), *[row(0, t, 250.0 * t) for t in (1.0, 2.0)], records.Step(step=1, t=2.0))
    assert (
        without_tokens.metrics["energy_j_per_token"].absent
        == "tokens per step unknown: pass --tokens-per-step"
    )


def test_a_note_says_when_tm_could_not_tell_whether_another_process_uses_the_gpu():
    unknown = {"other_pids": HOST_PIDS}
    rows = [row(0, t, 100.0 * t) for t in (1.0, 2.0)]
    for r in rows:
        r.absent = dict(unknown)
    snap = last(Engine(), *rows)
    assert snap.metrics["energy_j"].value == pytest.approx(100.0)
    assert snap.explain["energy_j"].note == (
        f"n1/gpu0: tm could not tell whether another process uses it ({HOST_PIDS})"
    )


# -- the sampler: which processes on a GPU are not the run's -----------------------------------------------------------


def gpu_row(*pids: int) -> records.SampleGpu:
    return records.SampleGpu(index=0, processes=[records.GpuProcess(pid=pid) for pid in pids])


def test_the_sampler_names_the_processes_on_a_gpu_that_are_not_the_runs():
    rows = [gpu_row(10, 11, 4242), gpu_row(10)]
    mark_other_processes(rows, {10, 11}, container=False, for_run=True)
    assert [r.other_pids for r in rows] == [[4242], []]
    assert all(r.for_run for r in rows) and not any("other_pids" in r.absent for r in rows)


def test_inside_a_container_whose_nvml_shows_host_pids_the_sampler_says_it_cannot_tell():
    rows = [gpu_row(91234), gpu_row()]
    mark_other_processes(rows, {10, 11}, container=True, for_run=True)
    assert rows[0].absent["other_pids"] == HOST_PIDS and rows[0].other_pids == []
    assert "other_pids" not in rows[1].absent  # nobody on it at all
    unknown = [gpu_row(10)]
    mark_other_processes(unknown, set(), container=False, for_run=False)
    assert unknown[0].absent["other_pids"] == NO_RUN_PIDS and not unknown[0].for_run


# -- through the sampler and the fake NVML ----------------------------------------------------------------------


def test_through_the_sampler_each_gpu_gives_its_own_counter_and_a_reload_is_dropped(clock):
    machine = nvml.install(nvml.FakeMachine("3xH100"))
    machine.apply_script(
        {
            "0": {"power_w": 300},
            "1": {"power_w": 100, "energy_reset_after_s": 2.5},
            "2": {"power_w": 200, "fail": {"nvmlDeviceGetTotalEnergyConsumption": "not_supported"}},
        }
    )
    session = GpuSession.open({"TM_FAKE_GPUS": "3xH100", "CUDA_VISIBLE_DEVICES": "0,1,2"}, host="n1")
    engine = Engine()
    logged: list[records.Record] = []
    for _ in range(5):
        rows = session.sample(clock.now_s - 1000.0)
        mark_other_processes(rows, {10}, container=False, for_run=session.selection.for_run)
        for one in rows:
            one.host = "n1"  # the bus client stamps it on the way out
        logged += rows
        clock.now_s += 1
    snap = last(engine, *logged)
    inputs = snap.explain["energy_j"].inputs
    # 4 intervals of 1 s: gpu0 300 J each; gpu1 100 J each but the one across its reload at 2.5 s dropped; gpu2
    # without a counter: 200 W × 4 s from its samples
    assert inputs["n1/gpu0"].value == pytest.approx(1200.0)
    assert inputs["n1/gpu1"].value == pytest.approx(300.0)
    assert inputs["n1/gpu2"].value == pytest.approx(800.0)
    assert snap.metrics["energy_j"].value == pytest.approx(2300.0)
    assert snap.metrics["energy_j"].label == (
        "energy counter; ∫ sampled power on n1/gpu2 (no counter), 1 interval dropped (counter went backwards)"
    )
    session.close()


def test_through_the_sampler_a_mig_slice_has_no_energy(clock):
    machine = nvml.install(nvml.FakeMachine("1xH100"))
    machine.apply_script({"0": {"mig": [66, 66], "power_w": 400}})
    mig_uuid = machine.gpus[0].mig_devices[0].uuid
    session = GpuSession.open({"TM_FAKE_GPUS": "1xH100", "CUDA_VISIBLE_DEVICES": mig_uuid}, host="n1")
    logged: list[records.Record] = []
    for _ in range(3):
        rows = session.sample(clock.now_s - 1000.0)
        mark_other_processes(rows, {10}, container=False, for_run=session.selection.for_run)
        for one in rows:
            one.host = "n1"
        logged += rows
        clock.now_s += 1
    # NVML answers Not Supported for the slice's counter; the slice's energy is absent, never its parent's 400 W.
    assert logged[0].absent["energy_j"] == NOT_ON_THIS_DEVICE
    snap = last(Engine(), *logged)
    assert snap.metrics["energy_j"].absent == (
        f"n1/gpu0 is a MIG slice: NVML's energy counter and power are the whole GPU's ({machine.gpus[0].uuid}), "
        "shared with its other slices"
    )
    session.close()
