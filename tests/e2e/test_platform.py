"""Platform adapters and the GPU row schema: every measured field is a value or absent with a reason, adapters are
chosen by the device spec, and the spark plugin installs with pip and is found through its entry point alone."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tm_runs import REPO, TM, log_records, only_run

from trainmeter_core.model.platform_adapters import (
    MEASURED_FIELDS,
    GpuReading,
    PlatformAdapter,
    ServerAdapter,
    absent_row,
    choose_adapter,
    gpu_row,
)
from trainmeter_core.model.records import SampleGpu

SPARK = REPO / "plugins" / "trainmeter-spark"


def test_a_row_holds_every_measured_field_as_a_value_or_a_reason():
    reading = GpuReading()
    reading.put("power_w", 312.5)
    reading.miss("util_gpu", "no permission")
    row = gpu_row({"index": 3, "uuid": "GPU-1"}, reading)
    assert row.power_w == 312.5 and row.absent["util_gpu"] == "no permission"
    assert row.absent["tensor_active"] == "not read"  # nobody read it: absent, never zero
    filled = {f for f in MEASURED_FIELDS if getattr(row, f) not in (None, [])}
    assert filled | set(row.absent) == set(MEASURED_FIELDS) and filled == {"power_w"}


def test_measured_fields_are_the_schema_less_header_and_identity():
    assert "tensor_active" in MEASURED_FIELDS and "gpm_window_s" in MEASURED_FIELDS
    assert not {"index", "uuid", "adapter", "fake", "t", "absent", "host"} & set(MEASURED_FIELDS)
    assert set(MEASURED_FIELDS) < set(SampleGpu.__struct_fields__)


def test_a_fraction_beyond_rounding_is_absent_and_a_hair_above_one_is_one():
    reading = GpuReading()
    reading.put("sm_active", 1.004)  # GPM's two counters divided: rounding
    reading.put("tensor_active", 7.0)  # a broken counter
    row = gpu_row({"index": 0}, reading)
    assert row.sm_active == 1.0
    assert row.tensor_active is None and row.absent["tensor_active"].startswith("out of range: 7")


def test_throttle_reasons_share_the_reason_of_their_bitmask():
    reading = GpuReading()
    reading.miss("clock_event_reasons", "not on this device")
    assert gpu_row({"index": 0}, reading).absent["throttle"] == "not on this device"


def test_an_absent_row_names_every_field_with_the_same_reason():
    row = absent_row({"index": 1, "uuid": "GPU-9"}, "GPU lost")
    assert set(row.absent) == set(MEASURED_FIELDS) and set(row.absent.values()) == {"GPU lost"}
    assert (row.index, row.uuid) == (1, "GPU-9")


def test_a_reading_refuses_a_field_the_schema_lacks():
    with pytest.raises(KeyError, match="'tensor_util' is not a measured SampleGpu field"):
        GpuReading().put("tensor_util", 0.5)


class Lab(PlatformAdapter):
    name = "lab"
    not_offered = {"pcie_tx_bps": "not on this device: no PCIe"}


def test_the_spec_names_the_adapter_and_server_is_the_default():
    adapter, warning = choose_adapter(None, {})
    assert isinstance(adapter, ServerAdapter) and warning is None
    adapter, warning = choose_adapter("lab", {"lab": Lab})
    assert isinstance(adapter, Lab) and not adapter.offers("pcie_tx_bps") and adapter.offers("power_w")
    adapter, warning = choose_adapter("spark", {"lab": Lab})
    assert isinstance(adapter, ServerAdapter) and "'spark', which no installed plugin provides" in warning


def test_no_line_of_tm_s_own_code_names_the_spark_plugin():
    # Docstrings may use it as an example; code (names, imports, strings) must not.
    for package in ("trainmeter_core", "trainmeter_sources", "trainmeter_agent", "trainmeter_web"):
        for path in (REPO / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            docstrings = {
                id(node.body[0].value)
                for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and node.body
                and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)
            }
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and id(node) not in docstrings
                ):
                    assert "spark" not in node.value.lower(), f"{path}:{node.lineno}"
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                    assert not any("spark" in n for n in names), f"{path}:{node.lineno}"


@pytest.mark.xdist_group("heavy")
def test_the_spark_plugin_installs_with_pip_its_tests_pass_and_tm_finds_it(tm_env, tmp_path):
    # A real `pip install` of the folder, into a target folder of its own (never into the shared venv).
    target = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
         str(target), str(SPARK)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    assert (target / "trainmeter_spark" / "specs" / "gb10.json").exists()
    env = dict(tm_env, PYTHONPATH=os.pathsep.join([str(target), str(REPO)]))

    listed = subprocess.run([TM, "plugins", "--json"], env=env, capture_output=True, text=True, timeout=60)
    infos = {i["name"]: i for i in map(json.loads, listed.stdout.splitlines())}
    assert infos["spark"]["distribution"] == "trainmeter-spark" and infos["spark"]["version"] == "0.1.0"
    assert infos["spark"]["provides"] == ["device_specs", "platform_adapters"]

    doctor = subprocess.run(
        [TM, "doctor"], env=dict(env, TM_FAKE_GPUS="1xGB10"), capture_output=True, text=True, timeout=60
    )
    assert doctor.returncode == 0, doctor.stdout
    assert "spec gb10" in doctor.stdout and "adapter spark" in doctor.stdout

    # Its own tests, against the installed copy (run from the tests folder, so the source tree is not on the path).
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SPARK / "tests")],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert " passed" in tests.stdout and "failed" not in tests.stdout


@pytest.mark.xdist_group("heavy")
def test_a_fake_gb10_run_reads_unified_memory_through_the_spark_adapter(tm_env, tmp_path):
    site = tmp_path / "site"
    info = site / "trainmeter_spark-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trainmeter-spark\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[trainmeter]\nspark = trainmeter_spark.plugin\n")
    env = dict(
        tm_env,
        PYTHONPATH=os.pathsep.join([str(site), str(SPARK)]),
        TM_FAKE_GPUS="1xGB10",
        TM_GPU_INTERVAL_S="0.1",
    )
    wait = (
        "import glob, os, time\n"
        "end = time.monotonic() + 60\n"
        "while time.monotonic() < end and sum(open(p).read().count('sample.gpu') "
        "for p in glob.glob(os.environ['TM_RUN_DIR'] + '/events-*.jsonl')) < 2: time.sleep(0.05)\n"
    )
    result = subprocess.run(
        [TM, "--no-agent", "--", sys.executable, "-c", wait],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    records = log_records(only_run(tmp_path / "runs"))
    rows = [r for r in records if r["kind"] == "sample.gpu"]
    assert rows and all(r["adapter"] == "spark" and r["spec_id"] == "gb10" for r in rows)
    meminfo_total_b = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    assert rows[-1]["mem_total_b"] == meminfo_total_b  # the machine's memory, not NVML's (which has none)
    assert rows[-1]["absent"]["pcie_tx_bps"].startswith("not on this device")  # even where GPM could give it
    fact = next(r for r in records if r["kind"] == "fact" and r["name"] == "gpu")
    assert fact["value"]["dense_bf16_flop_per_s"] is None and "no dense BF16" in fact["value"]["peak_absent"]
