"""Energy of this run only, through real ``tm`` runs on the fake NVML: two runs on different GPUs of one fake node at
the same time, each with its own GPUs' counter rises and nothing of the other's; a GPU without the counter gives the
integral of its sampled power, and the label says so."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from tm_runs import TM, log_records

from trainmeter_sources.gpu.sampler import HOST_PIDS
from trainmeter_sources.gpu.selection import in_container

# The child waits until its own run's log holds this many sample.gpu rows: a few seconds of samples, then it exits.
WAIT_FOR_ROWS = textwrap.dedent(
    """
    import glob, json, os, sys, time
    want = int(sys.argv[1])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen = 0
        for path in glob.glob(os.path.join(os.environ["TM_RUN_DIR"], "events-*.jsonl")):
            with open(path) as f:
                seen += sum(1 for line in f if '"sample.gpu"' in line)
        if seen >= want:
            break
        time.sleep(0.05)
    """
)


def start(env: dict[str, str], name: str, visible: str, rows: int) -> subprocess.Popen:
    run_env = dict(env, CUDA_VISIBLE_DEVICES=visible, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    command = [
        TM,
        "--name",
        name,
        "--no-agent",
        "--no-web",
        "--",
        sys.executable,
        "-c",
        WAIT_FOR_ROWS,
        str(rows),
    ]
    return subprocess.Popen(command, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rises(rows: list[dict]) -> float:
    """Σ of the counter's rises between a GPU's consecutive rows, in J (the run's rows, in log order)."""
    total = 0.0
    for before, after in zip(rows, rows[1:], strict=False):
        total += max(0.0, after["energy_j"] - before["energy_j"])
    return total


def integral(rows: list[dict]) -> float:
    """Σ power × the time since the GPU's previous row, in J."""
    return sum(
        after["power_w"] * (after["t"] - before["t"]) for before, after in zip(rows, rows[1:], strict=False)
    )


@pytest.mark.xdist_group("heavy")
def test_two_runs_on_different_gpus_of_one_node_each_get_their_own_gpus_energy(tm_env, tmp_path):
    script = tmp_path / "nvml.json"
    script.write_text(
        json.dumps(
            {
                "0": {"power_w": 300},
                "1": {"power_w": 120},
                "2": {"power_w": 200, "fail": {"nvmlDeviceGetTotalEnergyConsumption": "not_supported"}},
            }
        )
    )
    env = dict(tm_env, TM_FAKE_GPUS="3xH100", TM_FAKE_GPUS_SCRIPT=str(script), TM_GPU_INTERVAL_S="0.2")
    first = start(env, "energy-a", "0", 10)
    second = start(env, "energy-b", "1,2", 20)  # at the same time, on the node's other GPUs
    for process in (first, second):
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
    runs = {p.name.rsplit("-", 1)[-1]: p for p in (tmp_path / "runs").iterdir() if p.is_dir()}
    assert sorted(runs) == ["a", "b"]
    host = None
    energy = {}
    for name, run_dir in runs.items():
        rows = [r for r in log_records(run_dir) if r["kind"] == "sample.gpu"]
        host = rows[0]["host"]
        by_gpu = {
            index: [r for r in rows if r["index"] == index] for index in sorted({r["index"] for r in rows})
        }
        snapshot = json.loads((run_dir / "summary.json").read_text())["snapshot"]
        energy[name] = (by_gpu, snapshot["metrics"]["energy_j"], snapshot["explain"]["energy_j"])
    (a_rows, a_energy, a_explain), (b_rows, b_energy, b_explain) = energy["a"], energy["b"]
    # No sample of the other run's GPUs in either run, and every row is the run's own.
    assert sorted(a_rows) == [0] and sorted(b_rows) == [1, 2]
    assert all(r.get("for_run", True) and not r.get("other_pids") for rows in a_rows.values() for r in rows)
    # Run a: its GPU's counter rises, in J (300 W for the seconds it ran), and nothing else.
    assert a_energy["label"] == "energy counter"
    assert a_energy["value"] == pytest.approx(rises(a_rows[0]), rel=1e-9)
    assert a_energy["value"] == pytest.approx(integral(a_rows[0]), rel=0.02)  # 300 W throughout: they agree
    assert set(a_explain["inputs"]) == {f"{host}/gpu0"}
    # Run b: gpu1's counter rises plus gpu2's integral of its sampled power (it has no counter), labelled.
    assert "energy_j" not in b_rows[1][0].get("absent", {})
    assert b_rows[2][0]["absent"]["energy_j"] == "not on this device"
    assert b_energy["label"] == f"energy counter; ∫ sampled power on {host}/gpu2 (no counter)"
    inputs = b_explain["inputs"]
    assert set(inputs) == {f"{host}/gpu1", f"{host}/gpu2"}
    assert inputs[f"{host}/gpu1"]["value"] == pytest.approx(rises(b_rows[1]), rel=1e-9)
    assert inputs[f"{host}/gpu2"]["value"] == pytest.approx(integral(b_rows[2]), rel=1e-9)
    assert b_energy["value"] == pytest.approx(rises(b_rows[1]) + integral(b_rows[2]), rel=1e-9)
    # Neither run's figure is the node's: a at 300 W and b at 120 W + 200 W, each over its own seconds.
    a_seconds = a_rows[0][-1]["t"] - a_rows[0][0]["t"]
    assert a_energy["value"] == pytest.approx(300 * a_seconds, rel=0.02)


@pytest.mark.xdist_group("heavy")
def test_a_reload_mid_run_is_dropped_and_counted_and_a_gpu_another_process_uses_has_no_energy(
    tm_env, tmp_path
):
    script = tmp_path / "nvml.json"
    # gpu0's driver reloads 1.5 s in; on gpu1 NVML lists pid 4242, which is no process of the run's.
    script.write_text(
        json.dumps(
            {
                "0": {"power_w": 250, "energy_reset_after_s": 1.5},
                "1": {"power_w": 250, "processes": [[4242, 1 << 30]]},
            }
        )
    )
    env = dict(tm_env, TM_FAKE_GPUS="2xH100", TM_FAKE_GPUS_SCRIPT=str(script), TM_GPU_INTERVAL_S="0.2")
    for name, visible in (("reload", "0"), ("shared", "1")):
        process = start(env, f"energy-{name}", visible, 12)
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
    runs = {p.name.rsplit("-", 1)[-1]: p for p in (tmp_path / "runs").iterdir() if p.is_dir()}
    reloaded = json.loads((runs["reload"] / "summary.json").read_text())["snapshot"]
    rows = [r for r in log_records(runs["reload"]) if r["kind"] == "sample.gpu"]
    backwards = sum(1 for a, b in zip(rows, rows[1:], strict=False) if b["energy_j"] < a["energy_j"])
    assert backwards == 1
    energy = reloaded["metrics"]["energy_j"]
    assert energy["label"] == "energy counter, 1 interval dropped (counter went backwards)"
    assert energy["value"] == pytest.approx(rises(rows), rel=1e-9)  # every rise, the fall left out
    assert reloaded["explain"]["energy_j"]["inputs"]["dropped_intervals"]["value"] == 1
    shared = json.loads((runs["shared"] / "summary.json").read_text())["snapshot"]
    rows = [r for r in log_records(runs["shared"]) if r["kind"] == "sample.gpu"]
    host = rows[0]["host"]
    if in_container():
        # Here NVML's pids are the host's and none of them is the run's: tm cannot tell, gives the energy and says so.
        assert all(r["absent"]["other_pids"] == HOST_PIDS and not r.get("other_pids") for r in rows)
        note = f"{host}/gpu1: tm could not tell whether another process uses it ({HOST_PIDS})"
        assert shared["explain"]["energy_j"]["note"] == note
        assert shared["metrics"]["energy_j"]["value"] == pytest.approx(rises(rows), rel=1e-9)
        return
    assert all(r["other_pids"] == [4242] for r in rows)
    reason = f"another process also uses {host}/gpu1 (pid 4242): its energy counter counts both"
    for key in ("energy_j", "energy_kwh", "energy_j_per_token", "energy_j_per_step"):
        assert shared["metrics"][key]["absent"] == reason
