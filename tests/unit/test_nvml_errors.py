"""Every NVML return code the sampler's calls can return (the table in docs/nvml-errors.md) leaves the sampler running,
with exactly that call's fields absent and the reason, and the rest of the row intact."""

from __future__ import annotations

import re

import pytest
from tm_runs import REPO

from trainmeter_core.model.platform_adapters import GPM_BLOCKED, GPU_LOST, MEASURED_FIELDS, ServerAdapter
from trainmeter_sources.gpu import fake_pynvml as nvml
from trainmeter_sources.gpu.device_sampler import FIELDS_BY_CALL, DeviceSampler
from trainmeter_sources.gpu.fake_gpus import error_code
from trainmeter_sources.gpu.gpm import gpm_failure_reason
from trainmeter_sources.gpu.nvml import Nvml, list_devices, reason_for

ABBREVIATIONS = {
    "U": "uninitialized",
    "IA": "invalid_argument",
    "NS": "not_supported",
    "NP": "no_permission",
    "NF": "not_found",
    "IS": "insufficient_size",
    "IP": "insufficient_power",
    "DNL": "driver_not_loaded",
    "T": "timeout",
    "IRQ": "irq_issue",
    "LOST": "gpu_is_lost",
    "MEM": "memory",
}
# nvmlGpmSampleGet's documentation lists no codes ("nonzero NVML_ERROR_? on error"); these are what the doc page says
# the fake and real machines give (unsupported, blocked, held, lost) plus the catch-alls.
GPM_CODES = ["not_supported", "no_permission", "in_use", "gpu_is_lost", "uninitialized", "unknown"]


def documented_codes() -> dict[str, list[str]]:
    """pynvml call -> the error names docs/nvml-errors.md lists for it (plus UNKNOWN, which every call may return)."""
    table: dict[str, list[str]] = {}
    for line in (REPO / "docs" / "nvml-errors.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`nvml"):
            continue
        calls = re.findall(r"`(nvml\w+)`", cells[0])
        codes = [ABBREVIATIONS[c.strip()] for c in cells[1].split(",") if c.strip() in ABBREVIATIONS]
        for call in calls:
            table[call] = [*codes, "unknown"]
    return table


def cases():
    table = documented_codes()
    found = []
    for call in FIELDS_BY_CALL:
        codes = GPM_CODES if call == "nvmlGpmSampleGet" else table[call]
        found.extend((call, code) for code in codes)
    return found


@pytest.fixture
def fresh():
    yield
    nvml.install(None)
    from trainmeter_sources.gpu import nvml as backend

    backend._opened.clear()


def test_the_table_covers_every_call_the_sampler_makes():
    table = documented_codes()
    missing = [call for call in FIELDS_BY_CALL if call != "nvmlGpmSampleGet" and call not in table]
    assert missing == []
    assert len(table["nvmlDeviceGetPowerUsage"]) == 5  # U, IA, NS, LOST + UNKNOWN


@pytest.mark.parametrize("call, code", cases())
def test_a_failing_call_leaves_its_fields_absent_with_the_reason_and_the_rest_intact(fresh, call, code):
    # An A100 has no GPM, so PCIe and NVLink come from their own calls; GPM is tried on an H100.
    model = "H100" if call == "nvmlGpmSampleGet" else "A100"
    machine = nvml.install(nvml.FakeMachine(f"1x{model}"))
    machine.apply_script({"0": {"fail": {call: code}}})
    session = Nvml.open({"TM_FAKE_GPUS": f"1x{model}"})
    (device,), _ = list_devices(session)
    sampler = DeviceSampler(session, device, ServerAdapter(), {"index": 0, "uuid": device.uuid})
    rows = [sampler.sample(t) for t in (1.0, 2.0)]  # the second sample has a window for rates and GPM
    row = rows[-1]
    reason = reason_for(nvml.NVMLError(error_code(code, "test")))
    if code == "gpu_is_lost":
        assert set(row.absent) == set(MEASURED_FIELDS) and set(row.absent.values()) == {GPU_LOST}
        return
    if call == "nvmlGpmSampleGet":
        reason = gpm_failure_reason(reason, device.arch)
    for field in FIELDS_BY_CALL[call]:
        assert row.absent.get(field) == reason, (field, row.absent)
        assert getattr(row, field) in (None, [])
    # The call's failure touched nothing else: power is still read (or is the failing call).
    if "power_w" not in FIELDS_BY_CALL[call]:
        assert row.power_w == 60.0 if model == "A100" else row.power_w == 70.0


def test_gpm_blocked_by_the_provider_reads_as_such(fresh):
    machine = nvml.install(nvml.FakeMachine("1xH100"))
    machine.apply_script({"0": {"gpm": "blocked"}})
    session = Nvml.open({"TM_FAKE_GPUS": "1xH100"})
    (device,), _ = list_devices(session)
    sampler = DeviceSampler(session, device, ServerAdapter(), {"index": 0})
    row = [sampler.sample(t) for t in (1.0, 2.0)][-1]
    assert row.absent["tensor_active"] == GPM_BLOCKED and row.tensor_active is None
    assert row.util_gpu == 0.0 and "util_gpu" not in row.absent  # NVML's own counters still read


def test_a_lost_gpu_stays_lost_and_the_sampler_keeps_going(fresh):
    machine = nvml.install(nvml.FakeMachine("2xH100"))
    session = Nvml.open({"TM_FAKE_GPUS": "2xH100"})
    devices, _ = list_devices(session)
    samplers = [DeviceSampler(session, d, ServerAdapter(), {"index": d.index}) for d in devices]
    machine.gpus[1].lose()
    for t in (1.0, 2.0, 3.0):
        first, second = (s.sample(t) for s in samplers)
        assert first.power_w == 70.0
        assert set(second.absent.values()) == {GPU_LOST}
