"""Platform adapters and the GPU row schema: the interface a plugin implements to turn what NVML offers on one kind of
machine into ``records.SampleGpu`` rows, and the helpers that keep every row complete.

Pure: no I/O and no clock here (an adapter that reads a file does so in its own module). A row never carries a zero
for something unknown: every measured field is either a value or named in ``absent`` with its reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from trainmeter_core.model.records import Record, SampleGpu

__all__ = [
    "FIRST_SAMPLE",
    "FRACTION_FIELDS",
    "GPM_BEFORE_HOPPER",
    "GPM_BLOCKED",
    "GPM_FIELDS",
    "GPU_LOST",
    "IDENTITY_FIELDS",
    "MEASURED_FIELDS",
    "NO_NVML",
    "NO_PERMISSION",
    "NOT_ON_THIS_DEVICE",
    "PROFILER_ATTACHED",
    "GpuReading",
    "PlatformAdapter",
    "ServerAdapter",
    "absent_row",
    "choose_adapter",
    "gpu_row",
]

# The reasons every source and adapter words the same way, so the dashboard can group them.
NOT_ON_THIS_DEVICE = "not on this device"
NO_PERMISSION = "no permission"
GPU_LOST = "GPU lost"
NO_NVML = "no NVML"
GPM_BEFORE_HOPPER = "GPM not supported before Hopper"
GPM_BLOCKED = "GPM blocked by the provider"
PROFILER_ATTACHED = "profiler attached"
FIRST_SAMPLE = "first sample: no window yet"

#: Fields that say which device a row is about; they are never "absent".
IDENTITY_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci_bus_id",
    "fake",
    "adapter",
    "spec_id",
    "mig_parent_uuid",
    "sm_count",
    "for_run",
)
_HEADER_FIELDS = frozenset(Record.__struct_fields__)
#: Every field a sampler measures: each one is in a row as a value or in ``absent`` with its reason.
MEASURED_FIELDS: tuple[str, ...] = tuple(
    f for f in SampleGpu.__struct_fields__ if f not in _HEADER_FIELDS and f not in IDENTITY_FIELDS
)
#: Fields that are fractions of time 0..1.
FRACTION_FIELDS = frozenset(
    (
        "util_gpu",
        "util_mem",
        "sm_active",
        "sm_occupancy",
        "tensor_active",
        "tensor_hmma_active",
        "dram_active",
    )
)
#: The fields that come from GPM (Hopper and newer).
GPM_FIELDS = (
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "tensor_hmma_active",
    "dram_active",
    "gpm_window_s",
    "gpm_window_start_t",
)
# NVML rounds and GPM divides two counters: a fraction a hair above 1 is rounding, far above it is a broken counter.
_FRACTION_SLACK = 0.05


class GpuReading:
    """What one sampling pass learned of one device: values by ``SampleGpu`` field, and the reasons for the rest."""

    __slots__ = ("absent", "values")

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.absent: dict[str, str] = {}

    def put(self, field: str, value: Any) -> None:
        if field not in _MEASURED_SET:
            raise KeyError(f"{field!r} is not a measured SampleGpu field")
        self.values[field] = value
        self.absent.pop(field, None)

    def miss(self, field: str, reason: str) -> None:
        if field not in _MEASURED_SET:
            raise KeyError(f"{field!r} is not a measured SampleGpu field")
        self.absent[field] = reason
        self.values.pop(field, None)

    def miss_all(self, fields: Iterable[str], reason: str) -> None:
        for field in fields:
            self.miss(field, reason)

    def has(self, field: str) -> bool:
        return field in self.values


_MEASURED_SET = frozenset(MEASURED_FIELDS)


class PlatformAdapter:
    """Turns what NVML offers on one kind of machine into the row schema.

    ``not_offered`` names the fields this kind of machine never has, with the reason: the sampler does not ask NVML
    for them and the row says why. ``adapt(reading)`` runs after the NVML reads of each sample and may fill or
    replace fields from elsewhere (the GB10's memory from ``/proc/meminfo``). An adapter must not raise: a field it
    cannot read is ``reading.miss(field, reason)``.
    """

    name: ClassVar[str] = ""
    not_offered: ClassVar[Mapping[str, str]] = {}

    def offers(self, field: str) -> bool:
        return field not in self.not_offered

    def adapt(self, reading: GpuReading) -> None:
        """Fill or correct fields after NVML was read; the default passes NVML through."""


class ServerAdapter(PlatformAdapter):
    """The built-in adapter: a discrete GPU whose NVML answers are the row as they are."""

    name = "server"


def choose_adapter(
    wanted: str | None, adapters: Mapping[str, type[PlatformAdapter]]
) -> tuple[PlatformAdapter, str | None]:
    """The adapter a device spec names (``server`` when there is no spec), and a warning when it is not installed.

    A missing adapter falls back to ``server``, which reads plain NVML: the row is still honest (fields the machine
    lacks come back "not on this device"), only the machine-specific readings are missing.
    """
    name = wanted or ServerAdapter.name
    cls = adapters.get(name)
    if cls is None and name == ServerAdapter.name:
        cls = ServerAdapter
    if cls is None:
        return (
            ServerAdapter(),
            f"the device spec needs the platform adapter {name!r}, which no installed plugin provides: "
            f"reading plain NVML instead (`tm plugins` lists what is installed)",
        )
    return cls(), None


def gpu_row(identity: Mapping[str, Any], reading: GpuReading, *, unread: str = "not read") -> SampleGpu:
    """One ``sample.gpu`` record from a device's identity and what was read of it.

    Every measured field ends up a value or absent: a field nobody read is absent with ``unread``; a fraction outside
    0..1 (beyond rounding) is absent as out of range rather than shown; decoded throttle reasons share the reason of
    the bitmask they come from.
    """
    values: dict[str, Any] = {}
    absent: dict[str, str] = {}
    for field in MEASURED_FIELDS:
        if field in reading.values:
            value = reading.values[field]
            if field in FRACTION_FIELDS and value is not None:
                if not 0.0 <= value <= 1.0 + _FRACTION_SLACK:
                    absent[field] = f"out of range: {value:g} is not a fraction 0..1"
                    continue
                value = min(float(value), 1.0)
            if value is None:
                absent[field] = reading.absent.get(field, unread)
                continue
            values[field] = value
        elif field in reading.absent:
            absent[field] = reading.absent[field]
        else:
            absent[field] = unread
    if "clock_event_reasons" in absent and "throttle" not in values:
        absent["throttle"] = absent["clock_event_reasons"]
    # An empty list (no Xid seen, no process) is a real answer; only a list nobody could read is absent.
    return SampleGpu(**dict(identity), **values, absent=absent)


def absent_row(identity: Mapping[str, Any], reason: str) -> SampleGpu:
    """A row for a device that could not be read at all: every measured field absent with the same reason."""
    return SampleGpu(**dict(identity), absent={field: reason for field in MEASURED_FIELDS})
