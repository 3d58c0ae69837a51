"""Which GPUs a run uses: ``--gpus`` (``TM_GPUS``), else ``CUDA_VISIBLE_DEVICES``, else the GPUs NVML lists for the
run's processes once they appear, else every GPU for the hardware view only.

Pure functions of NVML's device list, the environment and pids. It never hands every GPU of the node to MFU as the
run's own: a selection that is only the hardware view says so, and so does a container whose NVML shows host pids.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from trainmeter_sources.gpu.nvml import DeviceInfo

GPUS_ENV = "TM_GPUS"
Source = Literal["--gpus", "CUDA_VISIBLE_DEVICES", "processes", "all"]
CONTAINER_HOST_PIDS = (
    "inside a container NVML lists the host's pids, so tm cannot tell which GPUs this run uses: pass --gpus "
    "(or set CUDA_VISIBLE_DEVICES); every GPU is watched for the hardware view only, never for MFU"
)


class SelectionError(ValueError):
    """A GPU list that names no GPU of this node; the message is one line naming the entry and what exists."""


@dataclass
class Selection:
    source: Source
    devices: list[DeviceInfo]
    for_run: bool  # these are the run's GPUs; False: every GPU, for the hardware view only
    notes: list[str] = field(default_factory=list)  # one line each, warnings for the user
    waiting: bool = False  # "processes": the run has not appeared on a GPU yet
    candidates: list[DeviceInfo] = field(default_factory=list)  # "processes": where the run may still appear

    def describe(self) -> str:
        labels = ", ".join(d.label for d in self.devices) or "none"
        if self.source == "processes" and self.waiting:
            return f"watching every GPU ({labels}) until the run's processes appear on one"
        if not self.for_run:
            return f"watching every GPU ({labels}) for the hardware view only"
        return f"watching {labels} (from {self.source})"


def _all_units(devices: Iterable[DeviceInfo]) -> list[DeviceInfo]:
    units = []
    for device in devices:
        units.append(device)
        units.extend(device.migs)
    return units


def resolve(entry: str, devices: list[DeviceInfo], what: str) -> DeviceInfo:
    """One entry of a GPU list: an NVML index, a GPU UUID or a MIG UUID (a unique prefix is enough)."""
    text = entry.strip()
    if text.isdigit():
        for device in devices:
            if device.index == int(text):
                return device
        known = f"0..{len(devices) - 1}" if devices else "none"
        raise SelectionError(f"{what}: no GPU {text} on this node (NVML lists GPUs {known})")
    matches = [d for d in _all_units(devices) if d.uuid and d.uuid.lower().startswith(text.lower())]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise SelectionError(
            f"{what}: {text!r} is neither a GPU index nor the UUID of a GPU or MIG device here "
            "(nvidia-smi -L lists them)"
        )
    raise SelectionError(f"{what}: {text!r} matches {len(matches)} devices: give more of the UUID")


def parse_list(text: str, devices: list[DeviceInfo], what: str) -> list[DeviceInfo]:
    chosen: list[DeviceInfo] = []
    for entry in text.split(","):
        if not entry.strip():
            continue
        device = resolve(entry, devices, what)
        if device not in chosen:
            chosen.append(device)
    if not chosen:
        raise SelectionError(f"{what}: empty; give GPU indices or UUIDs, e.g. 0,1")
    return chosen


def from_cuda_visible(
    value: str, order: str | None, devices: list[DeviceInfo]
) -> tuple[list[DeviceInfo], list[str]]:
    """The devices ``CUDA_VISIBLE_DEVICES`` shows CUDA, and warnings.

    As CUDA reads it: entries up to the first invalid one count (the CUDA C Programming Guide, "CUDA Environment
    Variables"); an index is a CUDA ordinal, which matches NVML's numbering only under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
    """
    notes: list[str] = []
    chosen: list[DeviceInfo] = []
    by_index = False
    for entry in value.split(","):
        entry = entry.strip()
        if entry.startswith("MIG-GPU-"):  # the pre-R470 form MIG-GPU-<uuid>/<gi>/<ci>
            entry = entry.removeprefix("MIG-").split("/")[0]
        try:
            device = resolve(entry, devices, "CUDA_VISIBLE_DEVICES")
        except SelectionError:
            if entry:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES={value}: {entry!r} is no GPU here, and CUDA ignores it and every "
                    "entry after it"
                )
            break
        by_index = by_index or entry.isdigit()
        if device not in chosen:
            chosen.append(device)
    if by_index and (order or "").upper() != "PCI_BUS_ID":
        notes.append(
            f"CUDA_VISIBLE_DEVICES={value} names GPUs by index, and without CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA may "
            "number them differently from NVML: set CUDA_DEVICE_ORDER=PCI_BUS_ID or use UUIDs (nvidia-smi -L)"
        )
    return chosen, notes


def select(devices: list[DeviceInfo], environ: Mapping[str, str]) -> Selection:
    """The first rule that applies: ``TM_GPUS``, ``CUDA_VISIBLE_DEVICES``, else wait for the run's processes.

    Raises :class:`SelectionError` only for ``TM_GPUS``, which the user typed; a ``CUDA_VISIBLE_DEVICES`` that names
    nothing here falls through to the next rule with a note.
    """
    flag = environ.get(GPUS_ENV, "").strip()
    if flag:
        return Selection("--gpus", parse_list(flag, devices, "--gpus"), for_run=True)
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        chosen, notes = from_cuda_visible(visible, environ.get("CUDA_DEVICE_ORDER"), devices)
        if chosen:
            return Selection("CUDA_VISIBLE_DEVICES", chosen, for_run=True, notes=notes)
        notes.append(
            f"CUDA_VISIBLE_DEVICES={visible!r} shows the run no GPU: every GPU is watched for the hardware view only"
        )
        return Selection("all", list(devices), for_run=False, notes=notes)
    return Selection("processes", list(devices), for_run=False, waiting=True, candidates=list(devices))


def narrow_to_processes(
    selection: Selection,
    gpu_pids: Mapping[str, Iterable[int]],
    run_pids: set[int],
    in_container: bool,
) -> tuple[Selection, str | None]:
    """Once the run's processes show up in NVML's process lists, the selection becomes their GPUs.

    ``gpu_pids`` maps a device label to the pids NVML lists on it. Returns the new selection and a note when it
    changed (or when the pids can only be the host's, inside a container).
    """
    if selection.source != "processes":
        return selection, None
    current = set() if selection.waiting else {d.label for d in selection.devices}
    used = [
        d for d in selection.candidates if d.label in current or run_pids & set(gpu_pids.get(d.label, ()))
    ]
    if used and (selection.waiting or len(used) != len(selection.devices)):
        narrowed = Selection(
            "processes", used, for_run=True, notes=list(selection.notes), candidates=selection.candidates
        )
        return narrowed, narrowed.describe() + ", the GPUs NVML lists for the run's processes"
    if used:
        return selection, None
    listed = {pid for pids in gpu_pids.values() for pid in pids}
    if in_container and listed and not (listed & run_pids) and CONTAINER_HOST_PIDS not in selection.notes:
        selection.notes.append(CONTAINER_HOST_PIDS)
        return selection, CONTAINER_HOST_PIDS
    return selection, None


def in_container(proc: str = "/proc", root: str = "/") -> bool:
    """Whether this process runs in a container, whose pid namespace hides the host pids NVML reports."""
    for marker in (".dockerenv", "run/.containerenv"):
        if os.path.exists(os.path.join(root, marker)):
            return True
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return True
    try:
        with open(os.path.join(proc, "1", "cgroup"), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return False
    return any(word in text for word in ("docker", "kubepods", "containerd", "libpod", "lxc"))
