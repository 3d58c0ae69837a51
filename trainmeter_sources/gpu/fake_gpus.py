"""The scriptable machine behind the fake `pynvml`: GPU models, readings a test sets, counters that move with time,
failure switches. It must never be mistaken for hardware: only `fake_pynvml` drives it, and that module says it is fake.

The machine's clock and handles live here, NVML's numbers (return codes, event bits) in `nvml_codes`; this module
never imports `fake_pynvml`, which fills `SCRIPTABLE_CALLS` with the calls a script may fail. A test that replaces
`fake_gpus.clock` moves the whole machine's time.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
import uuid
from ctypes import Structure, c_ulonglong
from dataclasses import dataclass

from trainmeter_sources.gpu import nvml_codes

# nvml.h's nvmlDeviceArchitecture_t values (the same as fake_pynvml's NVML_DEVICE_ARCH_* constants).
ARCH_AMPERE, ARCH_ADA, ARCH_HOPPER, ARCH_BLACKWELL = 7, 8, 9, 10


# Tests replace this to move time by hand; every counter and timestamp reads it at call time.
clock = time.monotonic

#: Every name of a pynvml call a script's "fail" may name -> the call's own name (an alias such as
#: nvmlDeviceGetCurrentClocksThrottleReasons fails its call). fake_pynvml fills it once its functions exist.
SCRIPTABLE_CALLS: dict[str, str] = {}


def now_s() -> float:
    """The fake machine's time: `clock`, which tests replace to move time by hand."""
    return clock()


class _FakeHandleStruct(Structure):
    # The real structs are opaque; the fake one carries the key that finds the fake object behind a handle.
    _fields_ = [("fake_key", c_ulonglong)]


class struct_c_nvmlDevice_t(_FakeHandleStruct):
    pass


class struct_c_nvmlEventSet_t(_FakeHandleStruct):
    pass


class struct_c_nvmlGpmSample_t(_FakeHandleStruct):
    pass


MIB_B = 1 << 20


@dataclass(frozen=True)
class GpuModel:
    """One kind of GPU as NVML shows it; a None reading is one NVML answers with Not Supported."""

    key: str
    name: str
    arch: int
    cuda_capability: tuple[int, int]
    sm_count: int
    memory_total_b: int | None
    power_limit_w: float | None
    idle_power_w: float
    sm_max_mhz: int
    memory_max_mhz: int
    pci_device_id: int
    mig_capable: bool
    nvlink_links: int
    ecc: bool


# Names are the strings nvmlDeviceGetName returns. SM counts and power limits are datasheet figures: H100 SXM
# 132 SMs / 700 W and H200 700 W (NVIDIA H100/H200 datasheets, "Hopper Architecture In-Depth"), A100 SXM4 108 SMs
# / 400 W (A100 whitepaper), L4 72 W and 7,424 CUDA cores = 58 SMs (L4 datasheet), GB10 6,144 CUDA cores = 48
# SMs (DGX Spark). GB10 memory and power limit are Not Supported, as NVIDIA's DGX Spark known-issues page and
# nvidia-smi on it show. B200: no NVIDIA datasheet states its SM count, so its 148 SMs (and its 1000 W, 1965 MHz)
# are illustrative, like the memory totals as nvidia-smi prints them, clocks, PCI ids and idle powers of all models.
GPU_MODELS = {
    model.key: model
    for model in (
        GpuModel("H100", "NVIDIA H100 80GB HBM3", ARCH_HOPPER, (9, 0), 132, 81559 * MIB_B, 700.0,
                 70.0, 1980, 2619, 0x233010DE, True, 18, True),
        GpuModel("H200", "NVIDIA H200", ARCH_HOPPER, (9, 0), 132, 143771 * MIB_B, 700.0,
                 75.0, 1980, 3201, 0x233510DE, True, 18, True),
        GpuModel("A100", "NVIDIA A100-SXM4-80GB", ARCH_AMPERE, (8, 0), 108, 81920 * MIB_B, 400.0,
                 60.0, 1410, 1593, 0x20B210DE, True, 12, True),
        GpuModel("L4", "NVIDIA L4", ARCH_ADA, (8, 9), 58, 23034 * MIB_B, 72.0,
                 16.0, 2040, 6251, 0x27B810DE, False, 0, True),
        GpuModel("GB10", "NVIDIA GB10", ARCH_BLACKWELL, (12, 1), 48, None, None,
                 4.0, 2418, 4266, 0x2E1210DE, False, 0, False),
        GpuModel("B200", "NVIDIA B200", ARCH_BLACKWELL, (10, 0), 148, 183359 * MIB_B, 1000.0,
                 140.0, 1965, 3996, 0x290110DE, True, 18, True),
    )
}  # fmt: skip
# FP32 CUDA cores per SM, which is how NVML's nvmlDeviceGetNumGpuCores counts a GPU: GA100 64 (A100 whitepaper: 108
# SMs, 6,912 cores), Ada 128 (L4: 7,424 cores = 58 SMs), Hopper 128 (Hopper whitepaper, "128 FP32 CUDA Cores per
# SM"), Blackwell 128 (GB10: 6,144 cores = 48 SMs).
CORES_PER_SM = {ARCH_AMPERE: 64, ARCH_ADA: 128, ARCH_HOPPER: 128, ARCH_BLACKWELL: 128}

GPM_MODES = ("supported", "unsupported", "blocked", "held")
# Readings integrated over time: busy-seconds for fractions, bytes for rates, joules for power. GPM reports the
# fractions as percent 0..100 and the rates as MiB/s over the interval between two samples.
FRACTION_READINGS = (
    "graphics_active", "sm_active", "sm_occupancy", "integer_active", "tensor_active", "dfma_tensor_active",
    "hmma_tensor_active", "dmma_tensor_active", "imma_tensor_active", "dram_active", "fp64_active", "fp32_active",
    "fp16_active",
)  # fmt: skip
RATE_READINGS = ("pcie_tx_bps", "pcie_rx_bps", "nvlink_rx_bps", "nvlink_tx_bps")
INTEGRATED = (*FRACTION_READINGS, *RATE_READINGS, "power_w")
# Script names of clock event reasons -> the pynvml constant each switches on.
THROTTLE_REASONS = {
    "none": "nvmlClocksEventReasonNone",
    "idle": "nvmlClocksEventReasonGpuIdle",
    "power_cap": "nvmlClocksEventReasonSwPowerCap",
    "thermal": "nvmlClocksEventReasonSwThermalSlowdown",
    "hw_slowdown": "nvmlClocksEventReasonHwSlowdown",
}
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "trainmeter/fake-gpu")
_SPEC_ITEM = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?([A-Za-z0-9]+)\s*$")
_SPEC_HELP = f"expected COUNTxMODEL[,COUNTxMODEL...] with MODEL one of {', '.join(GPU_MODELS)}, e.g. 8xH100"

lock = threading.RLock()
events_changed = threading.Condition(lock)


def parse_spec(spec: str) -> list[GpuModel]:
    """'2xA100,1xL4' -> [A100, A100, L4]; a bare model name means one of it."""
    models: list[GpuModel] = []
    for item in spec.split(","):
        match = _SPEC_ITEM.match(item)
        model = GPU_MODELS.get(match.group(2).upper()) if match else None
        count = int(match.group(1) or 1) if match else 0
        if model is None or count < 1:
            raise ValueError(f"TM_FAKE_GPUS={spec!r}: {_SPEC_HELP}")
        models.extend([model] * count)
    return models


def error_code(name, where: str) -> int:
    """The NVML return code a script names ('not_supported', 'gpu_is_lost', 'success')."""
    nvml = nvml_codes
    code = (
        nvml.NVML_SUCCESS
        if str(name).lower() == "success"
        else getattr(nvml, f"NVML_ERROR_{str(name).upper()}", None)
    )
    if not isinstance(code, int):
        raise ValueError(
            f"{where}: unknown NVML error {name!r}; use a name like 'not_supported' or 'no_permission'"
        )
    return code


class FakeGpu:
    """One fake GPU: readings a script sets, counters that integrate them over `clock`, and failure switches."""

    def __init__(self, machine: FakeMachine, model: GpuModel, index: int):
        self.machine, self.model, self.index = machine, model, index
        self.uuid = f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{machine.spec}/{index}')}"
        bus_slot = 0x18 + 0x10 * index  # an HGX-like layout; numbers only need to be distinct and well formed
        self.pci_domain, self.pci_bus = (
            (0xF, 0x01 + index) if model.key == "GB10" else (bus_slot >> 8, bus_slot & 0xFF)
        )
        self.gpm = "supported" if model.arch >= ARCH_HOPPER else "unsupported"
        self.failures: dict[str, int] = {}
        self.lost, self.lost_after_s = False, None
        self.clocks_event_reasons = 0  # nvmlClocksEventReasonNone
        self.throttle_until_s: float | None = (
            None  # a scripted throttle ends this long after the machine was built
        )
        self.processes: list[tuple[int, int]] = []
        self.base_memory_used_b = 0
        self.ecc_corrected = self.ecc_uncorrected = 0
        self.mig_devices: list[FakeMigDevice] = []
        self.mig_enabled = False
        self.pending_xids: list[tuple[float, int]] = []
        self.readings = {name: 0.0 for name in INTEGRATED}
        self.readings.update(
            gpu_busy=0.0,
            memory_busy=0.0,
            power_w=model.idle_power_w,
            temperature_c=35.0,
            sm_clock_mhz=float(model.sm_max_mhz),
            memory_clock_mhz=float(model.memory_max_mhz),
        )
        self.counters = {name: 0.0 for name in INTEGRATED}
        # The energy counter restarts from zero when the driver reloads or the GPU resets: what it had is subtracted.
        self.energy_restart_j = 0.0
        self.energy_reset_after_s: float | None = (
            None  # a scripted reload, this long after the machine was built
        )
        self.last_advance_s = now_s()
        self.handle_struct = machine.register(self, struct_c_nvmlDevice_t)

    def advance(self) -> None:
        """Integrates the readings up to now and delivers scheduled Xids that are due."""
        with lock:
            current_s = now_s()
            elapsed_s = current_s - self.last_advance_s
            if elapsed_s > 0:
                for name in INTEGRATED:
                    self.counters[name] += self.readings[name] * elapsed_s
            self.last_advance_s = current_s
            since_start_s = current_s - self.machine.start_s
            due = [xid for at_s, xid in self.pending_xids if since_start_s >= at_s]
            self.pending_xids = [(at_s, xid) for at_s, xid in self.pending_xids if since_start_s < at_s]
            for xid in due:
                self.inject_xid(xid)

    def set(self, **readings: float) -> None:
        """Changes readings from now on: fractions 0..1, *_bps in bytes/s, power_w, temperature_c, *_mhz."""
        with lock:
            self.advance()  # what happened before now keeps the old rates
            for name, value in readings.items():
                if name not in self.readings:
                    raise ValueError(
                        f"unknown reading {name!r}; accepted: {', '.join(sorted(self.readings))}"
                    )
                self.readings[name] = float(value)

    def reset_energy(self) -> None:
        """The driver reloads (or the GPU resets): the total energy counter starts again from zero, so it goes back."""
        with lock:
            self.advance()
            self.energy_restart_j = self.counters["power_w"]

    def energy_mj(self) -> int:
        """nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver (re)loaded, an unsigned integer."""
        with lock:
            due = self.energy_reset_after_s
            if due is not None and now_s() - self.machine.start_s >= due:
                self.energy_reset_after_s = None
                self.reset_energy()
            return int((self.counters["power_w"] - self.energy_restart_j) * 1000)

    def throttle(self, reason: str) -> None:
        """Switches a clock event reason on ('power_cap', 'thermal', ...) or off ('none')."""
        if reason not in THROTTLE_REASONS:
            raise ValueError(f"unknown throttle {reason!r}; accepted: {', '.join(THROTTLE_REASONS)}")
        with lock:
            self.clocks_event_reasons = getattr(nvml_codes, THROTTLE_REASONS[reason])
            if reason == "power_cap" and self.model.power_limit_w is not None:
                self.set(power_w=self.model.power_limit_w)  # a power-capped GPU sits at its limit

    def current_clock_events(self) -> int:
        """The clock event reasons now: a throttle scripted to end stops at its time."""
        if self.throttle_until_s is not None and now_s() - self.machine.start_s >= self.throttle_until_s:
            return 0
        return self.clocks_event_reasons

    def inject_xid(self, xid: int, at_s: float | None = None) -> None:
        """Raises Xid `xid` now, or `at_s` seconds after the machine was built, in every event set watching."""
        with lock:
            if at_s is not None:
                self.pending_xids.append((at_s, xid))
                return
            for event_set in self.machine.event_sets():
                if event_set.registered.get(self, 0) & nvml_codes.nvmlEventTypeXidCriticalError:
                    event_set.queue.append((self, nvml_codes.nvmlEventTypeXidCriticalError, xid))
            events_changed.notify_all()

    def lose(self) -> None:
        """The GPU falls off the bus: every call on it raises NVMLError_GpuIsLost from now on."""
        with lock:
            self.lost = True
            events_changed.notify_all()

    def is_lost(self) -> bool:
        return self.lost or (
            self.lost_after_s is not None and now_s() - self.machine.start_s >= self.lost_after_s
        )

    def add_ecc_errors(self, corrected: int = 0, uncorrected: int = 0) -> None:
        with lock:
            self.ecc_corrected += corrected
            self.ecc_uncorrected += uncorrected

    def enable_mig(self, sm_counts: list[int]) -> None:
        """Turns MIG mode on with one MIG device per entry, each with that many SMs."""
        if not self.model.mig_capable:
            raise ValueError(f"{self.model.name} has no MIG mode; MIG GPUs here: H100, H200, A100")
        with lock:
            self.mig_enabled = True
            self.mig_devices = [FakeMigDevice(self, i, sm_count) for i, sm_count in enumerate(sm_counts)]

    def memory_used_b(self) -> int:
        return self.base_memory_used_b + sum(used_b for _, used_b in self.processes)

    def apply_settings(self, settings: dict, where: str) -> None:
        """Applies one GPU's entry of a TM_FAKE_GPUS_SCRIPT file; keys are documented in docs/nvml-errors.md."""
        if not isinstance(settings, dict):
            raise ValueError(f"{where}: expected a JSON object of settings")
        for key, value in settings.items():
            if key == "gpm" and value in GPM_MODES:
                self.gpm = value
            elif key == "lost_after_s":
                self.lost_after_s = float(value)
            elif key == "energy_reset_after_s":
                self.energy_reset_after_s = float(value)
            elif key == "fail" and isinstance(value, dict):
                for call, error in value.items():
                    if call not in SCRIPTABLE_CALLS:
                        raise ValueError(f"{where}: 'fail' names {call!r}, which is no pynvml function")
                    self.failures[SCRIPTABLE_CALLS[call]] = error_code(error, where)
            elif key == "throttle":
                self.throttle(value)
            elif key == "throttle_until_s":
                self.throttle_until_s = float(value)
            elif key == "xids":
                for at_s, xid in value:
                    self.inject_xid(int(xid), at_s=float(at_s))
            elif key == "processes":
                self.processes = [(int(pid), int(used_b)) for pid, used_b in value]
            elif key == "mig":
                self.enable_mig([int(sm_count) for sm_count in value])
            elif key in self.readings:
                self.set(**{key: value})
            else:
                accepted = [
                    "gpm",
                    "lost_after_s",
                    "energy_reset_after_s",
                    "fail",
                    "throttle",
                    "throttle_until_s",
                    "xids",
                    "processes",
                    "mig",
                    *self.readings,
                ]
                raise ValueError(
                    f"{where}: bad setting {key}={value!r}; accepted keys: {', '.join(accepted)}, "
                    f"with gpm one of {', '.join(GPM_MODES)}"
                )


class FakeMigDevice:
    """A MIG device of a fake GPU; GPM on it reads its parent's counters."""

    def __init__(self, parent: FakeGpu, index: int, sm_count: int):
        self.parent, self.index, self.sm_count = parent, index, sm_count
        self.gpu_instance_id, self.compute_instance_id = index + 1, 0
        self.memory_total_b = (parent.model.memory_total_b or 0) * sm_count // parent.model.sm_count
        slices = max(1, round(7 * sm_count / parent.model.sm_count))
        self.name = f"{parent.model.name} MIG {slices}g.{round(self.memory_total_b / 1e9)}gb"
        self.slices = slices
        self.uuid = f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{parent.uuid}/{index}')}"
        self.handle_struct = parent.machine.register(self, struct_c_nvmlDevice_t)


class EventSet:
    """An NVML event set: the GPUs and event types registered with it, and the events waiting in it."""

    def __init__(self, machine: FakeMachine):
        self.registered: dict[FakeGpu, int] = {}
        self.queue: list[tuple[FakeGpu, int, int]] = []
        self.struct = machine.register(self, struct_c_nvmlEventSet_t)


class FakeMachine:
    """The GPUs fake_pynvml pretends to drive, built from a spec such as '8xH100' or '2xA100,1xL4'."""

    def __init__(self, spec: str, init_error: int = 0):
        self.spec, self.init_error = spec, init_error
        self.start_s = now_s()
        self.driver_version, self.cuda_driver_version = "580.95.05", 13000  # plausible, not a real install
        self.objects: dict[int, object] = {}
        self._keys = itertools.count(1)
        self.gpus = [FakeGpu(self, model, index) for index, model in enumerate(parse_spec(spec))]

    def register(self, obj: object, struct_type: type) -> Structure:
        """Gives `obj` a handle struct; a handle is a pointer to it, as NVML's are pointers to opaque structs."""
        with lock:
            key = next(self._keys)
            self.objects[key] = obj
            return struct_type(fake_key=key)

    def event_sets(self) -> list[EventSet]:
        return [obj for obj in self.objects.values() if isinstance(obj, EventSet)]

    def apply_script(self, script: dict, source: str = "script") -> None:
        """{"machine": {"init_error": "library_not_found"}, "0": {"gpm": "blocked"}, "1": {"lost_after_s": 5}}"""
        if not isinstance(script, dict):
            raise ValueError(f"{source}: expected a JSON object keyed by GPU index or 'machine'")
        for key, settings in script.items():
            if key == "machine" and isinstance(settings, dict) and set(settings) <= {"init_error"}:
                self.init_error = error_code(settings.get("init_error", "success"), f"{source}: machine")
            elif key.isdigit() and int(key) < len(self.gpus):
                self.gpus[int(key)].apply_settings(settings, f"{source}: GPU {key}")
            else:
                raise ValueError(
                    f"{source}: key {key!r} must be 'machine' (with 'init_error') or a GPU index "
                    f"0..{len(self.gpus) - 1}"
                )
