"""The wheel carries everything a user needs: four packages, the `tm` script, the agent's bootstrap and the specs.

An editable install would hide a missing ``specs/``, so this builds the real wheel, installs it in a fresh venv and
loads a spec from there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile

import pytest
from tm_runs import REPO


@pytest.mark.xdist_group("heavy")
def test_the_wheel_installs_in_a_fresh_venv_and_loads_a_spec_from_itself(tmp_path):
    dist = tmp_path / "dist"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = dist.glob("trainmeter-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "trainmeter_core/specs/h100-sxm.json" in names
    assert "trainmeter_agent/boot/sitecustomize.py" in names
    for package in ("trainmeter_core", "trainmeter_sources", "trainmeter_agent", "trainmeter_web"):
        assert f"{package}/__init__.py" in names

    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    # The dependencies come from this environment's site-packages (offline), but trainmeter itself only from the
    # fresh venv: the editable install here is a .pth file, which PYTHONPATH entries do not process.
    env = dict(os.environ, PYTHONPATH=sysconfig.get_paths()["purelib"])
    probe = (
        "import trainmeter_core, trainmeter_core.run.specstore as s, trainmeter_core.model.device_specs as h\n"
        "spec_dir = s.builtin_spec_dir()\n"
        "specs = s.load_specs()\n"
        "spec = h.match_spec('NVIDIA H100 80GB HBM3', specs)\n"
        "print(trainmeter_core.__file__)\n"
        "print(spec_dir)\n"
        "print(spec.id, h.dense_peak_flop_per_s(spec)[0])\n"
    )
    result = subprocess.run([str(python), "-c", probe], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    module_file, spec_dir, spec_line = result.stdout.splitlines()
    assert module_file.startswith(str(venv)) and spec_dir.startswith(str(venv))
    assert spec_line.split()[0] == "h100-sxm" and float(spec_line.split()[1]) == pytest.approx(989.4e12)
    tm = subprocess.run([str(venv / "bin" / "tm"), "--version"], env=env, capture_output=True, text=True)
    assert tm.returncode == 0 and tm.stdout.startswith("tm ")
