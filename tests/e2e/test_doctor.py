"""`tm doctor`: one [ok]/[warn]/[FAIL] line per thing, the reason there is no GPU data and what would give it, the
agent's chances in another interpreter, and exit 0 unless something the user asked for cannot work."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from test_plugins import fake_distribution
from tm_runs import REPO, run_tm

MARKS = ("[ok]", "[warn]", "[FAIL]")


def lines_of(result: subprocess.CompletedProcess) -> list[str]:
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith(MARKS) for line in lines), result.stdout
    return lines


def test_on_this_node_doctor_exits_0_and_says_why_there_is_no_gpu_data_and_what_would_give_it(tm_env):
    env = {k: v for k, v in tm_env.items() if not k.startswith("TM_FAKE_GPUS")}
    result = run_tm(["doctor"], env)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = lines_of(result)
    if importlib.util.find_spec("pynvml") is None:
        (missing,) = [line for line in lines if "nvidia-ml-py is not installed" in line]
        assert missing.startswith("[warn] no GPU data:") and "pip install nvidia-ml-py" in missing
    no_data = [line for line in lines if "no GPU data" in line]
    assert no_data or any(line.startswith("[ok]   NVML") for line in lines)
    for line in no_data:  # every reason comes with what would fix it
        assert "pip install" in line or "run on a node" in line or "load it" in line
    assert any(line.startswith("[ok]   plugin sources") for line in lines)
    assert any(line.startswith("[ok]   agent: can join") for line in lines)


def test_an_interpreter_without_trainmeter_is_named_with_the_packages_and_the_install_command(
    tm_env, tmp_path
):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = {k: v for k, v in tm_env.items() if k != "PYTHONPATH"}  # a source tree on the path would be found
    result = run_tm(["doctor", "--python", str(python)], env)
    assert result.returncode == 1  # asked about that interpreter, and the agent cannot join it
    (line,) = [line for line in lines_of(result) if line.startswith("[FAIL] agent")]
    assert "it lacks trainmeter, msgspec, pyzmq" in line
    assert f"fix: {python} -m pip install {REPO}" in line and "no pip" in line


def test_an_interpreter_with_trainmeter_but_no_msgspec_names_only_what_is_missing(tm_env, tmp_path):
    # PYTHONPATH gives the bare venv trainmeter's source but not its dependencies.
    venv = tmp_path / "half"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    env = dict(tm_env, PYTHONPATH=str(REPO))
    result = run_tm(["doctor", "--python", str(venv / "bin" / "python")], env)
    (line,) = [line for line in lines_of(result) if line.startswith("[FAIL] agent")]
    assert "it lacks msgspec, pyzmq" in line and line.endswith(
        "-m pip install msgspec pyzmq (it has no pip: install python3-pip, or use a venv)"
    )


def test_fake_gpus_show_spec_peak_source_adapter_and_a_live_gpm_read(tm_env, tmp_path):
    script = tmp_path / "gpus.json"
    script.write_text(json.dumps({"0": {"gpm": "blocked"}}))
    env = dict(tm_env, TM_FAKE_GPUS="1xH100,1xA100,1xH100", TM_FAKE_GPUS_SCRIPT=str(script))
    result = run_tm(["doctor"], env)
    assert result.returncode == 0, result.stdout
    text = result.stdout
    assert (
        "[ok]   NVML" in text
        and "fake GPUs from TM_FAKE_GPUS=1xH100,1xA100,1xH100: not real hardware" in text
    )
    (gpu0,) = [
        line for line in text.splitlines() if line.startswith("[ok]   gpu0 NVIDIA H100 80GB HBM3 (fake)")
    ]
    assert "spec h100-sxm (NVIDIA H100 SXM), dense BF16 989.4 TFLOPS from https://" in gpu0
    assert gpu0.endswith("adapter server")
    assert "[warn] gpu0 GPM: GPM blocked by the provider" in text
    assert "[warn] gpu1 GPM: GPM not supported before Hopper" in text
    assert "[ok]   gpu2 GPM: SM active 0.0%, tensor active 0.0%, DRAM active 0.0% over" in text


@pytest.mark.parametrize(
    "fake, gpus, expected",
    [
        ("2xH100", "5", "[FAIL] --gpus: no GPU 5 on this node (NVML lists GPUs 0..1)"),
        (None, "0", "[FAIL] --gpus 0: no GPU can be watched on this node without NVML"),
    ],
)
def test_asking_for_gpus_that_cannot_be_watched_fails(tm_env, tmp_path, fake, gpus, expected):
    env = dict(tm_env)
    if fake:
        env["TM_FAKE_GPUS"] = fake
    else:
        script = tmp_path / "none.json"
        script.write_text(json.dumps({"machine": {"init_error": "library_not_found"}}))
        env.update(TM_FAKE_GPUS="1xH100", TM_FAKE_GPUS_SCRIPT=str(script))
    result = run_tm(["doctor", "--gpus", gpus], env)
    assert result.returncode == 1 and expected in result.stdout, result.stdout


def test_a_plugin_that_fails_to_load_is_a_warning_not_a_failure(tm_env, tmp_path):
    site = tmp_path / "site"
    fake_distribution(site, "tm-broken", "[trainmeter]\nbroken = tm_no_such_module_xyz\n")
    result = run_tm(["doctor"], dict(tm_env, PYTHONPATH=str(site)))
    assert result.returncode == 0
    (line,) = [line for line in lines_of(result) if "plugin broken" in line]
    assert line.startswith("[warn] plugin broken (tm-broken 0.1) not loaded: ModuleNotFoundError")
