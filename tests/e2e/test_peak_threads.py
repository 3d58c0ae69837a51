"""A 1-thread training script (examples/tiny_gpt.py sets one thread) on a machine where ``tm peak`` stored peaks for
1 and 2 threads: the run is scored against the 1-thread peak, whichever was stored last; with only a 2-thread peak
its MFU is absent and names the command that measures the right one."""

from __future__ import annotations

import json
import re
import socket

from tm_runs import REPO, only_run, run_tm
from torch_required import require_torch

HOST = socket.gethostname()


def peak(threads: int, flop_per_s: float) -> dict:
    return {
        "host": HOST, "device": f"{HOST}/cpu", "device_type": "cpu", "dtype": "float32", "threads": threads,
        "flop_per_s": flop_per_s, "spread_flop_per_s": 1e8, "measured_wall": 1_796_000_000.0,
        "source": f"tm peak: a test's {threads}-thread figure, measured 2026-11-30 00:53 UTC",
    }  # fmt: skip


def tiny_run(tm_env, tmp_path, peaks: list[dict]) -> tuple[dict, str]:
    require_torch()
    (tmp_path / "peaks.json").write_text(json.dumps(peaks))
    env = dict(tm_env, TM_PEAKS_FILE=str(tmp_path / "peaks.json"))
    args = ["--no-web", "--convention", "titan", str(REPO / "examples" / "tiny_gpt.py"), "--steps", "20"]
    result = run_tm(args, env, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads((only_run(tmp_path / "runs") / "summary.json").read_text())
    return summary["snapshot"], result.stderr


def test_a_one_thread_run_is_scored_against_the_one_thread_peak_not_the_two_thread_one_stored_after(
    tm_env, tmp_path
):
    snapshot, stderr = tiny_run(tm_env, tmp_path, [peak(1, 1e10), peak(2, 2e10)])
    device = next(f for f in snapshot["facts"].values() if f["name"] == "device")
    assert device["value"]["threads"] == 1 and device["value"]["dtype"] == "float32"
    used = snapshot["explain"]["mfu_avg"]["inputs"]["peak_flop_per_s_per_device"]
    assert used["value"] == 1e10 and "1-thread figure" in used["source"]
    assert snapshot["metrics"]["mfu_avg"]["label"] == "measured"
    # The summary line says which peak: its value, its source and when it was measured.
    line = stderr.strip().splitlines()[-1]
    assert re.search(
        r"MFU [\d.]+% \(titan, measured; against 10 GFLOP/s \(CPU, measured peak: tm peak: a test's 1-thread "
        r"figure, measured 2026-11-30 00:53 UTC\)\)",
        line,
    ), line


def test_with_only_a_two_thread_peak_a_one_thread_runs_mfu_is_absent_naming_tm_peak_threads_1(
    tm_env, tmp_path
):
    snapshot, stderr = tiny_run(tm_env, tmp_path, [peak(2, 2e10)])
    mfu = snapshot["metrics"]["mfu_avg"]
    assert "value" not in mfu and "low" not in mfu
    assert "only with float32, 2 threads: measure one with tm peak --threads 1" in mfu["absent"]
    assert "tm peak --threads 1" in stderr.strip().splitlines()[-1]
