"""Shared fixtures: every test owns its run directory, its sockets and its environment; nothing is installed here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TM = str(BIN / "tm") if (BIN / "tm").exists() else shutil.which("tm")


def require_torch():
    """torch, or a failure when CI installed it (TM_REQUIRE_TORCH=1), or a skip that says why."""
    try:
        import torch
    except ImportError as exc:
        if os.environ.get("TM_REQUIRE_TORCH") == "1":
            pytest.fail(f"torch is required here (TM_REQUIRE_TORCH=1) but does not import: {exc}")
        pytest.skip(f"torch is not installed ({exc}); .ci/run installs it")
    return torch


def wait_for(predicate: Callable[[], object], timeout_s: float = 30.0, what: str = "condition") -> object:
    """Poll until ``predicate`` returns something truthy; fail with ``what`` after the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def log_records(run_dir: Path) -> list[dict]:
    """Every line of a run's log as plain JSON (the raw form a user would grep)."""
    out = []
    for seg in sorted(run_dir.glob("events-*.jsonl")):
        for line in seg.read_text().splitlines():
            out.append(json.loads(line))
    return out


def only_run(runs: Path) -> Path:
    dirs = [p for p in runs.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.fixture
def torch():
    """torch with one thread (two cores are shared by every test), or fail/skip as require_torch says."""
    torch = require_torch()
    torch.set_num_threads(1)
    return torch


@pytest.fixture
def run(tmp_path):
    """A real hub and recorder in the test process, for the agent's tests (``test_agent.Run``)."""
    from test_agent import Run

    run = Run(tmp_path)
    yield run
    run.close()


@pytest.fixture
def tm_env(tmp_path) -> dict[str, str]:
    """An environment for a `tm` subprocess: its own runs directory, one thread for numerics."""
    env = dict(os.environ)
    env["TM_RUNS_DIR"] = str(tmp_path / "runs")
    env["OMP_NUM_THREADS"] = "1"
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    for name in ("TM_ACTIVE", "LOCAL_RANK", "TM_AGENT_ENDPOINT", "TM_RUN_DIR", "TM_LAUNCHER_PID"):
        env.pop(name, None)
    return env


@pytest.fixture
def short_dir():
    """A short folder for ipc sockets (paths are limited to 107 bytes; tmp_path can be longer)."""
    path = Path(tempfile.mkdtemp(prefix="tmt", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class ManualClock:
    """The fake NVML's clock, moved by hand: a test says when each sample is taken."""

    def __init__(self, now_s: float = 1000.0):
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock(monkeypatch):
    """A ManualClock behind the fake NVML; afterwards no fake machine is installed and no library handle is open."""
    from trainmeter_sources.gpu import fake_gpus, fake_pynvml
    from trainmeter_sources.gpu import nvml as backend

    manual = ManualClock()
    monkeypatch.setattr(fake_gpus, "clock", manual)
    yield manual
    fake_pynvml.install(None)
    backend._opened.clear()


def run_tm(args: list[str], env: dict[str, str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([TM, *args], env=env, capture_output=True, text=True, timeout=timeout, **kw)


# ----------------------------------------------------------------------------------------------------------------------
# The browser: one Chromium per xdist worker, shared by every browser test module (Playwright's sync API runs one
# event loop per thread, so a second instance in the same worker would refuse to start).

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def browser():
    """One Chromium per xdist worker. Missing: a failure under TM_REQUIRE_BROWSER=1 (CI), else a skip saying why."""
    why = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        why = f"Playwright is not installed ({exc})"
    if why is None and not os.path.exists(CHROMIUM):
        why = f"Chromium is not at {CHROMIUM}"
    if why is not None:
        if os.environ.get("TM_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{why}, and TM_REQUIRE_BROWSER=1 requires it: run ./scripts/setup-browser")
        pytest.skip(f"{why}: ./scripts/setup-browser installs both")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
