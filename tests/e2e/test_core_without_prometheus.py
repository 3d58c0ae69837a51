"""The Prometheus exporter is a plugin, not a part of tm: no file of tm's packages and nothing tm installs mentions
Prometheus, and in an environment without the ``trainmeter-prometheus`` distribution, tm's help, its plugin list and
a whole run (its output and every file of its run directory) say nothing of it, and its options are unknown."""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from tm_runs import REPO, only_run

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

CORE = ("trainmeter_core", "trainmeter_sources", "trainmeter_agent", "trainmeter_web", "specs")
WORD = "prometheus"
LOOP = """
import time
from trainmeter_agent import emit
for i in range(1, 11):
    emit(step=i, tokens=128)
    emit(train_loss=1.0 / i)
    time.sleep(0.05)
"""


def mentions(data: bytes) -> bool:
    return WORD in data.decode("utf-8", "replace").lower()


def test_no_file_of_tm_s_packages_and_nothing_tm_installs_mentions_prometheus():
    files = [
        p
        for package in CORE
        for p in (REPO / package).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    assert len(files) > 100  # the packages were found: every module, the dashboard's static files, the specs
    assert [str(p.relative_to(REPO)) for p in files if mentions(p.read_bytes())] == []
    # what tm installs: its dependencies, scripts and entry points
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not mentions(json.dumps(project).encode())


@pytest.fixture(scope="module")
def without_exporter(tmp_path_factory) -> Path:
    """A virtual environment holding everything this one holds but the exporter's distribution and its
    prometheus-client: a venv whose site-packages links to each entry of ours whose name does not say prometheus."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    ours = Path(sysconfig.get_paths()["purelib"])
    theirs = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
    )
    for entry in ours.iterdir():
        if WORD not in entry.name.lower():
            (theirs / entry.name).symlink_to(entry)
    tm = venv / "bin" / "tm"
    tm.write_text(
        f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom trainmeter_core.commands.cli import main\nsys.exit(main())\n"
    )
    tm.chmod(0o755)
    return venv


def tm_in(venv: Path, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TM_", "LOCAL_RANK", "PYTHON"))}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        TM_RUNS_DIR=str(tmp_path / "runs"),
        TM_DISABLE_COMPONENTS="web",
        OMP_NUM_THREADS="1",
    )
    return subprocess.run(
        [str(venv / "bin" / "tm"), *args], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )


def distribution_in(venv: Path) -> str:
    probe = "import importlib.metadata as m\ntry:\n    print(m.version('trainmeter-prometheus'))\nexcept m.PackageNotFoundError:\n    print('absent')\n"
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


@pytest.mark.heavy
@pytest.mark.xdist_group("heavy")
def test_without_the_exporter_installed_tm_and_a_whole_run_say_nothing_of_prometheus(
    without_exporter, tmp_path
):
    # the control: here (./scripts/setup installs every plugin) the exporter is installed, and there it is not
    assert importlib.metadata.version("trainmeter-prometheus")
    assert distribution_in(without_exporter) == "absent"
    for args in (["--help"], ["plugins"], ["plugins", "--json"]):
        shown = tm_in(without_exporter, args, tmp_path)
        assert shown.returncode == 0, shown.stderr
        if args != ["--help"]:
            assert "webhook" in shown.stdout  # the other plugins are still there
        assert not mentions((shown.stdout + shown.stderr).encode()), args
    (tmp_path / "loop.py").write_text(LOOP)
    done = tm_in(without_exporter, ["loop.py"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert not mentions((done.stdout + done.stderr).encode())
    run = only_run(tmp_path / "runs")
    steps = [
        json.loads(line)["step"]
        for seg in sorted(run.glob("events-*.jsonl"))
        for line in seg.read_text().splitlines()
        if json.loads(line)["kind"] == "step"
    ]
    assert steps == list(range(1, 11))  # a real run went through
    for file in (p for p in run.rglob("*") if p.is_file()):
        data = file.read_bytes()
        assert not mentions(gzip.decompress(data) if file.suffix == ".gz" else data), file.name
    # its options are not tm's: refused like any unknown option, and nothing starts
    (tmp_path / "refused").mkdir()
    refused = tm_in(without_exporter, ["--prometheus-port", "9464", "loop.py"], tmp_path / "refused")
    assert refused.returncode == 2 and "unknown option --prometheus-port" in refused.stderr
    assert not (tmp_path / "refused" / "runs").exists()
