"""A stand-in for nvidia-ml-py's `pynvml`, driven by the scriptable fake GPUs of `fake_gpus`, so the real NVML
backend runs here. Same function names, constant values, `NVMLError_*` classes and return types as pynvml 13.x; it
must never pass for real hardware: `IS_FAKE` is True and the sampler labels every device from this module "fake".

Why one module of about 950 lines: it mirrors one library's surface, module for module (pynvml is one module: its
constants, ctypes structures, error classes and one function per NVML call the backend makes), so the backend swaps
one for the other by name; the scriptable machine behind it already lives in ``fake_gpus``, and the return codes,
clock event reasons and event types both speak in ``nvml_codes`` (handed on from here under pynvml's names).
"""

from __future__ import annotations

import functools
import json
import os
from ctypes import (
    POINTER,
    Structure,
    Union,
    c_char,
    c_char_p,
    c_double,
    c_int,
    c_int64,
    c_longlong,
    c_uint,
    c_uint32,
    c_ulong,
    c_ulonglong,
    c_ushort,
)

# The scriptable machine lives in fake_gpus; its names are re-exported here for tests and demos.
from trainmeter_sources.gpu.fake_gpus import CORES_PER_SM as CORES_PER_SM
from trainmeter_sources.gpu.fake_gpus import GPM_MODES as GPM_MODES
from trainmeter_sources.gpu.fake_gpus import GPU_MODELS as GPU_MODELS
from trainmeter_sources.gpu.fake_gpus import MIB_B as MIB_B
from trainmeter_sources.gpu.fake_gpus import SCRIPTABLE_CALLS, EventSet, now_s
from trainmeter_sources.gpu.fake_gpus import THROTTLE_REASONS as THROTTLE_REASONS
from trainmeter_sources.gpu.fake_gpus import FakeGpu as FakeGpu
from trainmeter_sources.gpu.fake_gpus import FakeMachine as FakeMachine
from trainmeter_sources.gpu.fake_gpus import FakeMigDevice as FakeMigDevice
from trainmeter_sources.gpu.fake_gpus import GpuModel as GpuModel
from trainmeter_sources.gpu.fake_gpus import events_changed as _events_changed
from trainmeter_sources.gpu.fake_gpus import lock as _lock
from trainmeter_sources.gpu.fake_gpus import parse_spec as parse_spec
from trainmeter_sources.gpu.fake_gpus import struct_c_nvmlDevice_t as struct_c_nvmlDevice_t
from trainmeter_sources.gpu.fake_gpus import struct_c_nvmlEventSet_t as struct_c_nvmlEventSet_t
from trainmeter_sources.gpu.fake_gpus import struct_c_nvmlGpmSample_t as struct_c_nvmlGpmSample_t

# NVML's return codes, clock event reasons and event types: pynvml's names, handed on whole from the leaf that
# fake_gpus reads them from too (pyproject lets this one module take them with *).
from trainmeter_sources.gpu.nvml_codes import *

IS_FAKE = True

# ---- constants: the values of pynvml 13.615 (nvidia-ml-py) and of nvml.h ------------------------------------
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_VIDEO = 3
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_ADA = 8
NVML_DEVICE_ARCH_HOPPER = 9
NVML_DEVICE_ARCH_BLACKWELL = 10
NVML_DEVICE_ARCH_UNKNOWN = 0xFFFFFFFF
NVML_GPU_INSTANCE_ID_ANY = 0xFFFFFFFF
NVML_COMPUTE_INSTANCE_ID_ANY = 0xFFFFFFFF
NVML_NVLINK_MAX_LINKS = 36
NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96
NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96
NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32
NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16
NVML_VALUE_NOT_AVAILABLE_ulonglong = c_ulonglong(-1)
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX = 140
NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX = 141
NVML_FI_DEV_POWER_INSTANT = 186
nvmlMemory_v2 = 0x02000028
nvmlTemperature_v1 = 0x100000C

nvmlClocksThrottleReasonNone = nvmlClocksEventReasonNone
nvmlClocksThrottleReasonGpuIdle = nvmlClocksEventReasonGpuIdle
nvmlClocksThrottleReasonSwPowerCap = nvmlClocksEventReasonSwPowerCap
nvmlClocksThrottleReasonHwSlowdown = nvmlClocksEventReasonHwSlowdown
nvmlClocksThrottleReasonSwThermalSlowdown = nvmlClocksEventReasonSwThermalSlowdown
nvmlClocksThrottleReasonHwThermalSlowdown = nvmlClocksEventReasonHwThermalSlowdown

NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_INTEGER_UTIL = 4
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DFMA_TENSOR_UTIL = 6
NVML_GPM_METRIC_HMMA_TENSOR_UTIL = 7
NVML_GPM_METRIC_DMMA_TENSOR_UTIL = 8
NVML_GPM_METRIC_IMMA_TENSOR_UTIL = 9
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_FP64_UTIL = 11
NVML_GPM_METRIC_FP32_UTIL = 12
NVML_GPM_METRIC_FP16_UTIL = 13
NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20
NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21
NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC = 60
NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC = 61
NVML_GPM_METRIC_MAX = 477
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_SUPPORT_VERSION = 1


# ---- errors: one NVMLError subclass per NVML_ERROR_* code, built the way pynvml builds them -----------------
class NVMLLibraryMismatchError(Exception):
    pass


class NVMLError(Exception):
    _valClassMapping: dict[int, type] = {}
    # pynvml's own table; codes missing here are looked up through nvmlErrorString, as pynvml does.
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    def __new__(typ, value):
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self):
        try:
            if self.value not in NVMLError._errcode_to_string:
                NVMLError._errcode_to_string[self.value] = str(nvmlErrorString(self.value))
            return NVMLError._errcode_to_string[self.value]
        except NVMLError:
            return f"NVML Error with code {self.value}"

    def __eq__(self, other):
        return self.value == other.value


def _fixed_code_constructor(code):
    def __new__(typ, *args):
        return NVMLError.__new__(typ, code)

    return __new__


for _name, _code in list(globals().items()):
    if _name.startswith("NVML_ERROR_"):
        # NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost, the class name pynvml generates.
        _class_name = "NVMLError_" + "".join(p.capitalize() for p in _name[len("NVML_ERROR_") :].split("_"))
        _cls = type(_class_name, (NVMLError,), {"__new__": _fixed_code_constructor(_code)})
        _cls.__module__ = __name__
        globals()[_class_name] = _cls
        NVMLError._valClassMapping[_code] = _cls


def nvmlExceptionClass(nvmlErrorCode):
    if nvmlErrorCode not in NVMLError._valClassMapping:
        raise ValueError(f"nvmlErrorCode {nvmlErrorCode} is not valid")
    return NVMLError._valClassMapping[nvmlErrorCode]


# What libnvidia-ml's nvmlErrorString says for codes outside pynvml's table, where a public record shows it;
# see docs/nvml-errors.md. Other codes get "Unknown Error" here, which the real library may word differently.
_LIBRARY_ERROR_STRINGS = {NVML_SUCCESS: "Success", NVML_ERROR_IN_USE: "In use by another client"}


# ---- ctypes structures, laid out as pynvml's -----------------------------------------------------------------
class _PrintableStructure(Structure):
    # pynvml's structures hand out str for char arrays and accept str on assignment; so do these.
    def __getattribute__(self, name):
        value = super().__getattribute__(name)
        return value.decode() if isinstance(value, bytes) else value

    def __setattr__(self, name, value):
        super().__setattr__(name, value.encode() if isinstance(value, str) else value)


c_nvmlDevice_t = POINTER(struct_c_nvmlDevice_t)
c_nvmlEventSet_t = POINTER(struct_c_nvmlEventSet_t)
c_nvmlGpmSample_t = POINTER(struct_c_nvmlGpmSample_t)


class c_nvmlMemory_t(_PrintableStructure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class c_nvmlMemory_v2_t(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("total", c_ulonglong),
        ("reserved", c_ulonglong),
        ("free", c_ulonglong),
        ("used", c_ulonglong),
    ]


class c_nvmlUtilization_t(_PrintableStructure):
    _fields_ = [("gpu", c_uint), ("memory", c_uint)]


class nvmlPciInfo_t(_PrintableStructure):
    _fields_ = [
        ("busIdLegacy", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", c_uint),
        ("bus", c_uint),
        ("device", c_uint),
        ("pciDeviceId", c_uint),
        ("pciSubSystemId", c_uint),
        ("busId", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    ]


class c_nvmlDeviceAttributes(Structure):
    _fields_ = [
        ("multiprocessorCount", c_uint),
        ("sharedCopyEngineCount", c_uint),
        ("sharedDecoderCount", c_uint),
        ("sharedEncoderCount", c_uint),
        ("sharedJpegCount", c_uint),
        ("sharedOfaCount", c_uint),
        ("gpuInstanceSliceCount", c_uint),
        ("computeInstanceSliceCount", c_uint),
        ("memorySizeMB", c_ulonglong),
    ]


class c_nvmlEventData_t(_PrintableStructure):
    _fields_ = [
        ("device", c_nvmlDevice_t),
        ("eventType", c_ulonglong),
        ("eventData", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    ]


class c_nvmlValue_t(Union):
    _fields_ = [
        ("dVal", c_double),
        ("uiVal", c_uint),
        ("ulVal", c_ulong),
        ("ullVal", c_ulonglong),
        ("sllVal", c_longlong),
        ("siVal", c_int),
        ("usVal", c_ushort),
    ]


class c_nvmlFieldValue_t(_PrintableStructure):
    _fields_ = [
        ("fieldId", c_uint32),
        ("scopeId", c_uint32),
        ("timestamp", c_int64),
        ("latencyUsec", c_int64),
        ("valueType", c_uint),
        ("nvmlReturn", c_uint),
        ("value", c_nvmlValue_t),
    ]


class c_metricInfo_t(Structure):
    _fields_ = [("shortName", c_char_p), ("longName", c_char_p), ("unit", c_char_p)]


class c_nvmlGpmMetric_t(_PrintableStructure):
    _fields_ = [
        ("metricId", c_uint),
        ("nvmlReturn", c_uint),
        ("value", c_double),
        ("metricInfo", c_metricInfo_t),
    ]


class c_nvmlGpmMetricsGet_t(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("numMetrics", c_uint),
        ("sample1", c_nvmlGpmSample_t),
        ("sample2", c_nvmlGpmSample_t),
        ("metrics", c_nvmlGpmMetric_t * NVML_GPM_METRIC_MAX),
    ]


class c_nvmlGpmSupport_t(_PrintableStructure):
    _fields_ = [("version", c_uint), ("isSupportedDevice", c_uint)]


class nvmlFriendlyObject:
    def __init__(self, dictionary):
        for key, value in dictionary.items():
            setattr(self, key, value)

    def __str__(self):
        return str(self.__dict__)


# GPM answers per mode on nvmlGpmSampleGet: blocked is what some clouds do, held is a profiler owning it.
_GPM_MODE_ERRORS = {
    "unsupported": NVML_ERROR_NOT_SUPPORTED,
    "blocked": NVML_ERROR_NO_PERMISSION,
    "held": NVML_ERROR_IN_USE,
}
# Fractions (0..1) a script sets; GPM reports each as percent 0..100 over the interval between two samples.
_GPM_FRACTIONS = {
    NVML_GPM_METRIC_GRAPHICS_UTIL: "graphics_active",
    NVML_GPM_METRIC_SM_UTIL: "sm_active",
    NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy",
    NVML_GPM_METRIC_INTEGER_UTIL: "integer_active",
    NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_active",
    NVML_GPM_METRIC_DFMA_TENSOR_UTIL: "dfma_tensor_active",
    NVML_GPM_METRIC_HMMA_TENSOR_UTIL: "hmma_tensor_active",
    NVML_GPM_METRIC_DMMA_TENSOR_UTIL: "dmma_tensor_active",
    NVML_GPM_METRIC_IMMA_TENSOR_UTIL: "imma_tensor_active",
    NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_active",
    NVML_GPM_METRIC_FP64_UTIL: "fp64_active",
    NVML_GPM_METRIC_FP32_UTIL: "fp32_active",
    NVML_GPM_METRIC_FP16_UTIL: "fp16_active",
}
# Byte rates a script sets; GPM reports them in MiB/s.
_GPM_RATES = {
    NVML_GPM_METRIC_PCIE_TX_PER_SEC: "pcie_tx_bps",
    NVML_GPM_METRIC_PCIE_RX_PER_SEC: "pcie_rx_bps",
    NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: "nvlink_rx_bps",
    NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: "nvlink_tx_bps",
}
_NVLINK_FIELDS = {
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "nvlink_tx_bps",
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "nvlink_rx_bps",
    NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: "nvlink_tx_bps",
    NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: "nvlink_rx_bps",
}


class _GpmSampleBuffer:
    def __init__(self, machine: FakeMachine):
        self.snapshot: tuple[object, float, dict[str, float]] | None = None
        self.struct = machine.register(self, struct_c_nvmlGpmSample_t)


_machine: FakeMachine | None = None
_init_refcount = 0
_library_loaded = False


def install(machine: FakeMachine | None) -> FakeMachine | None:
    """Makes `machine` the one this module drives, uninitialised, as a fresh process would find it."""
    global _machine, _init_refcount, _library_loaded
    with _lock:
        _machine, _init_refcount, _library_loaded = machine, 0, False
    return machine


def installed_machine() -> FakeMachine | None:
    """The machine this module drives now; None until one is installed or read from TM_FAKE_GPUS."""
    return _machine


def configure_from_env(environ) -> FakeMachine | None:
    """Builds and installs the machine TM_FAKE_GPUS describes, scripted by TM_FAKE_GPUS_SCRIPT; None if unset."""
    spec = environ.get("TM_FAKE_GPUS", "").strip()
    if not spec:
        return None
    machine = FakeMachine(spec)
    script_path = environ.get("TM_FAKE_GPUS_SCRIPT", "").strip()
    if script_path:
        source = f"TM_FAKE_GPUS_SCRIPT={script_path!r}"
        try:
            with open(script_path, encoding="utf-8") as script_file:
                script = json.load(script_file)
        except OSError as exc:
            raise ValueError(
                f"{source}: cannot read it ({exc.strerror}); give the path of a JSON file"
            ) from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}: not JSON ({exc.msg} at line {exc.lineno})") from None
        machine.apply_script(script, source)
    return install(machine)


# ---- the pynvml functions --------------------------------------------------------------------------------------
def _raise(code: int):
    raise NVMLError(code)


def _lookup(pointer, kinds):
    """The fake object behind a handle, or NVMLError_InvalidArgument as NVML gives for a bad handle."""
    try:
        key = pointer.contents.fake_key
    except (AttributeError, TypeError, ValueError):  # not a pointer, or a NULL one
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    obj = _machine.objects.get(key) if _machine is not None else None
    if not isinstance(obj, kinds):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    return obj


def _nvml_call(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        with _lock:
            if _init_refcount == 0:
                _raise(NVML_ERROR_UNINITIALIZED)
            return fn(*args, **kwargs)

    return call


def _device_call(mig_ok: bool = False):
    """Wraps a device query: checks init, the handle, a lost GPU and the scripted failure for this call."""

    def wrap(fn):
        @_nvml_call
        @functools.wraps(fn)
        def call(handle, *args, **kwargs):
            device = _lookup(handle, (FakeGpu, FakeMigDevice))
            gpu = device.parent if isinstance(device, FakeMigDevice) else device
            gpu.advance()
            if gpu.is_lost():
                _raise(NVML_ERROR_GPU_IS_LOST)
            if isinstance(device, FakeMigDevice) and not mig_ok:
                _raise(NVML_ERROR_NOT_SUPPORTED)
            if fn.__name__ in gpu.failures:
                _raise(gpu.failures[fn.__name__])
            return fn(device, *args, **kwargs)

        return call

    return wrap


def nvmlInitWithFlags(flags):
    global _init_refcount, _library_loaded
    with _lock:
        if _machine is None:
            configure_from_env(os.environ)
        if _machine is None or _machine.init_error == NVML_ERROR_LIBRARY_NOT_FOUND:
            _raise(NVML_ERROR_LIBRARY_NOT_FOUND)  # no TM_FAKE_GPUS: as a machine without the driver library
        _library_loaded = True
        if _machine.init_error != NVML_SUCCESS:
            _raise(_machine.init_error)
        _init_refcount += 1  # NVML counts inits; shutdown only takes effect at zero


def nvmlInit():
    nvmlInitWithFlags(0)


def nvmlShutdown():
    global _init_refcount
    with _lock:
        if _init_refcount == 0:
            _raise(NVML_ERROR_UNINITIALIZED)
        _init_refcount -= 1


def nvmlErrorString(result):
    # pynvml asks the loaded library; before the first nvmlInit there is none, so this raises Uninitialized.
    if not _library_loaded:
        _raise(NVML_ERROR_UNINITIALIZED)
    return _LIBRARY_ERROR_STRINGS.get(result) or NVMLError._errcode_to_string.get(result, "Unknown Error")


@_nvml_call
def nvmlSystemGetDriverVersion():
    return _machine.driver_version


@_nvml_call
def nvmlSystemGetNVMLVersion():
    return f"13.{_machine.driver_version}"


@_nvml_call
def nvmlSystemGetCudaDriverVersion():
    return _machine.cuda_driver_version


nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion


@_nvml_call
def nvmlDeviceGetCount():
    return len(_machine.gpus)


@_nvml_call
def nvmlDeviceGetHandleByIndex(index):
    if not isinstance(index, int) or not 0 <= index < len(_machine.gpus):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    gpu = _machine.gpus[index]
    if gpu.is_lost():
        _raise(NVML_ERROR_GPU_IS_LOST)
    if "nvmlDeviceGetHandleByIndex" in gpu.failures:
        _raise(gpu.failures["nvmlDeviceGetHandleByIndex"])
    return c_nvmlDevice_t(gpu.handle_struct)


@_nvml_call
def nvmlDeviceGetHandleByUUID(uuid):
    for gpu in _machine.gpus:
        for device in (gpu, *gpu.mig_devices):
            if device.uuid == uuid:
                return c_nvmlDevice_t(device.handle_struct)
    _raise(NVML_ERROR_NOT_FOUND)


@_device_call(mig_ok=True)
def nvmlDeviceGetName(device):
    return device.name if isinstance(device, FakeMigDevice) else device.model.name


@_device_call(mig_ok=True)
def nvmlDeviceGetUUID(device):
    return device.uuid


@_device_call()
def nvmlDeviceGetIndex(gpu):
    return gpu.index


@_device_call()
def nvmlDeviceGetPciInfo(gpu):
    info = nvmlPciInfo_t(
        domain=gpu.pci_domain, bus=gpu.pci_bus, device=0, pciDeviceId=gpu.model.pci_device_id
    )
    info.busId = f"{gpu.pci_domain:08X}:{gpu.pci_bus:02X}:00.0"
    info.busIdLegacy = f"{gpu.pci_domain:04X}:{gpu.pci_bus:02X}:00.0"
    return info


nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo


@_device_call()
def nvmlDeviceGetArchitecture(gpu):
    return gpu.model.arch


@_device_call()
def nvmlDeviceGetCudaComputeCapability(gpu):
    return gpu.model.cuda_capability


@_device_call()
def nvmlDeviceGetUtilizationRates(gpu):
    if gpu.mig_enabled:  # nvml.h: not supported on MIG-enabled GPUs
        _raise(NVML_ERROR_NOT_SUPPORTED)
    return c_nvmlUtilization_t(
        gpu=round(100 * gpu.readings["gpu_busy"]), memory=round(100 * gpu.readings["memory_busy"])
    )


@_device_call(mig_ok=True)
def nvmlDeviceGetMemoryInfo(device, version=None):
    if isinstance(device, FakeMigDevice):
        total_b, used_b = device.memory_total_b, 0
    else:
        total_b, used_b = device.model.memory_total_b, device.memory_used_b()
    if total_b is None:  # unified memory (GB10): NVML has no framebuffer to report
        _raise(NVML_ERROR_NOT_SUPPORTED)
    free_b = max(0, total_b - used_b)
    if not version:
        return c_nvmlMemory_t(total=total_b, free=free_b, used=used_b)
    if version != nvmlMemory_v2:
        _raise(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    return c_nvmlMemory_v2_t(version=version, total=total_b, reserved=0, free=free_b, used=used_b)


@_device_call()
def nvmlDeviceGetPowerUsage(gpu):
    return round(gpu.readings["power_w"] * 1000)  # milliwatts


@_device_call()
def nvmlDeviceGetEnforcedPowerLimit(gpu):
    if gpu.model.power_limit_w is None:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    return round(gpu.model.power_limit_w * 1000)  # milliwatts


@_device_call()
def nvmlDeviceGetPowerManagementLimit(gpu):
    if gpu.model.power_limit_w is None:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    return round(gpu.model.power_limit_w * 1000)


@_device_call()
def nvmlDeviceGetTotalEnergyConsumption(gpu):
    return gpu.energy_mj()  # millijoules since the machine was built or its scripted driver reload


def _temperature_c(gpu, sensor):
    if sensor != NVML_TEMPERATURE_GPU:
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    return round(gpu.readings["temperature_c"])


@_device_call()
def nvmlDeviceGetTemperature(gpu, sensor):
    return _temperature_c(gpu, sensor)


@_device_call()
def nvmlDeviceGetTemperatureV(gpu, sensor, version=nvmlTemperature_v1):
    if version != nvmlTemperature_v1:
        _raise(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    return _temperature_c(gpu, sensor)


def _clock_mhz(gpu, clock_type, prefix):
    if clock_type in (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_VIDEO):  # the fake keeps them in step
        return gpu.readings["sm_clock_mhz"] if prefix == "now" else gpu.model.sm_max_mhz
    if clock_type == NVML_CLOCK_MEM:
        return gpu.readings["memory_clock_mhz"] if prefix == "now" else gpu.model.memory_max_mhz
    _raise(NVML_ERROR_INVALID_ARGUMENT)


@_device_call()
def nvmlDeviceGetClockInfo(gpu, type):
    return round(_clock_mhz(gpu, type, "now"))


@_device_call()
def nvmlDeviceGetMaxClockInfo(gpu, type):
    return round(_clock_mhz(gpu, type, "max"))


@_device_call()
def nvmlDeviceGetCurrentClocksEventReasons(gpu):
    return gpu.current_clock_events()


nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons


@_device_call()
def nvmlDeviceGetPcieThroughput(gpu, counter):
    names = {NVML_PCIE_UTIL_TX_BYTES: "pcie_tx_bps", NVML_PCIE_UTIL_RX_BYTES: "pcie_rx_bps"}
    if counter not in names:
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    return int(gpu.readings[names[counter]] / 1000)  # nvml.h: KB/s over the last 20 ms


@_device_call()
def nvmlDeviceGetFieldValues(gpu, fieldIds):
    values = (c_nvmlFieldValue_t * len(fieldIds))()
    for value, field in zip(values, fieldIds, strict=True):
        try:
            value.fieldId, value.scopeId = field
        except TypeError:
            value.fieldId = field
        value.timestamp = int(now_s() * 1e6)
        value.nvmlReturn, value.valueType = NVML_SUCCESS, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        links = gpu.model.nvlink_links
        if value.fieldId in _NVLINK_FIELDS and links:
            # Cumulative KiB; scopeId picks a link (the fake splits evenly) or UINT_MAX for all of them.
            total_kib = gpu.counters[_NVLINK_FIELDS[value.fieldId]] / 1024
            if value.scopeId == 0xFFFFFFFF or value.scopeId < links:
                value.value.ullVal = int(total_kib if value.scopeId == 0xFFFFFFFF else total_kib / links)
            else:
                value.nvmlReturn = NVML_ERROR_INVALID_ARGUMENT
        elif value.fieldId == NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
            value.value.ullVal = gpu.energy_mj()
        elif value.fieldId == NVML_FI_DEV_POWER_INSTANT:
            value.valueType, value.value.uiVal = (
                NVML_VALUE_TYPE_UNSIGNED_INT,
                round(gpu.readings["power_w"] * 1000),
            )
        else:
            value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
    return values


@_device_call()
def nvmlDeviceGetTotalEccErrors(gpu, errorType, counterType):
    if not gpu.model.ecc:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    counts = {
        NVML_MEMORY_ERROR_TYPE_CORRECTED: gpu.ecc_corrected,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED: gpu.ecc_uncorrected,
    }
    if errorType not in counts or counterType not in (NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    return counts[
        errorType
    ]  # the fake's aggregate count starts with the machine, so it equals the volatile one


@_device_call(mig_ok=True)
def nvmlDeviceGetComputeRunningProcesses(device):
    gpu = device.parent if isinstance(device, FakeMigDevice) else device
    return [
        nvmlFriendlyObject(
            {
                "pid": pid,
                "usedGpuMemory": used_b,
                "gpuInstanceId": NVML_GPU_INSTANCE_ID_ANY,
                "computeInstanceId": NVML_COMPUTE_INSTANCE_ID_ANY,
            }
        )
        for pid, used_b in gpu.processes
    ]


nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses


@_device_call()
def nvmlDeviceGetMigMode(gpu):
    if not gpu.model.mig_capable:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    mode = NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else NVML_DEVICE_MIG_DISABLE
    return [mode, mode]  # [current, pending]


@_device_call()
def nvmlDeviceGetMaxMigDeviceCount(gpu):
    return 7 if gpu.mig_enabled else 0  # nvml.h: zero when MIG is not supported or not enabled


@_device_call()
def nvmlDeviceGetMigDeviceHandleByIndex(gpu, index):
    if not gpu.model.mig_capable:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    if not isinstance(index, int) or not 0 <= index < 7:
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    if not gpu.mig_enabled or index >= len(gpu.mig_devices):
        _raise(NVML_ERROR_NOT_FOUND)
    return c_nvmlDevice_t(gpu.mig_devices[index].handle_struct)


@_device_call(mig_ok=True)
def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(device):
    if not isinstance(device, FakeMigDevice):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    return c_nvmlDevice_t(device.parent.handle_struct)


@_device_call(mig_ok=True)
def nvmlDeviceIsMigDeviceHandle(device):
    return c_uint(int(isinstance(device, FakeMigDevice)))  # pynvml returns the c_uint itself, not its value


@_device_call(mig_ok=True)
def nvmlDeviceGetGpuInstanceId(device):
    if not isinstance(device, FakeMigDevice):
        _raise(NVML_ERROR_NOT_SUPPORTED)
    return device.gpu_instance_id


@_device_call(mig_ok=True)
def nvmlDeviceGetComputeInstanceId(device):
    if not isinstance(device, FakeMigDevice):
        _raise(NVML_ERROR_NOT_SUPPORTED)
    return device.compute_instance_id


@_device_call(mig_ok=True)
def nvmlDeviceGetAttributes(device):
    # nvml.h: "This API currently only supports MIG device handles"; a whole GPU answers Not Supported.
    if not isinstance(device, FakeMigDevice):
        _raise(NVML_ERROR_NOT_SUPPORTED)
    return c_nvmlDeviceAttributes(
        multiprocessorCount=device.sm_count,
        gpuInstanceSliceCount=device.slices,
        computeInstanceSliceCount=device.slices,
        memorySizeMB=device.memory_total_b // MIB_B,
    )


@_device_call()
def nvmlDeviceGetNumGpuCores(gpu):
    # The FP32 CUDA cores, not the SMs: an L4 answers 7,424 (58 SMs of 128). nvml.h: "On MIG-enabled GPUs, querying
    # the device's core count is currently not supported".
    if gpu.mig_enabled:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    return gpu.model.sm_count * CORES_PER_SM[gpu.model.arch]


nvmlDeviceGetAttributes_v2 = nvmlDeviceGetAttributes


# ---- events (Xid) ----------------------------------------------------------------------------------------------
def _supported_event_types(gpu):
    ecc = nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError if gpu.model.ecc else 0
    return ecc | nvmlEventTypePState | nvmlEventTypeXidCriticalError | nvmlEventTypeClock


@_nvml_call
def nvmlEventSetCreate():
    return c_nvmlEventSet_t(EventSet(_machine).struct)


@_device_call()
def nvmlDeviceGetSupportedEventTypes(gpu):
    return _supported_event_types(gpu)


@_device_call()
def nvmlDeviceRegisterEvents(gpu, eventTypes, eventSet):
    event_set = _lookup(eventSet, EventSet)
    if eventTypes & ~_supported_event_types(gpu):
        _raise(NVML_ERROR_NOT_SUPPORTED)
    event_set.registered[gpu] = event_set.registered.get(gpu, 0) | eventTypes


@_nvml_call
def nvmlEventSetWait(eventSet, timeoutms):
    """The next event, waiting up to `timeoutms` of real time (the condition wakes on an injected Xid)."""
    event_set = _lookup(eventSet, EventSet)
    for attempt in range(2):
        for gpu in event_set.registered:
            gpu.advance()  # delivers scheduled Xids that are due
        if event_set.queue:
            gpu, event_type, data = event_set.queue.pop(0)
            return c_nvmlEventData_t(
                device=c_nvmlDevice_t(gpu.handle_struct),
                eventType=event_type,
                eventData=data,
                gpuInstanceId=NVML_GPU_INSTANCE_ID_ANY,
                computeInstanceId=NVML_COMPUTE_INSTANCE_ID_ANY,
            )
        if any(gpu.is_lost() for gpu in event_set.registered):
            _raise(NVML_ERROR_GPU_IS_LOST)
        if attempt == 0 and timeoutms > 0:
            _events_changed.wait(timeoutms / 1000)
    _raise(NVML_ERROR_TIMEOUT)


nvmlEventSetWait_v2 = nvmlEventSetWait


@_nvml_call
def nvmlEventSetFree(eventSet):
    _machine.objects.pop(_lookup(eventSet, EventSet).struct.fake_key)


# ---- GPM (Hopper and newer) ------------------------------------------------------------------------------------
@_device_call(mig_ok=True)
def nvmlGpmQueryDeviceSupport(device):
    gpu = device.parent if isinstance(device, FakeMigDevice) else device
    # Blocked and held GPM still report support: the failure only shows when sampling.
    return c_nvmlGpmSupport_t(
        version=NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(gpu.gpm != "unsupported")
    )


@_nvml_call
def nvmlGpmSampleAlloc():
    return c_nvmlGpmSample_t(_GpmSampleBuffer(_machine).struct)


@_nvml_call
def nvmlGpmSampleFree(gpmSample):
    _machine.objects.pop(_lookup(gpmSample, _GpmSampleBuffer).struct.fake_key)


def _take_gpm_sample(device, gpmSample):
    buffer = _lookup(gpmSample, _GpmSampleBuffer)
    gpu = device.parent if isinstance(device, FakeMigDevice) else device
    if gpu.gpm in _GPM_MODE_ERRORS:
        _raise(_GPM_MODE_ERRORS[gpu.gpm])
    buffer.snapshot = (device, now_s(), dict(gpu.counters))
    return gpmSample


@_device_call(mig_ok=True)
def nvmlGpmSampleGet(device, gpmSample):
    return _take_gpm_sample(device, gpmSample)


@_device_call()
def nvmlGpmMigSampleGet(gpu, gpuInstanceId, gpmSample):
    for mig in gpu.mig_devices:
        if mig.gpu_instance_id == gpuInstanceId:
            return _take_gpm_sample(mig, gpmSample)
    _raise(NVML_ERROR_NOT_FOUND)


@_nvml_call
def nvmlGpmMetricsGet(metricsGet):
    if metricsGet.version != NVML_GPM_METRICS_GET_VERSION:
        _raise(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    if metricsGet.numMetrics > NVML_GPM_METRIC_MAX:
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    first = _lookup(metricsGet.sample1, _GpmSampleBuffer).snapshot
    second = _lookup(metricsGet.sample2, _GpmSampleBuffer).snapshot
    if first is None or second is None or first[0] is not second[0] or second[1] <= first[1]:
        _raise(NVML_ERROR_INVALID_ARGUMENT)  # unfilled samples, two devices, or no time between them
    device, elapsed_s = first[0], second[1] - first[1]
    gpu = device.parent if isinstance(device, FakeMigDevice) else device
    for index in range(metricsGet.numMetrics):
        metric = metricsGet.metrics[index]
        name = _GPM_FRACTIONS.get(metric.metricId) or _GPM_RATES.get(metric.metricId)
        if name is None or (name.startswith("nvlink") and not gpu.model.nvlink_links):
            metric.nvmlReturn, metric.value = NVML_ERROR_NOT_SUPPORTED, 0.0
            continue
        per_s = (second[2][name] - first[2][name]) / elapsed_s
        # Percent 0..100 for utilisations, MiB/s for bandwidths, as nvml.h documents each metric.
        metric.value = per_s * 100 if metric.metricId in _GPM_FRACTIONS else per_s / MIB_B
        metric.nvmlReturn = NVML_SUCCESS
    return metricsGet


# The calls a script may fail, by every name this module gives them (fake_gpus checks a script against it).
SCRIPTABLE_CALLS.update(
    {
        name: value.__name__
        for name, value in list(globals().items())
        if name.startswith("nvml") and callable(value)
    }
)
