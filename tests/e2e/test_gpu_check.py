"""scripts/gpu-check on the CPU (TM_CHECK_CPU=1), on the machine a real H200 had: a python3 that is itself a virtual
environment holding torch, and a venv made inside it that does not see torch. The check must find the interpreter
with torch, install tm beside it from carried wheels only, and pass both of its parts as one report.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from tm_runs import REPO
from torch_required import require_torch

heavy = pytest.mark.xdist_group("heavy")
GPU_CHECK = REPO / "scripts" / "gpu-check"
#: What the H200's environment lacked and gpu-check carries as wheels; everything else of this venv stays visible.
CARRIED = ("trainmeter", "zmq", "pyzmq", "msgspec", "_editable", "__editable__")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """trainmeter's wheel built from this checkout, and this interpreter's pyzmq and msgspec repacked (no registry)."""
    folder = tmp_path_factory.mktemp("wheels")
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_check" / "wheels.py"), str(folder), "--from-installed"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    names = sorted(p.name.split("-")[0] for p in folder.glob("*.whl"))
    assert names == ["msgspec", "pyzmq", "trainmeter"]
    return folder


@pytest.fixture(scope="module")
def torch_venv(tmp_path_factory) -> Path:
    """A venv holding torch (and aiohttp, pluggy: the training environment) but not tm, pyzmq or msgspec.

    Made from the base interpreter, with one ``.pth`` line naming a folder that links every distribution of the
    test's own environment except the carried ones: the H200's ``python3`` as far as gpu-check can tell.
    """
    require_torch()
    root = tmp_path_factory.mktemp("machine")
    here = Path(sysconfig.get_paths()["purelib"])
    linked = root / "torch-env"
    linked.mkdir()
    for entry in here.iterdir():
        lowered = entry.name.lower()
        if (
            entry.suffix == ".pth"
            or any(lowered.startswith(name) for name in CARRIED)
            or "trainmeter" in lowered
        ):
            continue
        (linked / entry.name).symlink_to(entry)
    venv = root / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=300)
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "training-environment.pth").write_text(f"{linked}\n")
    probe = "import torch, aiohttp, pluggy\ntry:\n import zmq\nexcept ImportError:\n print('no zmq')"
    answer = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert answer.stdout.strip() == "no zmq", answer.stderr  # torch there, tm's wire not
    return venv


def gpu_check(path: list[Path], out: Path, wheels: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TM_", "VIRTUAL_ENV", "PYTHON"))}
    # Only the machine's own folders after the given ones: the test's venv (which has tm) must not be found.
    env.update(
        PATH=os.pathsep.join([*(str(p / "bin") for p in path), "/usr/bin", "/bin"]),
        TM_CHECK_CPU="1",
        TM_CHECK_OUT=str(out),
        OMP_NUM_THREADS="1",
        **extra,
    )
    return subprocess.run(
        [str(GPU_CHECK), str(wheels)], env=env, capture_output=True, text=True, timeout=600, cwd=out.parent
    )


@heavy
def test_gpu_check_passes_where_python3_is_a_venv_holding_torch(tmp_path, wheels, torch_venv):
    done = gpu_check([torch_venv], tmp_path / "out", wheels)
    assert done.returncode == 0, done.stdout + done.stderr
    report = (tmp_path / "out" / "report.txt").read_text()
    assert report == done.stdout  # the whole output is the report, and the report is self-contained
    assert f"chosen:    {torch_venv}/bin/python3" in report
    # tm came from the carried wheels, into a folder of its own; the venv itself is untouched.
    assert "pip install --no-index --no-deps --find-links" in report
    versions = {name: importlib.metadata.version(name) for name in ("msgspec", "pyzmq", "trainmeter")}
    installed = " ".join(f"{name}-{version}" for name, version in versions.items())
    assert f"  installed: {installed}" in report
    assert "  trainmeter: from trainmeter-" in report and "  pyzmq: from pyzmq-" in report
    assert "tm-gpu-check-site" in report.split("trainmeter 0.1.0 from ", 1)[1].split(";", 1)[0]
    assert "agent: can join" in report
    for line in ("FLOPs/token, titan", "tokens/s, steps 10-80", "MFU (titan), tm's arithmetic"):
        assert any(row.strip().startswith(line) and "PASS" in row for row in report.splitlines()), line
    # Part 1's energy: the run's from NVML's counter, and over the loop tm's counter rows beside NVML's own delta
    # (the loop read the fake's counter itself; one steady idle power on both sides).
    assert "  energy of the run (tm): " in report and "(energy counter), whole run" in report
    assert "  energy over the loop, tm's rows:" in report and "  energy over the loop, NVML's own:" in report
    assert any(
        line.startswith("  tm / NVML mean power: ") and "agree" in line for line in report.splitlines()
    )
    assert "80 equal" in report and "GPT loop: PASS" in report
    assert report.rstrip().splitlines()[-1].startswith("gpu-check: PASS")
    assert not list(torch_venv.rglob("trainmeter_core"))
    runs = sorted(p.name.rsplit("-", 1)[-1] for p in (tmp_path / "out" / "runs").iterdir())
    assert runs == ["gpt", "matmul"]


@heavy
def test_gpu_check_passes_from_a_venv_made_inside_the_venv_holding_torch(tmp_path, wheels, torch_venv):
    inner = tmp_path / "inner"
    subprocess.run(
        [
            str(torch_venv / "bin" / "python"),
            "-m",
            "venv",
            "--system-site-packages",
            "--without-pip",
            str(inner),
        ],
        check=True,
        timeout=300,
    )
    # The venv made inside is active and first on PATH, as on the H200: it does not see torch.
    done = gpu_check(
        [inner, torch_venv], tmp_path / "out", wheels, VIRTUAL_ENV=str(inner), TM_CHECK_INSTALL="unzip"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = done.stdout
    assert f"  {inner}/bin/python3: no torch (ModuleNotFoundError: No module named 'torch')" in report
    assert f"chosen:    {torch_venv}/bin/python3" in report
    assert "by unzipping each wheel" in report
    assert report.rstrip().splitlines()[-1].startswith("gpu-check: PASS")


@heavy  # beside the others: the module's fixtures (wheels, the venv holding torch) are built once per worker
def test_gpu_check_without_an_interpreter_that_has_torch_says_so_and_exits_2(tmp_path, wheels):
    done = gpu_check([], tmp_path / "out", wheels, PYTHON="/usr/bin/python3")
    assert done.returncode == 2
    assert (
        "FAIL: no interpreter imports torch (tried: /usr/bin/python3); set PYTHON=/path/to/python"
        in done.stdout
    )


@heavy
def test_gpu_check_without_wheels_says_how_to_make_them_and_exits_2(tmp_path, torch_venv):
    done = gpu_check([torch_venv], tmp_path / "out", tmp_path / "no-wheels")
    assert done.returncode == 2
    assert "FAIL: no wheels folder" in done.stdout and "package registry" in done.stdout
