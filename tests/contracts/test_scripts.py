"""The scripts a newcomer runs first: ``scripts/demo`` needs no root and no browser, and says what it is doing.

The demo runs in a copy of the checkout whose ``.venv`` already sees this environment's packages (a warm cache, and
no download in a test), with ``apt-get``, ``sudo`` and ``playwright`` on ``PATH`` as stubs that record any call and
fail, and ``scripts/setup-browser`` replaced by the same: the demo must reach the dashboard without any of them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from tm_runs import REPO

pytestmark = [pytest.mark.heavy, pytest.mark.xdist_group("heavy")]

STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
exit 97
"""


def _copy_checkout(dest: Path) -> None:
    """The tracked files as they are in the working tree (the golden logs stay behind: the demo needs none)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
    ).stdout
    for name in listed.decode().split("\0"):
        if not name or name.startswith("tests/fixtures/"):
            continue
        source = REPO / name
        if not source.is_file():
            continue  # deleted in the working tree
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        target.chmod(source.stat().st_mode)


def _warm_venv(checkout: Path) -> None:
    """``.venv`` with this environment's packages on its path, so setup finds torch and numpy already there."""
    subprocess.run([sys.executable, "-m", "venv", str(checkout / ".venv")], check=True, timeout=120)
    purelib = subprocess.run(
        [
            str(checkout / ".venv" / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # A plain path line: this environment's own .pth files (its editable install of tm) are not processed.
    (Path(purelib) / "tm_test_warm.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")


def test_the_demo_reaches_its_dashboard_without_apt_get_sudo_playwright_or_the_browser_installer(tmp_path):
    checkout = tmp_path / "clone"
    _copy_checkout(checkout)
    _warm_venv(checkout)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    calls = tmp_path / "calls.log"
    for name in ("apt-get", "apt", "sudo", "playwright"):
        (stubs / name).write_text(STUB.format(log=calls))
        (stubs / name).chmod(0o755)
    (checkout / "scripts" / "setup-browser").write_text(STUB.format(log=calls))
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TM_", "VIRTUAL_ENV", "PYTHON")) and key not in ("LOCAL_RANK",)
    }
    env.update(
        PATH=f"{stubs}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
        XDG_DATA_HOME=str(tmp_path / "data"),
        OMP_NUM_THREADS="1",
        PIP_NO_INPUT="1",
    )
    result = subprocess.run(
        ["./scripts/demo", "--steps", "3", "--sleep", "0"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert not calls.exists(), f"the demo called {calls.read_text()!r}"
    steps = [line for line in result.stdout.splitlines() if line.startswith(("setup: ", "demo: "))]
    # One line per step, in order: what is being checked or installed, then the run itself.
    assert steps[0] == "setup: checking for torch and numpy in .venv"
    assert steps[1] == "setup: torch and numpy are installed"
    assert steps[2].startswith("setup: installing tm and its dependencies")
    assert steps[3].startswith("setup: .venv ready for demo")
    assert steps[4].startswith("demo: measuring this CPU's dense matmul peak")
    assert steps[5].startswith("demo: training a tiny GPT under tm")
    # pip's own progress is shown, not swallowed.
    assert "Successfully installed" in result.stdout or "Installing collected packages" in result.stdout
    assert "tm: dashboard http://" in result.stderr, out[-4000:]
    _the_last_line_runs_as_printed_in_a_fresh_shell(result.stderr, checkout, tmp_path)
    # The demo's setup installs only what tm needs: no test tools.
    listed = subprocess.run(
        [
            str(checkout / ".venv" / "bin" / "python"),
            "-m",
            "pip",
            "list",
            "--format",
            "freeze",
            "--path",
            str(_venv_purelib(checkout)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    installed = {line.split("==")[0].lower() for line in listed.stdout.splitlines()}
    assert "trainmeter" in installed and not installed & {"pytest", "ruff", "playwright"}, listed.stdout


def _the_last_line_runs_as_printed_in_a_fresh_shell(stderr: str, checkout: Path, tmp_path: Path) -> None:
    """The summary line's ``see it again`` command, run as printed by a shell with nothing but the system's ``PATH``
    (no ``.venv`` activated, as after ``./scripts/demo`` in a new terminal), from the clone: the dashboard comes up."""
    last = stderr.rstrip().splitlines()[-1]
    printed = last.rsplit("see it again: ", 1)[1]
    assert printed.startswith(".venv/bin/tm view "), last
    view = subprocess.Popen(
        ["bash", "-c", printed],
        cwd=checkout,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    said: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("tm: viewing" in line for line in said):
            line = view.stderr.readline()
            if not line and view.poll() is not None:
                break
            said.append(line)
        (run_dir,) = (checkout / ".trainmeter" / "runs").iterdir()
        assert f"tm: viewing {run_dir.name}" in "".join(said), "".join(said)
    finally:
        os.killpg(view.pid, signal.SIGINT)
        view.wait(30)


def _venv_purelib(checkout: Path) -> Path:
    (lib,) = (checkout / ".venv" / "lib").glob("python3*")
    return lib / "site-packages"


def test_setup_refuses_an_argument_it_does_not_know(tmp_path):
    result = subprocess.run(
        [str(REPO / "scripts" / "setup"), "--browser"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "setup: unknown argument --browser (./scripts/setup [--demo])"


def test_only_the_test_command_installs_the_browser():
    # scripts/test runs the browser tests, so it (and no other script a newcomer runs) calls setup-browser.
    def calls_it(name: str) -> bool:
        lines = (REPO / "scripts" / name).read_text().splitlines()
        return any("scripts/setup-browser" in line for line in lines if not line.lstrip().startswith("#"))

    calls = {name: calls_it(name) for name in ("setup", "demo", "test")}
    assert calls == {"setup": False, "demo": False, "test": True}
