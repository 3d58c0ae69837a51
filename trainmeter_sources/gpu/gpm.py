"""GPM (GPU Performance Monitoring, Hopper and newer) for one device: SM active, SM occupancy, tensor-pipe active and
DRAM active as fractions 0..1 over the window between two samples, plus PCIe and NVLink rates when offered.

Two sample buffers are filled alternately and NVML computes the metrics between them (nvml.h documents the
utilisations as "Percentage ... 0.0 - 100.0" and the PCIe/NVLink rates as MiB/s). It never reports a window it did
not see: after a pause (a profiler attached, a failed read) the next sample starts a new window.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainmeter_core.model.platform_adapters import (
    FIRST_SAMPLE,
    GPM_BEFORE_HOPPER,
    GPM_BLOCKED,
    GPM_FIELDS,
    GPU_LOST,
    NO_PERMISSION,
    NOT_ON_THIS_DEVICE,
    GpuReading,
)
from trainmeter_sources.gpu.nvml import DeviceInfo, Nvml, reason_for

MIB_B = 1 << 20
HOPPER_ARCH = 9  # nvml.h NVML_DEVICE_ARCH_HOPPER: GPM is "for Hopper or newer fully supported devices"
GPM_UNSUPPORTED = "GPM not supported on this device"

# pynvml metric constant -> (row field, scale from NVML's unit to the row's: percent -> fraction, MiB/s -> bytes/s)
_METRICS = (
    ("NVML_GPM_METRIC_SM_UTIL", "sm_active", 0.01),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", "sm_occupancy", 0.01),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "tensor_active", 0.01),
    ("NVML_GPM_METRIC_HMMA_TENSOR_UTIL", "tensor_hmma_active", 0.01),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "dram_active", 0.01),
    ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", "pcie_tx_bps", MIB_B),
    ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", "pcie_rx_bps", MIB_B),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", "nvlink_tx_bps", MIB_B),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", "nvlink_rx_bps", MIB_B),
)
#: The fields GPM fills; the PCIe and NVLink ones only where it offers them (the sampler then skips slower calls).
RATE_FIELDS = ("pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps", "nvlink_rx_bps")


def _all(field: str) -> bool:
    return True


def gpm_failure_reason(code_reason: str, arch: int | None) -> str:
    """The reason a GPM call failed, in the words a person acts on."""
    if code_reason == NOT_ON_THIS_DEVICE:
        return GPM_BEFORE_HOPPER if arch is not None and arch < HOPPER_ARCH else GPM_UNSUPPORTED
    if code_reason == NO_PERMISSION:
        # Clouds that virtualise the GPU refuse GPM (docs/nvml-errors.md): that is the provider's setting.
        return GPM_BLOCKED
    if code_reason == GPU_LOST:
        return GPU_LOST
    return f"GPM read failed: {code_reason}"


class GpmReader:
    """GPM for one device (a whole GPU, or a MIG device through its parent)."""

    def __init__(self, nvml: Nvml, device: DeviceInfo) -> None:
        self.nvml = nvml
        self.device = device
        self.unsupported: str | None = None
        self.failure: str | None = None  # the last read's failure, kept for doctor
        self._buffers: list[Any] = []
        self._previous: tuple[Any, float] | None = None  # (filled buffer, monotonic time it was filled)
        self._offers: Callable[[str], bool] = _all
        self._check_support()

    def _check_support(self) -> None:
        device = self.device
        handle = device.mig_parent_handle if device.is_mig else device.handle
        support, reason = self.nvml.call("nvmlGpmQueryDeviceSupport", handle)
        if reason is not None:
            self.unsupported = gpm_failure_reason(reason, device.arch)
        elif not getattr(support, "isSupportedDevice", 0):
            self.unsupported = gpm_failure_reason(NOT_ON_THIS_DEVICE, device.arch)
        if self.unsupported is None:
            for _ in range(2):
                buffer, reason = self.nvml.call("nvmlGpmSampleAlloc")
                if reason is not None:
                    self.unsupported = f"GPM sample buffer: {reason}"
                    self._buffers = []
                    return
                self._buffers.append(buffer)

    def close(self) -> None:
        for buffer in self._buffers:
            self.nvml.call("nvmlGpmSampleFree", buffer)
        self._buffers = []

    def pause(self) -> None:
        """Forget the previous sample: the next window starts at the next read."""
        self._previous = None

    def read(
        self,
        reading: GpuReading,
        now_t: float,
        paused: str | None = None,
        offers: Callable[[str], bool] = _all,
    ) -> set[str]:
        """Take a sample, fill the GPM fields from the window since the previous one; return the fields it filled.

        ``offers`` is the platform adapter's say: a field it does not offer is neither filled nor given a reason here.
        """
        self._offers = offers
        if self.unsupported is not None:
            self._miss_all(reading, self.unsupported)
            return set()
        if paused is not None:
            self.pause()
            self._miss_all(reading, paused)
            return set()
        previous = self._previous
        buffer = self._buffers[0] if previous is None or previous[0] is self._buffers[1] else self._buffers[1]
        device = self.device
        if device.is_mig:
            _, reason = self.nvml.call(
                "nvmlGpmMigSampleGet", device.mig_parent_handle, device.mig_gpu_instance_id, buffer
            )
        else:
            _, reason = self.nvml.call("nvmlGpmSampleGet", device.handle, buffer)
        if reason is not None:
            self.failure = gpm_failure_reason(reason, device.arch)
            self.pause()
            self._miss_all(reading, self.failure)
            return set()
        self.failure = None
        self._previous = (buffer, now_t)
        if previous is None:
            self._miss_all(reading, FIRST_SAMPLE)
            return set()
        return self._metrics(reading, previous, buffer, now_t)

    def _metrics(
        self, reading: GpuReading, previous: tuple[Any, float], buffer: Any, now_t: float
    ) -> set[str]:
        lib = self.nvml.lib
        wanted = [(getattr(lib, constant, None), name, scale) for constant, name, scale in _METRICS]
        wanted = [(metric_id, name, scale) for metric_id, name, scale in wanted if metric_id is not None]
        query = lib.c_nvmlGpmMetricsGet_t()
        query.version = lib.NVML_GPM_METRICS_GET_VERSION
        query.numMetrics = len(wanted)
        query.sample1, query.sample2 = previous[0], buffer
        for slot, (metric_id, _, _) in enumerate(wanted):
            query.metrics[slot].metricId = metric_id
        _, reason = self.nvml.call("nvmlGpmMetricsGet", query)
        if reason is not None:
            self._miss_all(reading, gpm_failure_reason(reason, self.device.arch))
            return set()
        filled: set[str] = set()
        for slot, (_, name, scale) in enumerate(wanted):
            metric = query.metrics[slot]
            if not self._offers(name):
                continue
            if metric.nvmlReturn != 0:
                if name not in RATE_FIELDS:
                    reading.miss(name, _metric_reason(self.nvml, metric.nvmlReturn))
                continue
            reading.put(name, metric.value * scale)
            filled.add(name)
        if self._offers("gpm_window_s"):
            reading.put("gpm_window_s", now_t - previous[1])
            reading.put("gpm_window_start_t", previous[1])
        return filled

    def _miss_all(self, reading: GpuReading, reason: str) -> None:
        reading.miss_all([f for f in GPM_FIELDS if self._offers(f)], reason)


def _metric_reason(nvml: Nvml, code: int) -> str:
    try:
        error = nvml.lib.NVMLError(code)
    except Exception:
        return f"NVML error {code}"
    return reason_for(error)
