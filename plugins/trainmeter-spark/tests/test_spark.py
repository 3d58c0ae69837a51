"""The spark plugin: GB10 memory from /proc/meminfo, the fields a GB10 lacks absent with their reason, a GB10 spec
without a dense peak, and tm finding it all through the entry point alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from trainmeter_spark import plugin
from trainmeter_spark.adapter import SparkAdapter, unified_memory_b

from trainmeter_core.model.device_specs import dense_peak_flop_per_s, match_spec
from trainmeter_core.model.platform_adapters import GpuReading, choose_adapter, gpu_row
from trainmeter_core.plugins import Plugins
from trainmeter_core.run.specstore import load_specs

PLUGIN_ROOT = Path(__file__).resolve().parent.parent
MEMINFO = "MemTotal:       131072000 kB\nMemFree:         90000000 kB\nMemAvailable:   100000000 kB\n"


def adapter_reading(tmp_path, text=MEMINFO):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(text)
    adapter = SparkAdapter()
    adapter.meminfo_path = str(meminfo)
    reading = GpuReading()
    for field, reason in adapter.not_offered.items():
        reading.miss(field, reason)
    reading.miss("mem_used_b", "not on this device")  # what NVML itself answers on a GB10
    reading.miss("mem_total_b", "not on this device")
    adapter.adapt(reading)
    return reading


def test_unified_memory_comes_from_meminfo(tmp_path):
    reading = adapter_reading(tmp_path)
    # total 131072000 KiB x 1024 = 134217728000 B; used (131072000 - 100000000) KiB x 1024 = 31817728000 B
    assert reading.values["mem_total_b"] == 134_217_728_000
    assert reading.values["mem_used_b"] == 31_817_728_000
    assert "mem_used_b" not in reading.absent


def test_unreadable_meminfo_leaves_memory_absent_with_the_reason(tmp_path):
    reading = adapter_reading(tmp_path, "MemTotal: 100 kB\n")
    assert "mem_total_b" not in reading.values
    assert "MemAvailable" in reading.absent["mem_used_b"]
    assert unified_memory_b(str(tmp_path / "nowhere")) is None


def test_fields_a_gb10_lacks_are_absent_not_zero(tmp_path):
    row = gpu_row({"index": 0, "name": "NVIDIA GB10", "adapter": "spark"}, adapter_reading(tmp_path))
    for field in ("clock_mem_mhz", "pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps", "nvlink_rx_bps"):
        assert getattr(row, field) is None
        assert row.absent[field].startswith("not on this device")
    assert row.mem_total_b == 134_217_728_000


def test_the_gb10_spec_validates_names_spark_and_has_no_dense_peak():
    specs = load_specs(plugin.trainmeter_device_specs())
    spec = match_spec("NVIDIA GB10", specs)
    assert spec is not None and spec.id == "gb10" and spec.adapter == "spark"
    peak_flop_per_s, reason = dense_peak_flop_per_s(spec)
    assert peak_flop_per_s is None and "no dense BF16 figure" in reason
    assert match_spec("NVIDIA GB200", specs).id != "gb10"  # \bGB10\b keeps the GB200 apart


def test_the_hooks_give_the_adapter_the_sampler_picks_by_the_specs_name():
    plugins = Plugins()
    plugins.register(plugin, name="spark")
    adapters = dict(plugins.per_plugin("trainmeter_platform_adapters"))["spark"]
    adapter, warning = choose_adapter("spark", adapters)
    assert isinstance(adapter, SparkAdapter) and warning is None


def _tm() -> str:
    here = Path(sys.executable).parent / "tm"
    return str(here) if here.exists() else shutil.which("tm")


def test_tm_finds_the_plugin_through_its_entry_point_alone(tmp_path):
    # A dist-info on the path stands in for `pip install .` (an installed copy is deduplicated by tm).
    info = tmp_path / "trainmeter_spark-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trainmeter-spark\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[trainmeter]\nspark = trainmeter_spark.plugin\n")
    path = os.pathsep.join([str(tmp_path), str(PLUGIN_ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, TM_FAKE_GPUS="1xGB10")
    listed = subprocess.run([_tm(), "plugins", "--json"], env=env, capture_output=True, text=True, timeout=60)
    infos = {i["name"]: i for i in map(json.loads, listed.stdout.splitlines())}
    assert infos["spark"]["provides"] == ["device_specs", "platform_adapters"]
    doctor = subprocess.run([_tm(), "doctor"], env=env, capture_output=True, text=True, timeout=60)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    gpu_line = next(line for line in doctor.stdout.splitlines() if "gpu0 NVIDIA GB10" in line)
    assert "spec gb10" in gpu_line and "adapter spark" in gpu_line and "no MFU" in gpu_line
