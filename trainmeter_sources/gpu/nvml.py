"""The NVML backend: loads nvidia-ml-py (or the fake module in its place when ``TM_FAKE_GPUS`` is set), initialises
NVML once per process, lists the devices, and turns every NVML answer into a value or the reason it is missing.

It never lets an NVML error reach the sampler as an exception and never creates a CUDA context (NVML needs none).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from trainmeter_core.model.platform_adapters import GPU_LOST, NO_NVML, NO_PERMISSION, NOT_ON_THIS_DEVICE

FAKE_ENV = "TM_FAKE_GPUS"
INSTALL_HINT = "pip install nvidia-ml-py (or pip install 'trainmeter[gpu]')"

# NVML return code -> the reason a field is missing, worded for a person (docs/nvml-errors.md lists which call can
# return which code). Codes not here read "NVML error N: <pynvml's wording>".
_REASONS = {
    1: "NVML not initialized",
    2: "NVML refused the request (invalid argument)",
    3: NOT_ON_THIS_DEVICE,
    4: NO_PERMISSION,
    6: "not found",
    7: "NVML buffer too small",
    8: "GPU lacks external power",
    9: "NVIDIA driver not loaded",
    10: "NVML timed out",
    11: "NVML interrupt issue",
    12: NO_NVML,
    13: "not in this driver's NVML",
    14: "GPU infoROM corrupted",
    15: GPU_LOST,
    16: "GPU needs a reset",
    17: "blocked by the operating system",
    18: "NVML and driver versions differ",
    19: "in use by another client",
    20: "NVML out of memory",
    21: "no data yet",
}


class NvmlUnavailable(Exception):
    """NVML cannot be used in this process: ``reason`` for the rows, ``detail`` one line saying what would fix it."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def load_library(environ: Mapping[str, str] | None = None) -> ModuleType:
    """The pynvml module to use: the fake one when ``TM_FAKE_GPUS`` is set, else nvidia-ml-py."""
    env = os.environ if environ is None else environ
    if env.get(FAKE_ENV, "").strip():
        from trainmeter_sources.gpu import fake_pynvml

        if fake_pynvml.installed_machine() is None:
            try:
                fake_pynvml.configure_from_env(env)
            except ValueError as exc:
                raise NvmlUnavailable(NO_NVML, str(exc)) from None
        return fake_pynvml
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable(NO_NVML, f"nvidia-ml-py is not installed: {INSTALL_HINT}") from None
    return pynvml


def error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def reason_for(exc: BaseException) -> str:
    """Why a field is missing, from the NVML error that said so."""
    code = error_code(exc)
    if code in _REASONS:
        return _REASONS[code]
    try:
        wording = str(exc)
    except Exception:  # pynvml's __str__ asks the library, which may itself fail
        wording = type(exc).__name__
    return f"NVML error {code}: {wording}"


_INIT_DETAILS = {
    12: "libnvidia-ml.so.1 was not found: there is no NVIDIA driver on this node (run on a node with an NVIDIA GPU)",
    9: "the NVIDIA kernel driver is not loaded (nvidia-smi fails too): load it, or run on a GPU node",
    4: "NVML was refused access to the GPUs (/dev/nvidia* permissions): run as a user in the video group",
}

_opened: dict[int, Nvml] = {}  # pid -> this process's one NVML session


class Nvml:
    """NVML initialised once in this process; every call answers ``(value, None)`` or ``(None, reason)``."""

    def __init__(self, lib: ModuleType) -> None:
        self.lib = lib
        self.fake = bool(getattr(lib, "IS_FAKE", False))
        self.error_type: type[BaseException] = getattr(lib, "NVMLError", Exception)

    @classmethod
    def open(cls, environ: Mapping[str, str] | None = None) -> Nvml:
        """This process's NVML, initialised on first use; raises :class:`NvmlUnavailable` with the fix."""
        existing = _opened.get(os.getpid())
        if existing is not None:
            return existing
        lib = load_library(environ)
        nvml = cls(lib)
        try:
            lib.nvmlInit()
        except nvml.error_type as exc:
            code = error_code(exc)
            detail = _INIT_DETAILS.get(code, f"nvmlInit failed: {reason_for(exc)}")
            if nvml.fake:
                detail = f"fake NVML ({FAKE_ENV}): {detail}"
            raise NvmlUnavailable(reason_for(exc), detail) from None
        _opened[os.getpid()] = nvml
        return nvml

    def close(self) -> None:
        """Shut NVML down (tests do; a sampler process simply exits)."""
        if _opened.get(os.getpid()) is self:
            del _opened[os.getpid()]
        try:
            self.lib.nvmlShutdown()
        except self.error_type:
            pass

    def call(self, name: str, *args: Any) -> tuple[Any, str | None]:
        fn = getattr(self.lib, name, None)
        if fn is None:
            return None, f"not in this nvidia-ml-py ({name}): upgrade it"
        try:
            return fn(*args), None
        except self.error_type as exc:
            return None, reason_for(exc)

    def constant(self, name: str, default: Any = None) -> Any:
        return getattr(self.lib, name, default)

    def versions(self) -> dict[str, str | None]:
        driver, _ = self.call("nvmlSystemGetDriverVersion")
        library, _ = self.call("nvmlSystemGetNVMLVersion")
        return {"driver": _text(driver), "nvml": _text(library)}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def handle_key(handle: Any) -> int | None:
    """A device handle's address: how an event's device is matched to ours."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


@dataclass
class DeviceInfo:
    """One device NVML lists: a whole GPU, or a MIG device (``mig_parent_uuid`` set) of one."""

    index: int  # NVML index of the GPU (of the parent GPU for a MIG device)
    handle: Any
    uuid: str | None
    name: str | None
    pci_bus_id: str | None = None
    arch: int | None = None
    mig_enabled: bool = False
    mig_parent_uuid: str | None = None
    mig_parent_handle: Any = None
    mig_gpu_instance_id: int | None = None
    mig_sm_count: int | None = None
    # What a whole GPU says of its size: NVML documents nvmlDeviceGetAttributes (the SM count) for MIG devices only,
    # so a whole GPU usually answers with its FP32 core count alone; each with the reason it is missing.
    sm_count: int | None = None
    sm_count_absent: str | None = None
    core_count: int | None = None
    core_count_absent: str | None = None
    migs: list[DeviceInfo] = field(default_factory=list)
    error: str | None = None  # the reason the device could not even be identified

    @property
    def is_mig(self) -> bool:
        return self.mig_parent_uuid is not None

    @property
    def label(self) -> str:
        return f"gpu{self.index}" + (f"/mig{self.mig_gpu_instance_id}" if self.is_mig else "")


def list_devices(nvml: Nvml) -> tuple[list[DeviceInfo], str | None]:
    """Every GPU NVML lists, each with its MIG devices; or an empty list and the reason."""
    count, reason = nvml.call("nvmlDeviceGetCount")
    if reason is not None:
        return [], reason
    devices = []
    for index in range(count):
        handle, reason = nvml.call("nvmlDeviceGetHandleByIndex", index)
        if reason is not None:
            devices.append(DeviceInfo(index=index, handle=None, uuid=None, name=None, error=reason))
            continue
        devices.append(_describe(nvml, index, handle))
    return devices, None


def _describe(nvml: Nvml, index: int, handle: Any) -> DeviceInfo:
    uuid, uuid_reason = nvml.call("nvmlDeviceGetUUID", handle)
    name, _ = nvml.call("nvmlDeviceGetName", handle)
    pci, _ = nvml.call("nvmlDeviceGetPciInfo", handle)
    arch, _ = nvml.call("nvmlDeviceGetArchitecture", handle)
    device = DeviceInfo(
        index=index,
        handle=handle,
        uuid=_text(uuid),
        name=_text(name),
        pci_bus_id=_text(getattr(pci, "busId", None)) if pci is not None else None,
        arch=arch if isinstance(arch, int) else None,
        error=uuid_reason if uuid_reason == GPU_LOST else None,
    )
    attributes, reason = nvml.call("nvmlDeviceGetAttributes", handle)
    sm_count = getattr(attributes, "multiprocessorCount", None) if attributes is not None else None
    device.sm_count = _positive(sm_count)
    device.sm_count_absent = None if device.sm_count else (reason or "NVML reported no SM count")
    cores, reason = nvml.call("nvmlDeviceGetNumGpuCores", handle)
    device.core_count = _positive(cores)
    device.core_count_absent = None if device.core_count else (reason or "NVML reported no core count")
    mode, _ = nvml.call("nvmlDeviceGetMigMode", handle)
    enabled = nvml.constant("NVML_DEVICE_MIG_ENABLE", 1)
    if isinstance(mode, (list, tuple)) and mode and mode[0] == enabled:
        device.mig_enabled = True
        device.migs = _mig_devices(nvml, device)
    return device


def _positive(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _mig_devices(nvml: Nvml, parent: DeviceInfo) -> list[DeviceInfo]:
    most, reason = nvml.call("nvmlDeviceGetMaxMigDeviceCount", parent.handle)
    if reason is not None or not most:
        return []
    migs = []
    for slot in range(most):
        handle, reason = nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", parent.handle, slot)
        if reason is not None:
            continue  # NVML numbers MIG devices sparsely: an empty slot says "not found"
        uuid, _ = nvml.call("nvmlDeviceGetUUID", handle)
        name, _ = nvml.call("nvmlDeviceGetName", handle)
        instance, _ = nvml.call("nvmlDeviceGetGpuInstanceId", handle)
        attributes, _ = nvml.call("nvmlDeviceGetAttributes", handle)
        sm_count = getattr(attributes, "multiprocessorCount", None) if attributes is not None else None
        migs.append(
            DeviceInfo(
                index=parent.index,
                handle=handle,
                uuid=_text(uuid),
                name=_text(name),
                pci_bus_id=parent.pci_bus_id,
                arch=parent.arch,
                mig_parent_uuid=parent.uuid,
                mig_parent_handle=parent.handle,
                mig_gpu_instance_id=instance if isinstance(instance, int) else None,
                mig_sm_count=int(sm_count) if sm_count else None,
            )
        )
    return migs
