"""One device's row, once per interval: every NVML field the sampler reads, GPM, and the platform adapter's say.

Each NVML call feeds named fields (``FIELDS_BY_CALL``); a call that fails leaves exactly those fields absent with its
reason and the rest of the row intact. A GPU that is lost stays a row of "GPU lost" until NVML answers for it again.
"""

from __future__ import annotations

from typing import Any

from trainmeter_core.model import records
from trainmeter_core.model.platform_adapters import (
    FIRST_SAMPLE,
    GPU_LOST,
    NOT_ON_THIS_DEVICE,
    GpuReading,
    PlatformAdapter,
    absent_row,
    gpu_row,
)
from trainmeter_sources.gpu.gpm import GpmReader
from trainmeter_sources.gpu.nvml import DeviceInfo, Nvml, reason_for

#: Every pynvml call a sample makes and the row fields it fills (tests walk this table with every error code).
FIELDS_BY_CALL: dict[str, tuple[str, ...]] = {
    "nvmlDeviceGetUtilizationRates": ("util_gpu", "util_mem"),
    "nvmlDeviceGetMemoryInfo": ("mem_used_b", "mem_total_b"),
    "nvmlDeviceGetPowerUsage": ("power_w",),
    "nvmlDeviceGetEnforcedPowerLimit": ("power_limit_w",),
    "nvmlDeviceGetTotalEnergyConsumption": ("energy_j",),
    "nvmlDeviceGetTemperatureV": ("temp_c",),
    "nvmlDeviceGetClockInfo": ("clock_sm_mhz", "clock_mem_mhz"),
    "nvmlDeviceGetMaxClockInfo": ("clock_sm_max_mhz", "clock_mem_max_mhz"),
    "nvmlDeviceGetCurrentClocksEventReasons": ("clock_event_reasons", "throttle"),
    "nvmlDeviceGetPcieThroughput": ("pcie_tx_bps", "pcie_rx_bps"),
    "nvmlDeviceGetFieldValues": ("nvlink_tx_bps", "nvlink_rx_bps"),
    "nvmlDeviceGetTotalEccErrors": ("ecc_corrected", "ecc_uncorrected"),
    "nvmlDeviceGetComputeRunningProcesses": ("processes",),
    "nvmlGpmSampleGet": ("sm_active", "sm_occupancy", "tensor_active", "tensor_hmma_active", "dram_active"),
}
# nvml.h, nvmlDeviceGetUtilizationRates: "The sample period may be between 1 second and 1/6 second depending on the
# product being queried" -- NVML does not say which, so the window stays unknown.
UTIL_WINDOW_UNKNOWN = (
    "NVML samples GPU-Util over 1/6 s to 1 s depending on the product, and does not say which"
)
# Bits of nvmlClocksEventReasons (nvml.h), in the names the row uses.
THROTTLE_BITS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clock"),
)
_NOT_IN_DRIVER = "not in this driver's NVML"  # nvml.py's reason for NVML_ERROR_FUNCTION_NOT_FOUND
_ALL_LINKS = 0xFFFFFFFF  # a field value's scopeId for "every NVLink of the GPU"


def decode_throttle(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS if mask & bit]


class DeviceSampler:
    """Reads one device each interval and builds its ``sample.gpu`` row through its platform adapter."""

    def __init__(self, nvml: Nvml, device: DeviceInfo, adapter: PlatformAdapter, identity: dict[str, Any]):
        self.nvml = nvml
        self.device = device
        self.adapter = adapter
        self.identity = identity
        self.lost = device.error == GPU_LOST or device.handle is None
        self.unreadable = device.error if device.handle is None else None
        self.gpm = GpmReader(nvml, device) if not self.lost else None
        self._max_clocks: dict[str, float] = {}
        self._old_temperature = False
        self._nvlink: tuple[float, int, int] | None = None  # (time, tx KiB, rx KiB) of the previous sample

    def close(self) -> None:
        if self.gpm is not None:
            self.gpm.close()

    def sample(self, now_t: float, paused: str | None = None, xid: tuple[list[int], str | None] = ([], None)):
        """The row for this interval; ``paused`` is the reason GPM is paused (a profiler), ``xid`` the Xid events
        seen since the last sample or the reason they cannot be seen."""
        if self.unreadable is not None:
            return absent_row(self.identity, self.unreadable)
        if self.lost:
            _, reason = self.nvml.call("nvmlDeviceGetUUID", self.device.handle)
            if reason is not None:
                return absent_row(self.identity, GPU_LOST if reason == GPU_LOST else reason)
            self.lost = False  # NVML answers again (the GPU was reset): start over
            self._nvlink = None
            if self.gpm is None:
                self.gpm = GpmReader(self.nvml, self.device)
            else:
                self.gpm.pause()
        reading = GpuReading()
        for field, reason in self.adapter.not_offered.items():
            reading.miss(field, reason)
        lost = self._read(reading, now_t, paused)
        if lost:
            self.lost = True
            if self.gpm is not None:
                self.gpm.pause()
            return absent_row(self.identity, GPU_LOST)
        xids, xid_reason = xid
        if xid_reason is not None:
            reading.miss("xid", xid_reason)
        elif self.adapter.offers("xid"):
            reading.put("xid", list(xids))
        try:
            self.adapter.adapt(reading)
        except Exception as exc:
            # An adapter must not raise; if one does, the fields it exists to supply (those NVML does not offer)
            # say so, and the process keeps sampling.
            failure = f"platform adapter {self.adapter.name} failed: {type(exc).__name__}: {exc}"
            for field, reason in list(reading.absent.items()):
                if reason.startswith(NOT_ON_THIS_DEVICE):
                    reading.miss(field, failure)
        return gpu_row(self.identity, reading)

    # -- the reads -------------------------------------------------------------------------------------------------

    def _wants(self, reading: GpuReading, *fields: str) -> bool:
        return any(self.adapter.offers(f) for f in fields)

    def _call(self, reading: GpuReading, fields: tuple[str, ...], name: str, *args: Any) -> Any:
        """One NVML call; on failure its fields (those the adapter offers) are absent with the reason."""
        value, reason = self.nvml.call(name, self.device.handle, *args)
        if reason is not None:
            for field in fields:
                if self.adapter.offers(field):
                    reading.miss(field, reason)
            if reason == GPU_LOST:
                raise _Lost
            return None
        return value

    def _read(self, reading: GpuReading, now_t: float, paused: str | None) -> bool:
        try:
            self._read_nvml(reading, now_t)
            filled = (
                self.gpm.read(reading, now_t, paused, self.adapter.offers) if self.gpm is not None else set()
            )
            if self.gpm is not None and self.gpm.failure == GPU_LOST:
                raise _Lost
            self._read_rates(reading, now_t, filled)
        except _Lost:
            return True
        return False

    def _read_nvml(self, reading: GpuReading, now_t: float) -> None:
        lib = self.nvml.lib
        put = reading.put
        fields = FIELDS_BY_CALL
        if self._wants(reading, "util_gpu", "util_mem"):
            util = self._call(
                reading, fields["nvmlDeviceGetUtilizationRates"], "nvmlDeviceGetUtilizationRates"
            )
            if util is not None:
                put("util_gpu", util.gpu / 100)
                put("util_mem", util.memory / 100)
            reading.miss("util_window_s", UTIL_WINDOW_UNKNOWN)
        if self._wants(reading, "mem_used_b", "mem_total_b"):
            memory = self._call(reading, fields["nvmlDeviceGetMemoryInfo"], "nvmlDeviceGetMemoryInfo")
            if memory is not None:
                put("mem_used_b", int(memory.used))
                put("mem_total_b", int(memory.total))
        for call, field, scale, args in (
            ("nvmlDeviceGetPowerUsage", "power_w", 1e-3, ()),  # milliwatts
            ("nvmlDeviceGetEnforcedPowerLimit", "power_limit_w", 1e-3, ()),
            ("nvmlDeviceGetTotalEnergyConsumption", "energy_j", 1e-3, ()),  # millijoules
            (self._temperature_call, "temp_c", 1.0, (lib.NVML_TEMPERATURE_GPU,)),
        ):
            if self._wants(reading, field):
                value = self._call(reading, (field,), call, *args)
                if call == "nvmlDeviceGetTemperatureV" and reading.absent.get(field) == _NOT_IN_DRIVER:
                    self._old_temperature = True
                    value = self._call(reading, (field,), "nvmlDeviceGetTemperature", *args)
                if value is not None:
                    put(field, float(value) * scale)
        for field, clock_type in (("clock_sm_mhz", lib.NVML_CLOCK_SM), ("clock_mem_mhz", lib.NVML_CLOCK_MEM)):
            if self._wants(reading, field):
                value = self._call(reading, (field,), "nvmlDeviceGetClockInfo", clock_type)
                if value is not None:
                    put(field, float(value))
        self._read_max_clocks(reading)
        if self._wants(reading, "clock_event_reasons", "throttle"):
            name = "nvmlDeviceGetCurrentClocksEventReasons"
            if not hasattr(lib, name):  # nvidia-ml-py before 12.535 names it for throttling
                name = "nvmlDeviceGetCurrentClocksThrottleReasons"
            mask = self._call(reading, fields["nvmlDeviceGetCurrentClocksEventReasons"], name)
            if mask is not None:
                put("clock_event_reasons", int(mask))
                put("throttle", decode_throttle(int(mask)))
        for field, error_type in (
            ("ecc_corrected", lib.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("ecc_uncorrected", lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            if self._wants(reading, field):
                value = self._call(
                    reading, (field,), "nvmlDeviceGetTotalEccErrors", error_type, lib.NVML_VOLATILE_ECC
                )
                if value is not None:
                    put(field, int(value))
        if self._wants(reading, "processes"):
            processes = self._call(reading, ("processes",), "nvmlDeviceGetComputeRunningProcesses")
            if processes is not None:
                put("processes", [_process(p) for p in processes])

    @property
    def _temperature_call(self) -> str:
        # nvml.h deprecates nvmlDeviceGetTemperature for nvmlDeviceGetTemperatureV, which older drivers and
        # nvidia-ml-py lack: use the new one where it answers.
        if self._old_temperature or not hasattr(self.nvml.lib, "nvmlDeviceGetTemperatureV"):
            return "nvmlDeviceGetTemperature"
        return "nvmlDeviceGetTemperatureV"

    def _read_max_clocks(self, reading: GpuReading) -> None:
        lib = self.nvml.lib
        for field, clock_type in (
            ("clock_sm_max_mhz", lib.NVML_CLOCK_SM),
            ("clock_mem_max_mhz", lib.NVML_CLOCK_MEM),
        ):
            if not self._wants(reading, field):
                continue
            if field not in self._max_clocks:  # a maximum does not change: ask NVML until it answers once
                value = self._call(reading, (field,), "nvmlDeviceGetMaxClockInfo", clock_type)
                if value is None:
                    continue
                self._max_clocks[field] = float(value)
            reading.put(field, self._max_clocks[field])

    def _read_rates(self, reading: GpuReading, now_t: float, from_gpm: set[str]) -> None:
        """PCIe and NVLink from NVML's older calls where GPM did not give them."""
        lib = self.nvml.lib
        pcie = [f for f in ("pcie_tx_bps", "pcie_rx_bps") if f not in from_gpm and self.adapter.offers(f)]
        for field in pcie:
            counter = lib.NVML_PCIE_UTIL_TX_BYTES if field == "pcie_tx_bps" else lib.NVML_PCIE_UTIL_RX_BYTES
            value = self._call(reading, (field,), "nvmlDeviceGetPcieThroughput", counter)
            if value is not None:
                reading.put(field, float(value) * 1000)  # nvml.h: "in KB/s"
        nvlink = [
            f for f in ("nvlink_tx_bps", "nvlink_rx_bps") if f not in from_gpm and self.adapter.offers(f)
        ]
        if nvlink:
            self._read_nvlink(reading, now_t, tuple(nvlink))

    def _read_nvlink(self, reading: GpuReading, now_t: float, fields: tuple[str, ...]) -> None:
        lib = self.nvml.lib
        ids = [
            (lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
            (lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
        ]
        values = self._call(reading, fields, "nvmlDeviceGetFieldValues", ids)
        if values is None:
            self._nvlink = None
            return
        kib = []
        for value in values:
            if value.nvmlReturn != 0:
                reason = _field_reason(self.nvml, value.nvmlReturn)
                reading.miss_all(fields, reason)
                self._nvlink = None
                return
            kib.append(int(value.value.ullVal))
        previous, self._nvlink = self._nvlink, (now_t, kib[0], kib[1])
        if previous is None or now_t <= previous[0]:
            reading.miss_all(fields, FIRST_SAMPLE)
            return
        window_s = now_t - previous[0]
        # Cumulative KiB counters (nvml.h: "NVLink TX Data throughput in KiB"): the rate is their change.
        rates = {"nvlink_tx_bps": (kib[0] - previous[1]) * 1024 / window_s}
        rates["nvlink_rx_bps"] = (kib[1] - previous[2]) * 1024 / window_s
        for field in fields:
            if rates[field] < 0:  # the counter was reset (driver reload): no rate for this window
                reading.miss(field, "NVLink counter reset")
            else:
                reading.put(field, rates[field])


class _Lost(Exception):
    """NVML said the GPU is lost: the whole row becomes "GPU lost"."""


def _process(process: Any) -> records.GpuProcess:
    used = getattr(process, "usedGpuMemory", None)
    return records.GpuProcess(pid=int(process.pid), used_memory_b=int(used) if used is not None else None)


def _field_reason(nvml: Nvml, code: int) -> str:
    try:
        return reason_for(nvml.lib.NVMLError(code))
    except Exception:
        return f"NVML error {code}"
