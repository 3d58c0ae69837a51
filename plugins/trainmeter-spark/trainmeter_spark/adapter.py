"""The ``spark`` platform adapter: the DGX Spark's GB10 as the GPU row schema sees it.

The GB10 shares one LPDDR5x memory with its Grace CPU, so NVML reports no framebuffer ("Memory-Usage: Not
Supported"): the memory fields come from ``/proc/meminfo`` instead, and are the machine's. It has no separate memory
clock, no PCIe link to the GPU and no NVLink, so those fields are absent with that reason. It only reads a file.
"""

from __future__ import annotations

from trainmeter_core.api import NOT_ON_THIS_DEVICE, GpuReading, PlatformAdapter

MEMINFO = "/proc/meminfo"
# Why each field is missing on a GB10 (docs.nvidia.com/dgx/dgx-spark/known-issues.html: memory "Not Supported").
NOT_OFFERED = {
    "clock_mem_mhz": f"{NOT_ON_THIS_DEVICE}: unified LPDDR5x memory has no GPU memory clock",
    "clock_mem_max_mhz": f"{NOT_ON_THIS_DEVICE}: unified LPDDR5x memory has no GPU memory clock",
    "pcie_tx_bps": f"{NOT_ON_THIS_DEVICE}: the GPU reaches the CPU over NVLink-C2C, not PCIe",
    "pcie_rx_bps": f"{NOT_ON_THIS_DEVICE}: the GPU reaches the CPU over NVLink-C2C, not PCIe",
    "nvlink_tx_bps": f"{NOT_ON_THIS_DEVICE}: a single GB10 has no NVLink to other GPUs",
    "nvlink_rx_bps": f"{NOT_ON_THIS_DEVICE}: a single GB10 has no NVLink to other GPUs",
}


def unified_memory_b(path: str = MEMINFO) -> tuple[int, int] | None:
    """(total, used) bytes of the unified memory: MemTotal, and MemTotal - MemAvailable (the file's kB are KiB)."""
    values: dict[str, int] = {}
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if key in ("MemTotal", "MemAvailable") and parts and parts[0].isdigit():
                    values[key] = int(parts[0]) * 1024
    except OSError:
        return None
    if "MemTotal" not in values or "MemAvailable" not in values:
        return None
    return values["MemTotal"], values["MemTotal"] - values["MemAvailable"]


class SparkAdapter(PlatformAdapter):
    """The GB10 of a DGX Spark: memory from ``/proc/meminfo``, no memory clock, PCIe or NVLink."""

    name = "spark"
    not_offered = NOT_OFFERED
    meminfo_path = MEMINFO

    def adapt(self, reading: GpuReading) -> None:
        memory = unified_memory_b(self.meminfo_path)
        if memory is None:
            reason = f"unified memory: {self.meminfo_path} has no MemTotal and MemAvailable"
            reading.miss("mem_total_b", reason)
            reading.miss("mem_used_b", reason)
            return
        total_b, used_b = memory
        reading.put("mem_total_b", total_b)
        reading.put("mem_used_b", used_b)
