"""``tm doctor [--python PATH] [--gpus LIST]``: what tm can see on this node, one ``[ok]``, ``[warn]`` or ``[FAIL]``
line per thing: NVML and the driver, each GPU with its spec, dense peak and adapter, a live GPM read, the plugins,
and whether the agent can join a given interpreter (and the command that fixes it when it cannot).

It reads and probes only; it installs nothing and changes nothing. Exit 0 unless something the user asked for
cannot work: a node without GPUs is a warning, not a failure.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from trainmeter_core.model.platform_adapters import choose_adapter
from trainmeter_core.run.child import agent_boot_dir
from trainmeter_sources.gpu.facts import gpu_fact_value, plugin_spec_paths, read_specs, spec_adapter
from trainmeter_sources.gpu.gpm import GpmReader
from trainmeter_sources.gpu.nvml import FAKE_ENV, INSTALL_HINT, Nvml, NvmlUnavailable, list_devices
from trainmeter_sources.gpu.sampler import plugin_adapters
from trainmeter_sources.gpu.selection import GPUS_ENV, SelectionError, select

GPM_PROBE_S = 0.1
AGENT_MODULES = {"trainmeter_agent": "trainmeter", "msgspec": "msgspec", "zmq": "pyzmq"}
# Run by the interpreter under test, with the PYTHONPATH tm would give it: what it lacks to load the agent.
_PROBE = """
import importlib.util, json, os, sys, sysconfig
missing = []
for name in %r:
    try:
        found = importlib.util.find_spec(name) is not None
    except Exception:
        found = False
    if not found:
        missing.append(name)
stdlib = sysconfig.get_paths().get("stdlib") or ""
print(json.dumps({
    "version": list(sys.version_info[:3]),
    "missing": missing,
    "pip": importlib.util.find_spec("pip") is not None,
    "managed": os.path.exists(os.path.join(stdlib, "EXTERNALLY-MANAGED")) and sys.prefix == sys.base_prefix,
}))
"""


class Report:
    """The doctor's lines and its exit status."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self.status = 0

    def ok(self, text: str) -> None:
        self.write(f"[ok]   {text}")

    def warn(self, text: str) -> None:
        self.write(f"[warn] {text}")

    def fail(self, text: str) -> None:
        self.status = 1
        self.write(f"[FAIL] {text}")


class DoctorCommand:
    name = "doctor"
    help = "what tm can see on this node: NVML, GPM per GPU, device specs and adapters, plugins, the agent"

    def add_arguments(self, parser) -> None:
        parser.add_argument("--python", metavar="PATH", help="check that the agent can join this interpreter")
        parser.add_argument(
            "--gpus", metavar="LIST", help="GPU indices or UUIDs to check, as tm --gpus takes them"
        )

    def run(self, args) -> int:
        return doctor(python=args.python, gpus=args.gpus, write=_print)


def _print(text: str) -> None:
    try:
        print(text, flush=True)
    except BrokenPipeError:
        pass


def doctor(
    python: str | None = None,
    gpus: str | None = None,
    environ: Mapping[str, str] | None = None,
    write: Callable[[str], None] = _print,
) -> int:
    from trainmeter_core import plugins as plugins_mod

    env = dict(os.environ if environ is None else environ)
    report = Report(write)
    plugins = plugins_mod.load()
    check_gpus(report, env, gpus, plugins)
    check_plugins(report, plugins)
    check_agent(report, python)
    return report.status


# -- GPUs -----------------------------------------------------------------------------------------------------------


def check_gpus(report: Report, env: dict[str, str], gpus: str | None, plugins) -> None:
    try:
        nvml = Nvml.open(env)
    except NvmlUnavailable as exc:
        _no_nvml(report, exc, env)
        if gpus:
            report.fail(f"--gpus {gpus}: no GPU can be watched on this node without NVML")
        return
    versions = nvml.versions()
    fake = f" (fake GPUs from {FAKE_ENV}={env.get(FAKE_ENV)}: not real hardware)" if nvml.fake else ""
    report.ok(f"NVML {versions['nvml'] or '?'}, driver {versions['driver'] or '?'}{fake}")
    devices, reason = list_devices(nvml)
    if reason is not None or not devices:
        report.warn(f"NVML lists no GPU here{f' ({reason})' if reason else ''}: no GPU data")
        if gpus:
            report.fail(f"--gpus {gpus}: NVML lists no GPU on this node")
        return
    if gpus:
        env[GPUS_ENV] = gpus
    try:
        selection = select(devices, env)
    except SelectionError as exc:
        report.fail(str(exc))
        return
    report.ok(selection.describe())
    for note in selection.notes:
        report.warn(note)
    specs, specs_error = read_specs(plugin_spec_paths(plugins))
    if specs_error:
        report.warn(specs_error)
    adapters = plugin_adapters(plugins)
    tag = " (fake)" if nvml.fake else ""
    for device in selection.devices:
        head = f"{device.label} {device.name or '?'}{tag} {device.uuid or ''}".rstrip()
        if device.error is not None or device.handle is None:
            report.warn(f"{head}: cannot be read ({device.error})")
            continue
        value = gpu_fact_value(device, specs, nvml.fake, specs_error)
        adapter, adapter_warning = choose_adapter(spec_adapter(device, specs), adapters)
        if value["spec_id"] is None:
            report.warn(f"{head}: {value['peak_absent']}; adapter {adapter.name}")
        elif value["dense_bf16_flop_per_s"] is None:
            report.warn(
                f"{head}: spec {value['spec_id']} ({value['display_name']}), {value['peak_absent']}: no MFU; "
                f"adapter {adapter.name}"
            )
        else:
            report.ok(
                f"{head}: spec {value['spec_id']} ({value['display_name']}), dense BF16 "
                f"{value['dense_bf16_flop_per_s'] / 1e12:g} TFLOPS from {value['peak_source']}, adapter {adapter.name}"
            )
        if adapter_warning:
            report.warn(f"{device.label}: {adapter_warning}")
        _check_gpm(report, nvml, device, value)


def _check_gpm(report: Report, nvml: Nvml, device, value: dict) -> None:
    from trainmeter_core.model.platform_adapters import GpuReading

    reader = GpmReader(nvml, device)
    try:
        first = GpuReading()
        reader.read(first, time.monotonic())
        time.sleep(GPM_PROBE_S)
        second = GpuReading()
        reader.read(second, time.monotonic())
    finally:
        reader.close()
    values = second.values
    if "tensor_active" in values:
        clock_note = "" if value["tensor_clock_mhz"] else " (no tensor clock in the spec, so no OFU)"
        report.ok(
            f"{device.label} GPM: SM active {values.get('sm_active', 0) * 100:.1f}%, tensor active "
            f"{values['tensor_active'] * 100:.1f}%, DRAM active {values.get('dram_active', 0) * 100:.1f}% over "
            f"{values['gpm_window_s']:.2f} s{clock_note}"
        )
        return
    reason = second.absent.get("tensor_active") or first.absent.get("tensor_active") or "unknown"
    advice = {
        "GPM blocked by the provider": "the cloud's virtual GPU refuses GPM: no OFU (a bare-metal or full-GPU "
        "instance has it)",
    }.get(reason, "no OFU, SM or tensor activity for this GPU")
    report.warn(f"{device.label} GPM: {reason}: {advice}")


def _no_nvml(report: Report, exc: NvmlUnavailable, env: Mapping[str, str]) -> None:
    """One line per reason there is no GPU data, each with what would give it."""
    if env.get(FAKE_ENV, "").strip():
        report.warn(f"no GPU data: {exc.detail}")
        return
    try:
        import pynvml  # noqa: F401
    except ImportError:
        report.warn(f"no GPU data: nvidia-ml-py is not installed for {sys.executable}: {INSTALL_HINT}")
        if not _driver_library():
            report.warn(
                "no GPU data: no NVIDIA driver on this node (libnvidia-ml.so.1 not found): run on a node with an "
                f"NVIDIA GPU and its driver (to try tm without one: {FAKE_ENV}=8xH100 tm doctor)"
            )
        return
    report.warn(f"no GPU data: {exc.detail}")


def _driver_library() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


# -- plugins --------------------------------------------------------------------------------------------------------


def check_plugins(report: Report, plugins) -> None:
    for info in plugins.infos:
        dist = f"{info.distribution or '?'} {info.version or ''}".strip()
        if info.error:
            report.warn(f"plugin {info.name} ({dist}) not loaded: {info.error}")
        else:
            report.ok(f"plugin {info.name} ({dist}): {', '.join(info.provides) or 'nothing'}")
    adapters = ["server", *sorted(set(plugin_adapters(plugins)) - {"server"})]
    report.ok(f"platform adapters: {', '.join(adapters)}")


# -- the agent ------------------------------------------------------------------------------------------------------


def project_source() -> str:
    """What to ``pip install`` to get this trainmeter: its source folder when tm runs from one, else its name."""
    root = Path(__file__).resolve().parent.parent
    return str(root) if (root / "pyproject.toml").exists() else "trainmeter"


def check_agent(report: Report, python: str | None) -> None:
    asked = python is not None
    interpreter = python or sys.executable
    env = dict(os.environ)
    boot = agent_boot_dir()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(boot), env.get("PYTHONPATH", "")) if p)
    env["TM_AGENT"] = "0"  # the probe must not start an agent of its own
    say = report.fail if asked else report.warn
    try:
        result = subprocess.run(
            [interpreter, "-c", _PROBE % (tuple(AGENT_MODULES),)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",  # `-c` puts the current folder on sys.path; a training script would not see it
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        say(
            f"agent: {interpreter} cannot be run ({exc}): pass --python with the interpreter your training uses"
        )
        return
    try:
        probe = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        say(
            f"agent: {interpreter} is not a Python tm can probe ({result.stderr.strip()[-200:] or 'no output'})"
        )
        return
    version = ".".join(str(v) for v in probe["version"])
    if tuple(probe["version"][:2]) < (3, 10):
        say(
            f"agent: {interpreter} is Python {version}; the agent needs 3.10 or newer: run the training with one"
        )
        return
    missing = [AGENT_MODULES[m] for m in probe["missing"]]
    if not missing:
        report.ok(f"agent: can join {interpreter} (Python {version})")
        return
    # Installing trainmeter brings msgspec and pyzmq; without it missing only they need installing.
    target = project_source() if "trainmeter" in missing else " ".join(missing)
    command = f"{interpreter} -m pip install {target}"
    pip_note = "" if probe["pip"] else " (it has no pip: install python3-pip, or use a venv)"
    say(
        f"agent: cannot join {interpreter} (Python {version}): it lacks {', '.join(missing)}; fix: {command}{pip_note}"
    )
    if probe["managed"]:
        report.warn(
            f"agent: {interpreter} is externally managed (PEP 668), so pip may refuse; a venv works: "
            f"{interpreter} -m venv ~/.venvs/tm && ~/.venvs/tm/bin/python -m pip install {project_source()}, "
            "then train with ~/.venvs/tm/bin/python"
        )
