"""The GPU sampler through the real backend over the fake pynvml: GPM rates and windows, the gpu facts and their peaks,
which GPUs are watched, profilers, Xids, and a run on a node without NVML."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from deadline import wait_for
from tm_runs import log_records, only_run, run_tm

from trainmeter_core.bus.proctree import read_environ
from trainmeter_core.model.platform_adapters import FIRST_SAMPLE, PROFILER_ATTACHED, PlatformAdapter
from trainmeter_sources.gpu import fake_pynvml as nvml
from trainmeter_sources.gpu import nvml as backend
from trainmeter_sources.gpu.nvml import DeviceInfo
from trainmeter_sources.gpu.sampler import GpuSession
from trainmeter_sources.gpu.selection import (
    CONTAINER_HOST_PIDS,
    Selection,
    SelectionError,
    narrow_to_processes,
)
from trainmeter_sources.profilers import find_profiler, profiler_in_environment
from trainmeter_sources.sampling_interval import interval_from_env


def open_session(spec: str, environ: dict | None = None, script: dict | None = None):
    machine = nvml.install(nvml.FakeMachine(spec))
    if script:
        machine.apply_script(script)
    session = GpuSession.open({"TM_FAKE_GPUS": spec, **(environ or {})}, host="node1")
    return machine, session


# -- GPM -------------------------------------------------------------------------------------------------------------


def test_two_gpm_samples_give_the_documented_rates_and_the_ofu_of_the_specs_formula(clock):
    machine, session = open_session("1xH100")
    gpu = machine.gpus[0]
    gpu.set(tensor_active=0.2, sm_active=0.9, dram_active=0.55, hmma_tensor_active=0.1, sm_occupancy=0.5)
    first = session.sample(clock.now_s)[0]
    assert first.absent["tensor_active"] == FIRST_SAMPLE and first.tensor_active is None
    clock.now_s += 0.5
    gpu.set(tensor_active=0.6, hmma_tensor_active=0.3)
    clock.now_s += 0.5
    row = session.sample(clock.now_s)[0]
    # GPM's "percent of time over the interval": (0.2 x 0.5 s + 0.6 x 0.5 s) / 1.0 s = 0.4 tensor-pipe active
    assert row.tensor_active == pytest.approx(0.4)
    assert row.tensor_hmma_active == pytest.approx(0.2)  # (0.1 x 0.5 + 0.3 x 0.5) / 1.0
    assert row.sm_active == pytest.approx(0.9) and row.dram_active == pytest.approx(0.55)
    assert row.sm_occupancy == pytest.approx(0.5)
    assert row.gpm_window_s == pytest.approx(1.0) and row.gpm_window_start_t == pytest.approx(1000.0)
    # OFU = tensor active x min(SM clock, tensor clock) / tensor clock, with the spec's 1830 MHz tensor clock:
    fact = session.facts()[0].value
    assert fact["tensor_clock_mhz"] == 1830
    ofu = row.tensor_active * min(row.clock_sm_mhz, fact["tensor_clock_mhz"]) / fact["tensor_clock_mhz"]
    assert ofu == pytest.approx(0.4)  # the SM clock (1980 MHz) is above the tensor clock: min is 1830
    gpu.set(sm_clock_mhz=1500)
    clock.now_s += 1.0
    row = session.sample(clock.now_s)[0]
    ofu = row.tensor_active * min(row.clock_sm_mhz, 1830) / 1830
    assert ofu == pytest.approx(0.6 * 1500 / 1830)  # 0.6 x 1500 / 1830 = 0.49180...


def test_a_profiler_pauses_gpm_and_the_next_window_starts_afresh(clock):
    _, session = open_session("1xH100")
    session.sample(clock.now_s)
    clock.now_s += 1
    paused = session.sample(clock.now_s, paused=PROFILER_ATTACHED)[0]
    assert paused.absent["tensor_active"] == PROFILER_ATTACHED and paused.tensor_active is None
    assert paused.power_w == 70.0  # NVML's own counters still read
    clock.now_s += 1
    resumed = session.sample(clock.now_s)[0]
    assert resumed.absent["tensor_active"] == FIRST_SAMPLE  # never a window that spans the profiler
    clock.now_s += 1
    assert session.sample(clock.now_s)[0].gpm_window_s == pytest.approx(1.0)


def test_gpm_before_hopper_is_absent_and_pcie_comes_from_nvml_instead(clock):
    machine, session = open_session("1xA100")
    machine.gpus[0].set(pcie_tx_bps=2e9)
    session.sample(clock.now_s)
    clock.now_s += 1
    row = session.sample(clock.now_s)[0]
    assert row.absent["sm_active"] == "GPM not supported before Hopper"
    assert row.pcie_tx_bps == 2e9  # nvmlDeviceGetPcieThroughput: 2e9 B/s / 1000 = 2e6 KB/s, x 1000 back


def test_nvlink_rates_come_from_the_cumulative_counters(clock):
    machine, session = open_session("1xA100")
    machine.gpus[0].set(nvlink_tx_bps=4 * 1024**3)
    assert session.sample(clock.now_s)[0].absent["nvlink_tx_bps"] == FIRST_SAMPLE
    clock.now_s += 2
    row = session.sample(clock.now_s)[0]
    # 4 GiB/s for 2 s = 8 GiB = 8388608 KiB of counter; x 1024 / 2 s = 4 GiB/s
    assert row.nvlink_tx_bps == pytest.approx(4 * 1024**3)


def test_an_xid_shows_in_the_next_row_of_its_gpu_only(clock):
    machine, session = open_session("2xH100")
    machine.gpus[1].inject_xid(79)
    first, second = session.sample(clock.now_s)
    assert (first.xid, second.xid) == ([], [79])
    assert [row.xid for row in session.sample(clock.now_s + 1)] == [[], []]


# -- facts and peaks -------------------------------------------------------------------------------------------------


def test_each_gpu_gets_a_fact_with_its_dense_peak_and_its_source(clock):
    _, session = open_session("1xH100")
    (fact,) = session.facts()
    assert (fact.name, fact.provenance, fact.origin, fact.device) == (
        "gpu",
        "detected",
        "sampler:nvml",
        "node1/gpu0",
    )
    value = fact.value
    assert value["dense_bf16_flop_per_s"] == pytest.approx(989.4e12) and value["peak_absent"] is None
    assert value["fake"] is True and value["spec_id"] == "h100-sxm" and value["sm_count"] == 132
    # NVML gives a whole GPU's cores, not its SMs: 16,896 cores / 128 per Hopper SM (the spec's figure) = 132
    assert value["sm_count_source"] == "NVML: 16896 FP32 cores / 128 per hopper SM"
    assert value["dense_bf16_flop_per_clock_per_sm"] == 4096
    assert value["memory_bandwidth_bps"] == pytest.approx(3.35e12)
    assert value["peak_source"].startswith("https://")
    assert set(value) == {
        "index", "uuid", "name", "fake", "spec_id", "display_name", "dense_bf16_flop_per_s", "peak_absent",
        "tensor_clock_mhz", "memory_bandwidth_bps", "sm_count", "sm_count_source", "dense_bf16_flop_per_clock_per_sm",
        "peak_source",
    }  # fmt: skip


def test_an_unknown_gpu_has_no_peak_and_says_why(clock):
    _, session = open_session("1xGB10")  # no GB10 spec without the spark plugin
    value = session.facts()[0].value
    assert value["dense_bf16_flop_per_s"] is None and value["spec_id"] is None
    assert "no device spec matches 'NVIDIA GB10'" in value["peak_absent"]
    assert session.sample(clock.now_s)[0].adapter == "server"


def test_a_mig_device_gets_its_share_of_the_sms_peak(clock):
    machine = nvml.install(nvml.FakeMachine("1xH100"))
    machine.apply_script({"0": {"mig": [16, 32]}})
    mig_uuid = machine.gpus[0].mig_devices[0].uuid
    session = GpuSession.open({"TM_FAKE_GPUS": "1xH100", "CUDA_VISIBLE_DEVICES": mig_uuid}, host="node1")
    (fact,) = session.facts()
    # 989.4e12 FLOP/s x 16 / 132 SMs = 119.927e12 FLOP/s
    assert fact.value["dense_bf16_flop_per_s"] == pytest.approx(989.4e12 * 16 / 132)
    assert fact.value["sm_count"] == 16 and fact.value["memory_bandwidth_bps"] is None
    (row,) = session.sample(clock.now_s)
    assert row.uuid == mig_uuid and row.mig_parent_uuid == machine.gpus[0].uuid and row.sm_count == 16


# -- which GPUs ------------------------------------------------------------------------------------------------------


def test_gpus_flag_picks_by_index_or_uuid(clock):
    machine, session = open_session("4xH100", {"TM_GPUS": "2"})
    assert [row.index for row in session.sample(clock.now_s)] == [2]
    nvml.install(None)
    backend._opened.clear()
    machine, session = open_session("4xH100", {"TM_GPUS": machine.gpus[3].uuid[:12]})
    assert [row.index for row in session.sample(clock.now_s)] == [3]
    assert session.selection.for_run


def test_a_gpus_flag_naming_no_gpu_is_one_line_with_what_exists(clock):
    with pytest.raises(SelectionError, match=r"--gpus: no GPU 7 on this node \(NVML lists GPUs 0..1\)"):
        open_session("2xH100", {"TM_GPUS": "0,7"})


def test_cuda_visible_devices_by_index_warns_about_ordering_unless_pci_bus_id(clock):
    _, session = open_session("4xH100", {"CUDA_VISIBLE_DEVICES": "1,3"})
    assert [d.index for d in session.selection.devices] == [1, 3]
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in note for note in session.notes)
    nvml.install(None)
    backend._opened.clear()
    _, session = open_session("4xH100", {"CUDA_VISIBLE_DEVICES": "1,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert session.notes == []


def test_cuda_visible_devices_that_hides_every_gpu_gives_the_hardware_view_only(clock):
    _, session = open_session("2xH100", {"CUDA_VISIBLE_DEVICES": ""})
    assert not session.selection.for_run and len(session.selection.devices) == 2
    assert any("hardware view only" in note for note in session.notes)


def test_without_a_list_the_run_s_processes_choose_their_gpus(clock):
    machine, session = open_session("4xH100")
    machine.gpus[2].processes = [(4242, 1 << 30)]
    rows = session.sample(clock.now_s)
    assert session.selection.waiting and not session.selection.for_run and len(rows) == 4
    note = session.follow_processes(rows, run_pids={4242, 4243}, container=False)
    assert "gpu2" in note and session.selection.for_run
    assert [row.index for row in session.sample(clock.now_s + 1)] == [2]


def test_inside_a_container_host_pids_never_become_all_gpus_for_mfu(clock):
    machine, session = open_session("2xH100")
    machine.gpus[0].processes = [(987654, 1 << 30)]  # a host pid: our run is pid 12 in its namespace
    rows = session.sample(clock.now_s)
    note = session.follow_processes(rows, run_pids={12}, container=True)
    assert note == CONTAINER_HOST_PIDS and "pass --gpus" in note
    assert not session.selection.for_run and len(session.selection.devices) == 2


def test_narrowing_keeps_gpus_once_the_run_used_them():
    devices = [DeviceInfo(index=i, handle=object(), uuid=f"GPU-{i}", name="x") for i in range(3)]
    waiting = Selection("processes", devices, for_run=False, waiting=True, candidates=devices)
    first, note = narrow_to_processes(waiting, {"gpu0": [5]}, {5}, in_container=False)
    assert [d.index for d in first.devices] == [0] and note
    later, note = narrow_to_processes(first, {"gpu0": [], "gpu1": [6]}, {5, 6}, in_container=False)
    assert [d.index for d in later.devices] == [0, 1]


# -- profilers -------------------------------------------------------------------------------------------------------


def test_a_process_running_as_nsys_is_a_profiler():
    child = subprocess.Popen(["bash", "-c", "exec -a nsys sleep 30"])
    try:
        wait_for(lambda: find_profiler([child.pid], None) == "nsys", what="nsys seen by name")
        assert find_profiler([os.getpid()], None) is None
    finally:
        child.kill()
        child.wait()


def test_an_nsight_injection_in_the_environment_is_a_profiler():
    env = dict(
        os.environ, CUDA_INJECTION64_PATH="/opt/nvidia/nsight-compute/2024.1/target/libTreeLauncher.so"
    )
    child = subprocess.Popen(["sleep", "30"], env=env)
    try:
        # Until the child has exec'd, /proc shows the parent's environment (or none): poll, never race.
        wait_for(
            lambda: profiler_in_environment(read_environ(child.pid)) == "ncu", what="the child's environment"
        )
        assert find_profiler([], child.pid) == "ncu"
        assert profiler_in_environment(read_environ(os.getpid())) is None
    finally:
        child.kill()
        child.wait()


def test_a_bad_interval_keeps_the_default_and_says_which_variable():
    assert interval_from_env("TM_GPU_INTERVAL_S", 1.0, {"TM_GPU_INTERVAL_S": "0.25"}) == (0.25, None)
    value, note = interval_from_env("TM_GPU_INTERVAL_S", 1.0, {"TM_GPU_INTERVAL_S": "fast"})
    assert value == 1.0 and note.startswith("TM_GPU_INTERVAL_S='fast' is not a number of seconds")


# -- whole runs ------------------------------------------------------------------------------------------------------

# The child waits until the run log holds what the test needs, so a fast child never ends the run too early.
WAIT_FOR_LOG = textwrap.dedent(
    """
    import glob, json, os, sys, time
    want, kind = int(sys.argv[1]), sys.argv[2]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen = 0
        for path in glob.glob(os.path.join(os.environ["TM_RUN_DIR"], "events-*.jsonl")):
            with open(path) as f:
                seen += sum(1 for line in f if json.loads(line).get("kind") == kind)
        if seen >= want:
            break
        time.sleep(0.05)
    print("child done")
    """
)


@pytest.mark.xdist_group("heavy")
def test_without_nvml_a_run_gets_one_row_of_no_nvml_and_is_otherwise_unchanged(tm_env, tmp_path):
    script = tmp_path / "nvml.json"
    script.write_text(json.dumps({"machine": {"init_error": "library_not_found"}}))
    env = dict(tm_env, TM_FAKE_GPUS="1xH100", TM_FAKE_GPUS_SCRIPT=str(script), TM_HOST_INTERVAL_S="0.2")
    result = run_tm(["--no-agent", "--", sys.executable, "-c", WAIT_FOR_LOG, "3", "sample.host"], env)
    assert result.returncode == 0 and result.stdout == "child done\n", result.stderr
    records = log_records(only_run(tmp_path / "runs"))
    rows = [r for r in records if r["kind"] == "sample.gpu"]
    assert len(rows) == 1
    assert set(rows[0]["absent"].values()) == {"no NVML"} and "util_gpu" in rows[0]["absent"]
    assert not any(k in rows[0] for k in ("util_gpu", "power_w", "tensor_active"))
    assert len([r for r in records if r["kind"] == "sample.host"]) >= 3  # the rest of the run is as usual
    assert any(r["kind"] == "notice" and "no GPU data" in r["message"] for r in records)


@pytest.mark.xdist_group("heavy")
def test_a_run_on_fake_gpus_is_labelled_fake_and_sampled_in_its_own_process(tm_env, tmp_path):
    env = dict(tm_env, TM_FAKE_GPUS="2xH100", TM_GPU_INTERVAL_S="0.1")
    result = run_tm(["--no-agent", "--", sys.executable, "-c", WAIT_FOR_LOG, "6", "sample.gpu"], env)
    assert result.returncode == 0, result.stderr
    records = log_records(only_run(tmp_path / "runs"))
    facts = [r for r in records if r["kind"] == "fact" and r["name"] == "gpu"]
    assert sorted(f["value"]["index"] for f in facts) == [0, 1] and all(f["value"]["fake"] for f in facts)
    rows = [r for r in records if r["kind"] == "sample.gpu"]
    assert len(rows) >= 6 and all(r["fake"] for r in rows)
    started = [
        r for r in records if r["kind"] == "component" and r["name"] == "gpu" and r["event"] == "started"
    ]
    assert started and started[0]["process"] == "gpu"  # shared=False: a process of its own


class BrokenAdapter(PlatformAdapter):
    name = "server"

    def adapt(self, reading):
        raise RuntimeError("meminfo moved")


def test_an_adapter_that_raises_marks_its_fields_and_sampling_goes_on(clock):
    nvml.install(nvml.FakeMachine("1xGB10"))
    session = GpuSession.open({"TM_FAKE_GPUS": "1xGB10"}, adapters={"server": BrokenAdapter})
    for t in (clock.now_s, clock.now_s + 1):
        (row,) = session.sample(t)
        assert row.absent["mem_used_b"] == "platform adapter server failed: RuntimeError: meminfo moved"
        assert row.power_w == 4.0  # the GB10's idle power: everything NVML read still stands


class NoPcie(PlatformAdapter):
    name = "server"
    not_offered = {"pcie_tx_bps": "not on this device: no PCIe", "pcie_rx_bps": "not on this device: no PCIe"}


def test_a_field_the_adapter_does_not_offer_stays_absent_even_when_gpm_could_fill_it(clock):
    machine = nvml.install(nvml.FakeMachine("1xH100"))
    machine.gpus[0].set(pcie_tx_bps=1e9)
    session = GpuSession.open({"TM_FAKE_GPUS": "1xH100"}, adapters={"server": NoPcie})
    session.sample(clock.now_s)
    clock.now_s += 1
    (row,) = session.sample(clock.now_s)
    assert row.tensor_active == 0.0 and row.gpm_window_s == pytest.approx(1.0)  # GPM itself works
    assert row.pcie_tx_bps is None and row.absent["pcie_tx_bps"] == "not on this device: no PCIe"
