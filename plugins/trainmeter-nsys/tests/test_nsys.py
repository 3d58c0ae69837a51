"""The Nsight Systems importer on small exports built here with the schema NVIDIA documents, and as an installed
plugin: tm plugins lists it and tm import reads an export with it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from trainmeter_nsys.importer import NsysImporter

PLUGIN = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TM = str(BIN / "tm")
SESSION_NS = 1_767_225_600_000_000_000  # 2026-01-01 00:00:00 UTC
PID = 4242
GLOBAL_PID = PID << 24  # pid in bits 24-47


def export(path: Path, steps: bool = True, session: bool = True) -> Path:
    """Two NVTX steps of 10 ms each; step 1: GEMM 1-5 ms and NCCL 4-8 ms; step 2: a 1 MB copy 11-12 ms and an
    elementwise kernel 13-18 ms; each launched 0.5 ms before by a runtime call (ids 1-4)."""
    ms = 1_000_000
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL,
            contextId INT, streamId INT NOT NULL, correlationId INT, globalPid INT, demangledName INT NOT NULL,
            shortName INT NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL,
            contextId INT, streamId INT NOT NULL, correlationId INT, globalPid INT, bytes INT NOT NULL,
            copyKind INT NOT NULL, srcKind INT, dstKind INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT NOT NULL, end INT NOT NULL, eventClass INT,
            globalTid INT, correlationId INT, nameId INT);
        CREATE TABLE NVTX_EVENTS (start INT NOT NULL, end INT, eventType INT NOT NULL, rangeId INT, category INT,
            color INT, text TEXT, globalTid INT, endGlobalTid INT, textId INT, domainId INT);
        CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INT, utcTime TEXT, localTime TEXT);
        CREATE TABLE TARGET_INFO_SYSTEM_ENV (globalVid INT, devStateName TEXT, name TEXT, nameEnum INT, value TEXT);
        """
    )
    db.executemany(
        "INSERT INTO StringIds VALUES (?, ?)",
        [
            (1, "sm90_xmma_gemm_bf16bf16_bf16f32"),
            (2, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"),
            (3, "elementwise_kernel"),
            (4, "cudaLaunchKernel"),
            (5, "step 1"),
        ],
    )
    kernels = [(1, 5, 7, 1, 1), (4, 8, 20, 2, 2), (13, 18, 7, 4, 3)]
    db.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 1, ?, ?, ?, ?, ?)",
        [(s * ms, e * ms, stream, corr, GLOBAL_PID, name, name) for s, e, stream, corr, name in kernels],
    )
    db.execute(
        "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, 0, 1, 7, 3, ?, 1048576, 8, 0, 0)",
        (11 * ms, 12 * ms, GLOBAL_PID),
    )
    db.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, 4)",
        [
            (int((s - 0.5) * ms), int((s - 0.4) * ms), GLOBAL_PID + 1, corr)
            for s, corr in ((1, 1), (4, 2), (11, 3), (13, 4))
        ],
    )
    if steps:
        db.execute(
            "INSERT INTO NVTX_EVENTS VALUES (0, ?, 59, 0, 0, 0, NULL, ?, ?, 5, 0)",
            (10 * ms, GLOBAL_PID + 1, GLOBAL_PID + 1),
        )
        db.execute(
            "INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, 0, 0, 0, 'step 2', ?, ?, NULL, 0)",
            (10 * ms, 20 * ms, GLOBAL_PID + 1, GLOBAL_PID + 1),
        )
    if session:
        db.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (SESSION_NS,))
    db.execute("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (0, '', 'Hostname', 0, 'gpu-node-1')")
    db.commit()
    db.close()
    return path


def test_it_reads_an_export_and_no_other_file(tmp_path):
    importer = NsysImporter()
    assert importer.can_read(export(tmp_path / "report.sqlite"))
    (tmp_path / "trace.json").write_text("{}")
    assert not importer.can_read(tmp_path / "trace.json")
    other = sqlite3.connect(tmp_path / "other.sqlite")
    other.execute("CREATE TABLE t (x)")
    other.close()
    assert not importer.can_read(tmp_path / "other.sqlite")


def test_nvtx_steps_become_windows_split_as_tm_splits_them(tmp_path):
    step1, step2, trace = NsysImporter().read(export(tmp_path / "report.sqlite"), {})
    ms = 1e-3
    # Step 1 (0-10 ms): GEMM 1-5 (4 ms), NCCL 4-8 of which 5-8 is exposed (3 ms), idle 0-1 and 8-10 (3 ms).
    assert (step1.profiler_step, step1.window_s) == (1, pytest.approx(10 * ms))
    assert step1.split_s["gemm"] == pytest.approx(4 * ms) and step1.split_s["communication"] == pytest.approx(
        3 * ms
    )
    assert step1.split_s["idle"] == pytest.approx(3 * ms)
    assert step1.overlap_s["communication_compute"] == pytest.approx(1 * ms)
    # Step 2 (10-20 ms): the copy 11-12 (1 ms), elementwise 13-18 (5 ms), idle 4 ms.
    assert step2.split_s["memory"] == pytest.approx(1 * ms) and step2.split_s[
        "other_compute"
    ] == pytest.approx(5 * ms)
    assert step2.split_s["idle"] == pytest.approx(4 * ms)
    # On the run's clock: the session started at 2026-01-01 00:00:00 UTC.
    assert step2.window_end_wall == pytest.approx(SESSION_NS / 1e9 + 20 * ms)
    assert (trace.host, trace.traced_pid, trace.device) == ("gpu-node-1", PID, "gpu-node-1/gpu0")
    copy = next(k for k in trace.top_kernels if k.category == "memory")
    assert (copy.name, copy.moved_b) == ("Memcpy DtoD", 1048576)
    # HTA's rules keep the work launched before the last step began (step 1's two kernels): span 1-8 ms, of which
    # computation alone 1-4, both 4-5, communication alone 5-8.
    hta = trace.hta
    assert hta.last_step_dropped and hta.kernels == 2 and hta.span_s == pytest.approx(7 * ms)
    assert hta.kernel_type_s == pytest.approx(
        {"COMPUTATION": 3 * ms, "COMPUTATION overlapping COMMUNICATION": 1 * ms, "COMMUNICATION": 3 * ms}
    )


def test_without_step_ranges_the_capture_is_one_window(tmp_path):
    (trace,) = NsysImporter().read(export(tmp_path / "report.sqlite", steps=False), {})
    assert trace.window_s == pytest.approx(17e-3)  # the first kernel's start (1 ms) to the last's end (18 ms)
    assert trace.notes == ["no NVTX step range: the whole capture is one window"]


def test_an_export_without_a_session_start_says_why_it_cannot_be_aligned(tmp_path):
    step1, _, _ = NsysImporter().read(export(tmp_path / "report.sqlite", session=False), {})
    assert step1.window_start_wall is None and "TARGET_INFO_SESSION_START_TIME" in step1.absent["step"]


def test_a_damaged_export_is_refused_with_one_line(tmp_path):
    path = export(tmp_path / "report.sqlite")
    data = bytearray(path.read_bytes())
    data[4096:8192] = b"\xff" * 4096
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError) as refused:
        list(NsysImporter().read(path, {}))
    assert "\n" not in str(refused.value)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The plugin installed from its folder with pip, into a folder of this test's own (put on tm's path)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(PLUGIN),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return target


def test_installed_tm_plugins_lists_it_and_tm_import_reads_an_export(site, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TM_", "LOCAL_RANK"))}
    env.update(PYTHONPATH=str(site), TM_RUNS_DIR=str(tmp_path / "runs"), OMP_NUM_THREADS="1")
    listed = subprocess.run([TM, "plugins"], env=env, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "nsys" in listed.stdout and "profiler_importers" in listed.stdout, (
        listed.stdout
    )
    done = subprocess.run(
        [TM, "--no-web", "-q", "--", "python", "-c", "pass"], env=env, capture_output=True, timeout=120
    )
    assert done.returncode == 0
    (run,) = (tmp_path / "runs").iterdir()
    report = export(tmp_path / "report.sqlite")
    refused = subprocess.run(
        [TM, "import", str(run), str(report)], env=env, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2 and "recorded on gpu-node-1" in refused.stderr
    imported = subprocess.run(
        [TM, "import", str(run), str(report), "--force"], env=env, capture_output=True, text=True, timeout=60
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith("process ProfilerStep#1-2: 20.0 ms:")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["snapshot"]["profile"]["traces"][0]["importer"] == "nsys"
