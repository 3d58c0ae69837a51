"""The GPU sampler: a bus component in a process of its own (an NVML call can hang), publishing one ``gpu`` fact per
GPU at start and one ``sample.gpu`` row per GPU per interval (``TM_GPU_INTERVAL_S``, default 1 s).

NVML is initialised once per process, never per sample. Nothing here raises into the run: without NVML it publishes
one row whose fields are all absent with the reason, says what would fix it, and waits for the run to end.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainmeter_core.bus.client import HOSTNAME
from trainmeter_core.bus.component import Component, ComponentContext
from trainmeter_core.bus.proctree import ProcessTree, read_environ
from trainmeter_core.model import records
from trainmeter_core.model.device_specs import DeviceSpec
from trainmeter_core.model.platform_adapters import (
    PROFILER_ATTACHED,
    PlatformAdapter,
    absent_row,
    choose_adapter,
)
from trainmeter_sources.gpu.device_sampler import DeviceSampler
from trainmeter_sources.gpu.facts import gpu_fact, gpu_fact_value, plugin_spec_paths, read_specs, spec_adapter
from trainmeter_sources.gpu.nvml import DeviceInfo, Nvml, NvmlUnavailable, handle_key, list_devices
from trainmeter_sources.gpu.selection import (
    Selection,
    SelectionError,
    in_container,
    narrow_to_processes,
    select,
)
from trainmeter_sources.profilers import find_profiler
from trainmeter_sources.sampling_interval import interval_from_env

INTERVAL_ENV = "TM_GPU_INTERVAL_S"
# Where a run's own environment decides which GPUs it sees; read from the training process when tm can.
_RUN_ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
_PROBE_OTHERS_EVERY = 5  # samples between looks at GPUs the run has not used yet
# Why a row's other_pids is absent (tm cannot tell whether another process uses the GPU): the run's energy on such a
# GPU carries it in a note, not as its absence.
NO_RUN_PIDS = "tm does not know the run's processes"
HOST_PIDS = "inside a container NVML lists the host's pids"


def plugin_adapters(plugins: Any) -> dict[str, type[PlatformAdapter]]:
    """Adapters by name from every plugin's ``trainmeter_platform_adapters``; the first to name one wins."""
    adapters: dict[str, type[PlatformAdapter]] = {}
    for _name, result in plugins.per_plugin("trainmeter_platform_adapters"):
        for adapter_name, cls in dict(result).items():
            adapters.setdefault(adapter_name, cls)
    return adapters


def no_nvml_row(reason: str) -> records.SampleGpu:
    """The one row a node without NVML gets: every field absent with the reason (index 0 is a placeholder)."""
    row = absent_row({"index": 0}, reason)
    row.absent.update(index=reason, uuid=reason, name=reason)
    return row


class XidWatch:
    """Xid events of the watched GPUs through one NVML event set, read without waiting at each sample."""

    def __init__(self, nvml: Nvml, devices: Sequence[DeviceInfo]) -> None:
        self.nvml = nvml
        self.reasons: dict[str, str] = {}
        self._labels: dict[int, str] = {}
        self.event_set, reason = nvml.call("nvmlEventSetCreate")
        xid_type = nvml.constant("nvmlEventTypeXidCriticalError", 0x8)
        for device in devices:
            parent = device.mig_parent_handle if device.is_mig else device.handle
            if reason is not None or parent is None:
                self.reasons[device.label] = reason or "GPU not readable"
                continue
            _, failed = nvml.call("nvmlDeviceRegisterEvents", parent, xid_type, self.event_set)
            if failed is not None:
                self.reasons[device.label] = failed
                continue
            key = handle_key(parent)
            if key is not None:
                self._labels.setdefault(key, device.label)

    def poll(self) -> dict[str, list[int]]:
        """Xids by device label since the previous poll (NVML's wait with a zero timeout returns at once)."""
        seen: dict[str, list[int]] = {}
        if self.event_set is None:
            return seen
        for _ in range(256):  # a storm of events must not hold the sample up
            event, reason = self.nvml.call("nvmlEventSetWait", self.event_set, 0)
            if reason is not None or event is None:
                break
            label = self._labels.get(handle_key(event.device))
            if label is not None and event.eventType == self.nvml.constant(
                "nvmlEventTypeXidCriticalError", 0x8
            ):
                seen.setdefault(label, []).append(int(event.eventData))
        return seen

    def close(self) -> None:
        if self.event_set is not None:
            self.nvml.call("nvmlEventSetFree", self.event_set)
            self.event_set = None


class GpuSession:
    """NVML opened, the GPUs chosen, one :class:`DeviceSampler` each; :meth:`sample` once per interval."""

    def __init__(
        self,
        nvml: Nvml,
        devices: list[DeviceInfo],
        selection: Selection,
        specs: Sequence[DeviceSpec],
        specs_error: str | None,
        adapters: Mapping[str, type[PlatformAdapter]],
        host: str = HOSTNAME,
    ) -> None:
        self.nvml = nvml
        self.devices = devices
        self.selection = selection
        self.specs = specs
        self.specs_error = specs_error
        self.adapters = adapters
        self.host = host
        self.notes: list[str] = list(selection.notes)
        self.samplers: dict[str, DeviceSampler] = {}
        self.fact_values: dict[str, dict] = {}
        self.samples = 0
        watched = self._watched()
        for device in watched:
            self._sampler(device)
        self.xids = XidWatch(nvml, watched)

    @classmethod
    def open(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        spec_paths: Sequence[Path] = (),
        adapters: Mapping[str, type[PlatformAdapter]] | None = None,
        host: str = HOSTNAME,
    ) -> GpuSession:
        """Open NVML and choose the GPUs; raises :class:`NvmlUnavailable` (no NVML) or :class:`SelectionError`."""
        env = os.environ if environ is None else environ
        nvml = Nvml.open(env)
        devices, reason = list_devices(nvml)
        if reason is not None:
            raise NvmlUnavailable(reason, f"NVML could not count the GPUs: {reason}")
        specs, specs_error = read_specs(spec_paths)
        return cls(nvml, devices, select(devices, env), specs, specs_error, adapters or {}, host)

    def _watched(self) -> list[DeviceInfo]:
        seen: dict[str, DeviceInfo] = {}
        for device in [*self.selection.devices, *self.selection.candidates]:
            seen.setdefault(device.label, device)
        return list(seen.values())

    def _sampler(self, device: DeviceInfo) -> DeviceSampler:
        sampler = self.samplers.get(device.label)
        if sampler is not None:
            return sampler
        value = gpu_fact_value(device, self.specs, self.nvml.fake, self.specs_error)
        adapter, warning = choose_adapter(spec_adapter(device, self.specs), self.adapters)
        if warning:
            self.notes.append(f"{device.label}: {warning}")
        identity = {
            "index": device.index,
            "uuid": device.uuid,
            "name": device.name,
            "pci_bus_id": device.pci_bus_id,
            "fake": self.nvml.fake,
            "adapter": adapter.name,
            "spec_id": value["spec_id"],
            "mig_parent_uuid": device.mig_parent_uuid,
            "sm_count": value["sm_count"],
        }
        sampler = DeviceSampler(self.nvml, device, adapter, identity)
        self.samplers[device.label] = sampler
        self.fact_values[device.label] = value
        return sampler

    def facts(self) -> list[records.Fact]:
        """One ``gpu`` fact per watched GPU."""
        by_label = {d.label: d for d in self._watched()}
        return [gpu_fact(by_label[label], value, self.host) for label, value in self.fact_values.items()]

    def sample(self, now_t: float, paused: str | None = None) -> list[records.SampleGpu]:
        """One row per selected GPU, stamped with ``now_t`` (monotonic seconds)."""
        self.samples += 1
        xids = self.xids.poll()
        rows = []
        for device in self.selection.devices:
            label = device.label
            xid = (xids.get(label, []), self.xids.reasons.get(label))
            row = self._sampler(device).sample(now_t, paused, xid)
            row.t = now_t
            rows.append(row)
        return rows

    def follow_processes(
        self, rows: Sequence[records.SampleGpu], run_pids: set[int], container: bool
    ) -> str | None:
        """In "processes" mode, narrow the selection to the GPUs the run's processes use; a note when it changes."""
        if self.selection.source != "processes":
            return None
        gpu_pids: dict[str, list[int]] = {}
        for device, row in zip(self.selection.devices, rows, strict=False):
            gpu_pids[device.label] = [p.pid for p in row.processes]
        if self.samples % _PROBE_OTHERS_EVERY == 1:
            for device in self.selection.candidates:
                if device.label not in gpu_pids and device.handle is not None:
                    processes, _ = self.nvml.call("nvmlDeviceGetComputeRunningProcesses", device.handle)
                    gpu_pids[device.label] = [int(p.pid) for p in processes or ()]
        self.selection, note = narrow_to_processes(self.selection, gpu_pids, run_pids, container)
        return note

    def close(self) -> None:
        self.xids.close()
        for sampler in self.samplers.values():
            sampler.close()


def mark_other_processes(
    rows: Sequence[records.SampleGpu], run_pids: set[int] | None, container: bool, for_run: bool
) -> None:
    """Each row's ``other_pids``: the processes NVML lists on the GPU that are not the run's (its energy counter counts
    theirs too), or why tm cannot tell; and ``for_run``, whether the selection says these are the run's GPUs."""
    listed = {process.pid for row in rows for process in row.processes}
    why = None
    if not run_pids:
        why = NO_RUN_PIDS
    elif container and listed and not listed & run_pids:
        why = HOST_PIDS  # the pids are the host's: none can be matched to the run's
    for row in rows:
        row.for_run = for_run
        if "processes" in row.absent:
            row.absent["other_pids"] = row.absent["processes"]
        elif why is not None and row.processes:
            row.absent["other_pids"] = why
        else:
            row.other_pids = sorted(p.pid for p in row.processes if p.pid not in (run_pids or ()))


def selection_environ(child_pid: int | None) -> dict[str, str]:
    """tm's environment, with the GPU variables as the training process really has them (``tm attach`` watches a
    process that tm did not start)."""
    env = dict(os.environ)
    run_env = read_environ(child_pid) if child_pid else None
    if run_env is not None:
        for name in _RUN_ENV_NAMES:
            env.pop(name, None)
            if name in run_env:
                env[name] = run_env[name]
    return env


class GpuSampler(Component):
    """Samples the run's GPUs through NVML (``TM_FAKE_GPUS`` swaps in the fake library)."""

    name = "gpu"
    shared = False  # NVML calls can hang: the launcher gives this component a process of its own

    def run(self, ctx: ComponentContext) -> None:
        interval_s, interval_note = interval_from_env(INTERVAL_ENV, 1.0)
        if interval_note:
            ctx.publish(records.Notice(level="warning", topic="gpu", message=interval_note))
        from trainmeter_core import plugins as plugins_mod

        plugins = plugins_mod.load()
        root = ctx.child_pid
        try:
            session = GpuSession.open(
                selection_environ(root),
                spec_paths=plugin_spec_paths(plugins),
                adapters=plugin_adapters(plugins),
            )
        except NvmlUnavailable as exc:
            ctx.publish(records.Notice(level="warning", topic="gpu", message=f"no GPU data: {exc.detail}"))
            ctx.publish(no_nvml_row(exc.reason))
            ctx.stopping.wait()
            return
        except SelectionError as exc:
            ctx.publish(records.Notice(level="error", topic="gpu", message=str(exc)))
            ctx.stopping.wait()
            return
        try:
            self._loop(ctx, session, root, interval_s)
        finally:
            session.close()

    def _loop(self, ctx: ComponentContext, session: GpuSession, root: int | None, interval_s: float) -> None:
        for fact in session.facts():
            ctx.publish(fact)
        ctx.publish(records.Notice(level="info", topic="gpu.selection", message=session.selection.describe()))
        for note in session.notes:
            ctx.publish(records.Notice(level="warning", topic="gpu.selection", message=note))
        tree = ProcessTree(root) if root else None
        container = in_container()
        profiler: str | None = None
        progress = _Progress(ctx, interval_s)
        next_t = time.monotonic()
        while not ctx.stopping.is_set():
            now_t = time.monotonic()
            progress.mark(now_t)
            run_pids = set(tree.refresh()) if tree is not None else set()
            found = find_profiler(run_pids, root)
            if found != profiler:
                profiler = found
                message = (
                    f"{found} runs the training: GPM paused, its counters read '{PROFILER_ATTACHED}'"
                    if found
                    else "no profiler any more: GPM resumed"
                )
                ctx.publish(records.Notice(level="info", topic="gpu.profiler", message=message))
            rows = session.sample(now_t, PROFILER_ATTACHED if profiler else None)
            mark_other_processes(rows, run_pids, container, session.selection.for_run)
            for row in rows:
                ctx.publish(row)
            note = session.follow_processes(rows, run_pids, container)
            if note:
                ctx.publish(records.Notice(level="info", topic="gpu.selection", message=note))
            next_t += interval_s
            if next_t < time.monotonic():  # a slow sample: skip the missed beats instead of bursting
                next_t = time.monotonic() + interval_s
            ctx.stopping.wait(max(0.0, next_t - time.monotonic()))
        progress.stop()


class _Progress:
    """Says once on the bus when a sample takes far longer than it should (an NVML call that hangs)."""

    def __init__(self, ctx: ComponentContext, interval_s: float) -> None:
        self.ctx = ctx
        self.limit_s = max(30.0, 20 * interval_s)
        self.last_t = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tm-gpu-watchdog", daemon=True)
        self._thread.start()

    def mark(self, now_t: float) -> None:
        self.last_t = now_t

    def stop(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        said = False
        while not self._done.wait(self.limit_s / 4):
            stuck_s = time.monotonic() - self.last_t
            if stuck_s > self.limit_s and not said:
                said = True
                self.ctx.publish(
                    records.Notice(
                        level="error",
                        topic="gpu",
                        message=f"no GPU sample for {stuck_s:.0f} s: an NVML call hangs (check nvidia-smi)",
                    )
                )
            elif stuck_s <= self.limit_s:
                said = False
