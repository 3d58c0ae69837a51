"""The fake pynvml answers as nvidia-ml-py does: names, errors and their wording, return types, moving counters."""

import ctypes
import json

import pytest
from manual_clock import ManualClock

from trainmeter_sources.gpu import fake_gpus
from trainmeter_sources.gpu import fake_pynvml as nvml


@pytest.fixture
def clock(monkeypatch):
    manual = ManualClock()
    monkeypatch.setattr(fake_gpus, "clock", manual)
    # str() caches library wordings per code, as pynvml does; each test starts from pynvml's own table.
    monkeypatch.setattr(nvml.NVMLError, "_errcode_to_string", dict(nvml.NVMLError._errcode_to_string))
    nvml.NVMLError._errcode_to_string.pop(nvml.NVML_ERROR_IN_USE, None)
    yield manual
    nvml.install(None)


def start(spec: str):
    machine = nvml.install(nvml.FakeMachine(spec))
    nvml.nvmlInit()
    return machine


def metrics_between(handle, before, after, metric_ids):
    query = nvml.c_nvmlGpmMetricsGet_t()
    query.version = nvml.NVML_GPM_METRICS_GET_VERSION
    query.numMetrics = len(metric_ids)
    query.sample1, query.sample2 = before, after
    for index, metric_id in enumerate(metric_ids):
        query.metrics[index].metricId = metric_id
    nvml.nvmlGpmMetricsGet(query)
    return [(query.metrics[i].nvmlReturn, query.metrics[i].value) for i in range(len(metric_ids))]


def gpm_over(clock, handle, seconds: float):
    before, after = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(handle, before)
    clock.now_s += seconds
    nvml.nvmlGpmSampleGet(handle, after)
    return before, after


def test_the_module_says_it_is_fake():
    assert nvml.IS_FAKE is True


def test_error_classes_are_generated_per_code_with_pynvml_names():
    assert type(nvml.NVMLError(nvml.NVML_ERROR_GPU_IS_LOST)) is nvml.NVMLError_GpuIsLost
    assert nvml.nvmlExceptionClass(nvml.NVML_ERROR_NOT_SUPPORTED) is nvml.NVMLError_NotSupported
    assert nvml.NVMLError_LibRmVersionMismatch().value == 18
    assert isinstance(nvml.NVMLError_InUse(), nvml.NVMLError)
    assert nvml.NVMLError(nvml.NVML_ERROR_TIMEOUT) == nvml.NVMLError_Timeout()


@pytest.mark.parametrize(
    "code, wording",
    [
        (nvml.NVML_ERROR_UNINITIALIZED, "Uninitialized"),
        (nvml.NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"),
        (nvml.NVML_ERROR_NOT_SUPPORTED, "Not Supported"),
        (nvml.NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"),
        (nvml.NVML_ERROR_NOT_FOUND, "Not Found"),
        (nvml.NVML_ERROR_TIMEOUT, "Timeout"),
        (nvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
        (nvml.NVML_ERROR_GPU_IS_LOST, "GPU is lost"),
        (nvml.NVML_ERROR_UNKNOWN, "Unknown Error"),
    ],
)
def test_str_of_an_error_is_pynvmls_wording(clock, code, wording):
    assert str(nvml.NVMLError(code)) == wording


def test_in_use_is_worded_by_the_library_once_it_is_loaded(clock):
    nvml.install(nvml.FakeMachine("1xH100"))
    # pynvml asks nvmlErrorString for codes outside its table; with no library loaded yet that fails.
    assert str(nvml.NVMLError_InUse()) == "NVML Error with code 19"
    nvml.nvmlInit()
    assert str(nvml.NVMLError_InUse()) == "In use by another client"


def test_calls_before_init_raise_uninitialized(clock):
    machine = nvml.install(nvml.FakeMachine("1xH100"))
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetName(nvml.c_nvmlDevice_t(machine.gpus[0].handle_struct))
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlGpmSampleAlloc()


def test_calls_after_the_last_shutdown_raise_uninitialized(clock):
    start("1xH100")
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlShutdown()  # two inits, one shutdown: still initialised, as NVML counts them
    assert nvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
    nvml.nvmlShutdown()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetName(handle)
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlShutdown()


def test_init_raises_library_not_found_when_scripted(clock):
    machine = nvml.install(nvml.FakeMachine("1xH100"))
    machine.apply_script({"machine": {"init_error": "library_not_found"}})
    with pytest.raises(nvml.NVMLError_LibraryNotFound):
        nvml.nvmlInit()


def test_init_raises_library_not_found_without_tm_fake_gpus(clock, monkeypatch):
    monkeypatch.delenv("TM_FAKE_GPUS", raising=False)
    nvml.install(None)
    with pytest.raises(nvml.NVMLError_LibraryNotFound):
        nvml.nvmlInit()


def test_eight_h100s_have_distinct_uuids_and_the_real_nvml_name(clock):
    start("8xH100")
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    uuids = {nvml.nvmlDeviceGetUUID(h) for h in handles}
    assert len(handles) == 8 and len(uuids) == 8
    assert all(u.startswith("GPU-") and len(u) == 40 for u in uuids)  # GPU- plus 36 characters
    assert {nvml.nvmlDeviceGetName(h) for h in handles} == {"NVIDIA H100 80GB HBM3"}
    assert [nvml.nvmlDeviceGetIndex(h) for h in handles] == list(range(8))
    assert len({nvml.nvmlDeviceGetPciInfo(h).busId for h in handles}) == 8


def test_a_mixed_spec_gives_devices_in_order(clock):
    start("2xA100, 1xL4,GB10")
    names = [nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(4)]
    assert names == ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "NVIDIA L4", "NVIDIA GB10"]


def test_a_bad_spec_is_one_line_naming_the_input_and_the_models():
    with pytest.raises(ValueError) as caught:
        nvml.FakeMachine("8xV100")
    message = str(caught.value)
    assert "TM_FAKE_GPUS='8xV100'" in message and "H100" in message and "\n" not in message


def test_readings_come_back_in_nvml_units(clock):
    machine = start("1xH100")
    machine.gpus[0].set(gpu_busy=0.97, memory_busy=0.4, power_w=612.4, temperature_c=61, pcie_rx_bps=5e6)
    machine.gpus[0].processes = [(4242, 10 * nvml.MIB_B)]
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
    assert (utilization.gpu, utilization.memory) == (97, 40)
    assert nvml.nvmlDeviceGetPowerUsage(handle) == 612400  # 612.4 W in mW
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 700000  # 700 W in mW
    assert nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU) == 61
    assert nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM) == 1980
    assert nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES) == 5000  # 5e6 B/s in KB/s
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    assert (memory.used, memory.total - memory.free) == (10 * nvml.MIB_B, 10 * nvml.MIB_B)
    (process,) = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert (process.pid, process.usedGpuMemory) == (4242, 10 * nvml.MIB_B)


def test_gb10_has_no_memory_info_and_no_power_limit(clock):
    start("1xGB10")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMemoryInfo(handle)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetEnforcedPowerLimit(handle)


def test_energy_grows_with_power_times_time(clock):
    machine = start("1xH100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    machine.gpus[0].set(power_w=300)
    before_mj = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    clock.now_s += 2.0
    machine.gpus[0].set(power_w=500)
    clock.now_s += 1.0
    # 300 W * 2 s + 500 W * 1 s = 1100 J = 1_100_000 mJ
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(handle) - before_mj == 1_100_000


def test_the_fake_counter_is_millijoules_and_goes_back_when_the_driver_reloads(clock):
    machine = start("2xH100")
    machine.apply_script({"1": {"energy_reset_after_s": 5}})
    zero, one = (nvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    machine.gpus[0].set(power_w=300.0)
    clock.now_s += 4
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(zero) == 1_200_000  # 300 W × 4 s = 1200 J, in mJ
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(one) == 280_000  # 70 W idle × 4 s
    clock.now_s += 2
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(one) == 0  # the scripted reload at 5 s: it starts over
    machine.gpus[0].reset_energy()
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(zero) == 0
    clock.now_s += 1
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(zero) == 300_000


def test_the_fake_answers_not_supported_without_the_counter_and_on_a_mig_device(clock):
    machine = start("2xH100")
    machine.apply_script({"0": {"fail": {"nvmlDeviceGetTotalEnergyConsumption": "not_supported"}}})
    machine.gpus[1].enable_mig([66, 66])
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetTotalEnergyConsumption(nvml.nvmlDeviceGetHandleByIndex(0))
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(1), 0)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetTotalEnergyConsumption(mig)


def test_gpm_recovers_a_scripted_tensor_activity_as_percent(clock):
    machine = start("1xH100")
    machine.gpus[0].set(tensor_active=0.42, hmma_tensor_active=0.40, sm_active=0.9, dram_active=0.55)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    before, after = gpm_over(clock, handle, 1.0)
    ids = [nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, nvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL,
           nvml.NVML_GPM_METRIC_SM_UTIL, nvml.NVML_GPM_METRIC_DRAM_BW_UTIL]  # fmt: skip
    results = metrics_between(handle, before, after, ids)
    assert [code for code, _ in results] == [nvml.NVML_SUCCESS] * 4
    # 0.42 busy for 1.0 s of 1.0 s = 42 %; likewise 40 %, 90 %, 55 %
    assert [value for _, value in results] == pytest.approx([42.0, 40.0, 90.0, 55.0])


def test_gpm_averages_an_activity_that_changes_between_samples(clock):
    machine = start("1xH200")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    before = nvml.nvmlGpmSampleAlloc()
    machine.gpus[0].set(tensor_active=0.2, pcie_tx_bps=3 * nvml.MIB_B)
    nvml.nvmlGpmSampleGet(handle, before)
    clock.now_s += 1.5
    machine.gpus[0].set(tensor_active=0.6, pcie_tx_bps=0)
    clock.now_s += 0.5
    after = nvml.nvmlGpmSampleGet(handle, nvml.nvmlGpmSampleAlloc())
    results = metrics_between(handle, before, after, [nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
                                                      nvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC])  # fmt: skip
    # tensor: (0.2 * 1.5 s + 0.6 * 0.5 s) / 2.0 s = 0.3 -> 30 %; PCIe: 3 MiB/s * 1.5 s / 2.0 s = 2.25 MiB/s
    assert [value for _, value in results] == pytest.approx([30.0, 2.25])


def test_gpm_nvlink_is_not_supported_per_metric_on_a_gpu_without_nvlink(clock):
    start("1xGB10")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    before, after = gpm_over(clock, handle, 1.0)
    results = metrics_between(handle, before, after, [nvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
                                                      nvml.NVML_GPM_METRIC_SM_UTIL])  # fmt: skip
    assert [code for code, _ in results] == [nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_SUCCESS]


def test_gpm_metrics_need_two_filled_samples(clock):
    start("1xH100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    filled = nvml.nvmlGpmSampleGet(handle, nvml.nvmlGpmSampleAlloc())
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        metrics_between(handle, filled, nvml.nvmlGpmSampleAlloc(), [nvml.NVML_GPM_METRIC_SM_UTIL])


@pytest.mark.parametrize("spec", ["1xA100", "1xL4"])
def test_gpm_before_hopper_reports_unsupported(clock, spec):
    start(spec)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    support = nvml.nvmlGpmQueryDeviceSupport(handle)
    assert (support.version, support.isSupportedDevice) == (nvml.NVML_GPM_SUPPORT_VERSION, 0)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlGpmSampleGet(handle, nvml.nvmlGpmSampleAlloc())


@pytest.mark.parametrize("mode, error", [("blocked", "NVMLError_NoPermission"), ("held", "NVMLError_InUse")])
def test_blocked_or_held_gpm_reports_support_but_fails_to_sample(clock, mode, error):
    machine = start("1xH100")
    machine.apply_script({"0": {"gpm": mode}})
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 1
    with pytest.raises(getattr(nvml, error)):
        nvml.nvmlGpmSampleGet(handle, nvml.nvmlGpmSampleAlloc())


def test_a_failure_switch_raises_its_error_on_that_call_only(clock):
    machine = start("1xH100")
    machine.apply_script({"0": {"fail": {"nvmlDeviceGetPowerUsage": "not_supported",
                                         "nvmlDeviceGetComputeRunningProcesses": "no_permission"}}})  # fmt: skip
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerUsage(handle)
    with pytest.raises(nvml.NVMLError_NoPermission):
        nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)  # an alias shares its base function's switch
    assert nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU) == 35


def test_a_gpu_is_lost_on_every_call_after_its_scripted_time(clock):
    machine = start("2xH100")
    machine.apply_script({"1": {"lost_after_s": 5}})
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    clock.now_s += 4.9
    assert nvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
    clock.now_s += 0.1  # 5.0 s after the machine was built
    for call in (nvml.nvmlDeviceGetName, nvml.nvmlDeviceGetPowerUsage, nvml.nvmlDeviceGetMemoryInfo):
        with pytest.raises(nvml.NVMLError_GpuIsLost):
            call(handle)
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA H100 80GB HBM3"


def test_a_handle_that_is_not_one_is_an_invalid_argument(clock):
    start("1xH100")
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetName(nvml.c_nvmlDevice_t())  # NULL
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(1)


def test_throttles_switch_clock_event_reasons_on(clock):
    machine = start("1xH100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == nvml.nvmlClocksEventReasonNone
    machine.gpus[0].throttle("power_cap")
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == nvml.nvmlClocksEventReasonSwPowerCap
    assert nvml.nvmlDeviceGetPowerUsage(handle) == 700000  # sits at its 700 W limit
    machine.gpus[0].throttle("thermal")
    assert (
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
        == nvml.nvmlClocksThrottleReasonSwThermalSlowdown
    )


def test_an_injected_xid_arrives_through_the_event_set(clock):
    machine = start("2xH100")
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
    machine.gpus[1].inject_xid(79)
    event = nvml.nvmlEventSetWait(events, 0)
    assert (event.eventType, event.eventData) == (nvml.nvmlEventTypeXidCriticalError, 79)
    assert nvml.nvmlDeviceGetIndex(event.device) == 1
    with pytest.raises(nvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(events, 0)
    nvml.nvmlEventSetFree(events)


def test_a_scripted_xid_arrives_once_its_time_has_come(clock):
    machine = start("1xH100")
    machine.apply_script({"0": {"xids": [[3.0, 48]]}})
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(
        nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlEventTypeXidCriticalError, events
    )
    with pytest.raises(nvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(events, 0)
    clock.now_s += 3.0
    assert nvml.nvmlEventSetWait_v2(events, 0).eventData == 48


def test_waiting_on_events_of_a_lost_gpu_raises_gpu_is_lost(clock):
    machine = start("1xH100")
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(
        nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlEventTypeXidCriticalError, events
    )
    machine.gpus[0].lose()
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlEventSetWait(events, 0)


def test_ecc_counts_are_volatile_corrected_and_uncorrected(clock):
    machine = start("1xA100")
    machine.gpus[0].add_ecc_errors(corrected=3, uncorrected=1)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    corrected = nvml.nvmlDeviceGetTotalEccErrors(
        handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC
    )
    uncorrected = nvml.nvmlDeviceGetTotalEccErrors(
        handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
    )
    assert (corrected, uncorrected) == (3, 1)


def test_nvlink_throughput_fields_count_kib_per_link_and_in_total(clock):
    machine = start("1xH100,1xL4")
    machine.gpus[0].set(nvlink_tx_bps=18 * 1024 * 1024)
    clock.now_s += 2.0
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    total, link0 = nvml.nvmlDeviceGetFieldValues(
        handle,
        [
            (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF),
            nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        ],
    )
    # 18 MiB/s * 2 s = 36 MiB = 36864 KiB in all; over 18 links, 2048 KiB on link 0
    assert (total.nvmlReturn, total.value.ullVal, link0.value.ullVal) == (nvml.NVML_SUCCESS, 36864, 2048)
    (on_l4,) = nvml.nvmlDeviceGetFieldValues(nvml.nvmlDeviceGetHandleByIndex(1), [(139, 0xFFFFFFFF)])
    assert on_l4.nvmlReturn == nvml.NVML_ERROR_NOT_SUPPORTED


def test_mig_devices_have_handles_and_sm_counts(clock):
    machine = start("1xH100")
    machine.apply_script({"0": {"mig": [16, 32]}})
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(gpu) == [nvml.NVML_DEVICE_MIG_ENABLE, nvml.NVML_DEVICE_MIG_ENABLE]
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(gpu) == 7
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1)
    assert isinstance(nvml.nvmlDeviceIsMigDeviceHandle(mig), ctypes.c_uint)
    assert nvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert nvml.nvmlDeviceGetAttributes(mig).multiprocessorCount == 32
    assert nvml.nvmlDeviceGetUUID(mig).startswith("MIG-")
    parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert nvml.nvmlDeviceGetIndex(parent) == 0
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 2)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetUtilizationRates(gpu)  # nvml.h: not on MIG-enabled GPUs


def test_a_whole_gpu_tells_its_cores_but_not_its_sms_as_nvml_documents(clock):
    start("1xH100,1xL4,1xA100")
    h100, l4, a100 = (nvml.nvmlDeviceGetHandleByIndex(i) for i in range(3))
    # nvml.h: nvmlDeviceGetAttributes "currently only supports MIG device handles"
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetAttributes(h100)
    # FP32 cores: 132 × 128 = 16,896 (H100 SXM); 58 × 128 = 7,424 (L4, its datasheet); 108 × 64 = 6,912 (A100)
    assert [nvml.nvmlDeviceGetNumGpuCores(h) for h in (h100, l4, a100)] == [16896, 7424, 6912]


def test_a_mig_enabled_gpu_does_not_count_its_cores(clock):
    machine = start("1xH100")
    machine.apply_script({"0": {"mig": [16]}})
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNumGpuCores(gpu)  # nvml.h: "On MIG-enabled GPUs … not supported"


def test_a_gpu_without_mig_says_not_supported(clock):
    start("1xL4")
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(0))


def test_configure_from_env_reads_the_spec_and_the_script(clock, tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"0": {"gpm": "blocked"}, "1": {"lost_after_s": 5, "tensor_active": 0.42}}))
    machine = nvml.configure_from_env({"TM_FAKE_GPUS": "2xH100", "TM_FAKE_GPUS_SCRIPT": str(script)})
    assert len(machine.gpus) == 2
    assert (machine.gpus[0].gpm, machine.gpus[1].lost_after_s) == ("blocked", 5.0)
    assert machine.gpus[1].readings["tensor_active"] == 0.42
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 2


def test_configure_from_env_without_a_spec_installs_nothing(clock):
    assert nvml.configure_from_env({}) is None


def test_a_bad_script_key_is_one_line_naming_the_file_and_the_key(clock, tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"0": {"gpm": "sometimes"}}))
    with pytest.raises(ValueError) as caught:
        nvml.configure_from_env({"TM_FAKE_GPUS": "1xH100", "TM_FAKE_GPUS_SCRIPT": str(script)})
    message = str(caught.value)
    assert str(script) in message and "gpm='sometimes'" in message and "\n" not in message
