"""The NVML backend: which library it loads, one init per process, the reason each failure becomes, the devices and
MIG devices it lists, and the fake machine's split from the pynvml surface it drives."""

from __future__ import annotations

import importlib.util

import pytest

from trainmeter_core.model.platform_adapters import NO_NVML
from trainmeter_sources.gpu import fake_gpus
from trainmeter_sources.gpu import fake_pynvml as nvml
from trainmeter_sources.gpu import nvml as backend
from trainmeter_sources.gpu.nvml import Nvml, NvmlUnavailable, list_devices, load_library, reason_for


@pytest.fixture(autouse=True)
def fresh():
    nvml.install(None)
    backend._opened.clear()
    yield
    nvml.install(None)
    backend._opened.clear()


def test_tm_fake_gpus_swaps_in_the_fake_module():
    assert load_library({"TM_FAKE_GPUS": "2xH100"}) is nvml
    assert len(nvml.installed_machine().gpus) == 2


def test_without_nvidia_ml_py_the_reason_is_no_nvml_with_the_install_command():
    if importlib.util.find_spec("pynvml") is not None:
        assert load_library({}).__name__ == "pynvml"
        return
    with pytest.raises(NvmlUnavailable) as caught:
        load_library({})
    assert caught.value.reason == NO_NVML
    assert (
        caught.value.detail
        == "nvidia-ml-py is not installed: pip install nvidia-ml-py (or pip install 'trainmeter[gpu]')"
    )


def test_a_bad_fake_spec_is_one_line_naming_the_variable_and_the_models():
    with pytest.raises(NvmlUnavailable, match=r"TM_FAKE_GPUS='9xV100': expected COUNTxMODEL.*H100"):
        load_library({"TM_FAKE_GPUS": "9xV100"})


@pytest.mark.parametrize(
    "init_error, reason, detail",
    [
        ("library_not_found", NO_NVML, "libnvidia-ml.so.1 was not found"),
        ("driver_not_loaded", "NVIDIA driver not loaded", "kernel driver is not loaded"),
        ("no_permission", "no permission", "/dev/nvidia* permissions"),
    ],
)
def test_an_init_failure_gives_the_reason_and_what_fixes_it(init_error, reason, detail):
    machine = nvml.install(nvml.FakeMachine("1xH100"))
    machine.apply_script({"machine": {"init_error": init_error}})
    with pytest.raises(NvmlUnavailable) as caught:
        Nvml.open({"TM_FAKE_GPUS": "1xH100"})
    assert caught.value.reason == reason and detail in caught.value.detail
    assert caught.value.detail.startswith("fake NVML (TM_FAKE_GPUS): ")


def test_nvml_is_initialised_once_per_process():
    nvml.install(nvml.FakeMachine("1xH100"))
    first = Nvml.open({"TM_FAKE_GPUS": "1xH100"})
    assert Nvml.open({"TM_FAKE_GPUS": "1xH100"}) is first
    assert nvml._init_refcount == 1  # a second nvmlInit would have counted 2


def test_an_unknown_code_keeps_pynvmls_wording():
    nvml.install(nvml.FakeMachine("1xH100"))
    Nvml.open({"TM_FAKE_GPUS": "1xH100"})
    assert reason_for(nvml.NVMLError(nvml.NVML_ERROR_CORRUPTED_INFOROM)) == "GPU infoROM corrupted"
    assert reason_for(nvml.NVMLError(nvml.NVML_ERROR_UNKNOWN)) == "NVML error 999: Unknown Error"
    assert reason_for(nvml.NVMLError(nvml.NVML_ERROR_IN_USE)) == "in use by another client"


def test_devices_are_listed_with_their_mig_devices():
    machine = nvml.install(nvml.FakeMachine("1xA100,1xH100"))
    machine.apply_script({"1": {"mig": [16, 32]}})
    devices, reason = list_devices(Nvml.open({"TM_FAKE_GPUS": "1xA100,1xH100"}))
    assert reason is None and [d.label for d in devices] == ["gpu0", "gpu1"]
    assert devices[0].arch == nvml.NVML_DEVICE_ARCH_AMPERE and not devices[0].mig_enabled
    migs = devices[1].migs
    assert [m.label for m in migs] == ["gpu1/mig1", "gpu1/mig2"] and [m.mig_sm_count for m in migs] == [
        16,
        32,
    ]
    assert migs[0].mig_parent_uuid == devices[1].uuid and migs[0].name.startswith("NVIDIA H100 80GB HBM3 MIG")


def test_the_machine_and_the_library_agree_on_nvmls_numbers():
    assert (fake_gpus.ARCH_AMPERE, fake_gpus.ARCH_ADA, fake_gpus.ARCH_HOPPER, fake_gpus.ARCH_BLACKWELL) == (
        nvml.NVML_DEVICE_ARCH_AMPERE,
        nvml.NVML_DEVICE_ARCH_ADA,
        nvml.NVML_DEVICE_ARCH_HOPPER,
        nvml.NVML_DEVICE_ARCH_BLACKWELL,
    )
    assert set(nvml._GPM_FRACTIONS.values()) == set(fake_gpus.FRACTION_READINGS)
    assert set(nvml._GPM_RATES.values()) == set(fake_gpus.RATE_READINGS)
    assert all(isinstance(getattr(nvml, name), int) for name in fake_gpus.THROTTLE_REASONS.values())


def test_replacing_the_fake_machines_clock_moves_it(monkeypatch):
    now = [50.0]
    monkeypatch.setattr(fake_gpus, "clock", lambda: now[0])
    machine = nvml.install(nvml.FakeMachine("1xH100"))
    machine.apply_script({"0": {"lost_after_s": 5}})
    assert machine.start_s == 50.0 and not machine.gpus[0].is_lost()
    now[0] = 55.0
    assert machine.gpus[0].is_lost()
