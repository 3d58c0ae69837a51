"""The samplers' records: ``sample.gpu`` (one GPU), ``sample.host`` (the run's process tree) and ``sample.node``
(the machine), once per sampling interval each, with the parts they carry. Each kind is defined here once; the
package's face puts it in the union. Pure: no I/O, no clock.
"""

# Annotations are evaluated at import, as header.py says why.
from typing import Literal

import msgspec

from trainmeter_core.model.records.header import Record


class GpuProcess(msgspec.Struct, kw_only=True, omit_defaults=True):
    pid: int
    used_memory_b: int | None = None


class SampleGpu(Record, tag="sample.gpu", kw_only=True):
    """One GPU, once per sampling interval. Rates carry the window they cover; a missing field is in ``absent``."""

    index: int
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    fake: bool = False
    adapter: str = "server"
    spec_id: str | None = None
    mig_parent_uuid: str | None = None
    sm_count: int | None = None
    # NVML
    util_gpu: float | None = None  # 0..1, GPU-Util: share of time a kernel ran
    util_mem: float | None = None  # 0..1, memory-controller busy
    util_window_s: float | None = None
    mem_used_b: int | None = None
    mem_total_b: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None  # cumulative since driver load
    temp_c: float | None = None
    clock_sm_mhz: float | None = None
    clock_sm_max_mhz: float | None = None
    clock_mem_mhz: float | None = None
    clock_mem_max_mhz: float | None = None
    clock_event_reasons: int | None = None  # NVML bitmask
    throttle: list[str] = []  # decoded active reasons: "sw_power_cap", "hw_slowdown", "sw_thermal", ...
    pcie_tx_bps: float | None = None
    pcie_rx_bps: float | None = None
    nvlink_tx_bps: float | None = None
    nvlink_rx_bps: float | None = None
    ecc_corrected: int | None = None  # volatile counts
    ecc_uncorrected: int | None = None
    xid: list[int] = []  # Xid events seen since the previous sample
    processes: list[GpuProcess] = []
    # The pids of ``processes`` outside the run's process tree (the run's energy is absent on a GPU another process
    # uses); absent with the reason where tm cannot tell (inside a container NVML lists the host's pids).
    other_pids: list[int] = []
    for_run: bool = True  # False while the sampler watches every GPU for the hardware view only
    # GPM (Hopper and newer), each a 0..1 rate over the window [gpm_window_start_t, t]
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None  # any tensor pipe
    tensor_hmma_active: float | None = None
    dram_active: float | None = None
    gpm_window_s: float | None = None
    gpm_window_start_t: float | None = None


class ProcessStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    pid: int
    name: str
    cpu_cores: float | None = None
    rss_b: int | None = None


class SampleHost(Record, tag="sample.host", kw_only=True):
    """The run's process tree: CPU cores busy, resident memory, how many processes."""

    root_pid: int
    procs: int
    cpu_cores: float | None = None  # cores busy over the window
    rss_b: int | None = None
    threads: int | None = None
    io_read_bps: float | None = None
    io_write_bps: float | None = None
    window_s: float | None = None
    top: list[ProcessStat] = []


class DiskStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    device: str
    read_bps: float | None = None
    write_bps: float | None = None
    busy: float | None = None  # 0..1


class NetStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    interface: str
    rx_bps: float | None = None
    tx_bps: float | None = None


class FsStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: Literal["run", "checkpoints", "shm", "other"]
    path: str
    mount: str | None = None
    total_b: int | None = None
    avail_b: int | None = None


class SampleNode(Record, tag="sample.node", kw_only=True):
    """The node: CPU split, load, memory, cgroup limits, disks, network, the filesystems that matter to the run."""

    cpu_count: int | None = None
    cpu_user: float | None = None  # fractions 0..1 of all CPUs over the window
    cpu_system: float | None = None
    cpu_iowait: float | None = None
    cpu_steal: float | None = None
    cpu_idle: float | None = None
    load1: float | None = None
    load5: float | None = None
    load15: float | None = None
    mem_total_b: int | None = None
    mem_available_b: int | None = None
    swap_total_b: int | None = None
    swap_used_b: int | None = None
    cgroup_cpu_quota_cores: float | None = None
    cgroup_mem_limit_b: int | None = None
    cgroup_mem_used_b: int | None = None
    disks: list[DiskStat] = []
    net: list[NetStat] = []
    filesystems: list[FsStat] = []
    window_s: float | None = None
