"""Shared fixtures: every test owns its run directory, its sockets and its environment; nothing is installed here.

Only fixtures and hooks live here: helpers a test imports by name are in modules named for what they hold
(``tm_runs``, ``deadline``, ``torch_required``, ``manual_clock``), which pyproject.toml's ``pythonpath`` puts on the
path of every layer folder. Each layer folder's conftest.py marks its tests with the layer's name (``layers``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from manual_clock import ManualClock
from tm_runs import BIN
from torch_required import require_torch

# The guard of tests/unit/conftest.py is proven on planted test files run by pytester (tests/unit/test_unit_guard.py);
# xdist_groups keeps each xdist_group on one worker (the heavy tests one at a time) under pytest 9.2.
pytest_plugins = ["pytester", "xdist_groups"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heavy tests that keep several ranks or nodes busy at once (``ranks``) last, in the order collected.

    pytest-xdist sends the heavy group's tests to its worker in this order, so they run at the end of that line, when
    the other worker has run out of tests and left both cores to them: the line's other tests each keep at most one
    core busy, and its timed ones were always run beside the other worker's (docs/architecture.md, "Tests")."""
    items.sort(key=lambda item: item.get_closest_marker("ranks") is not None)


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


# ----------------------------------------------------------------------------------------------------------------------
# The browser: one Chromium per xdist worker, shared by the browser tests that run there one after another
# (Playwright's sync API runs one event loop per thread, so a second instance in the same worker would refuse to
# start). While it runs, that loop is the running loop of the worker's main thread, and a test there that runs a loop
# of its own (asyncio.run) fails: so it stops once the worker's next test is not a browser test.

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class _Chromium:
    """The worker's Chromium, started by the first browser test and stopped after the last of a run of them."""

    def __init__(self) -> None:
        self.playwright = None
        self.chromium = None

    def started(self):
        if self.chromium is None:
            from playwright.sync_api import sync_playwright

            self.playwright = sync_playwright().start()
            self.chromium = self.playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        return self.chromium

    def stop(self) -> None:
        chromium, playwright, self.chromium, self.playwright = self.chromium, self.playwright, None, None
        try:
            if chromium is not None:
                chromium.close()
        finally:
            if playwright is not None:
                playwright.stop()


_CHROMIUM = _Chromium()


@pytest.fixture
def browser():
    """The worker's Chromium (``_Chromium``). Missing: a failure under TM_REQUIRE_BROWSER=1 (CI), else a skip saying
    why."""
    why = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        why = f"Playwright is not installed ({exc})"
    if why is None and not os.path.exists(CHROMIUM):
        why = f"Chromium is not at {CHROMIUM}"
    if why is not None:
        if os.environ.get("TM_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{why}, and TM_REQUIRE_BROWSER=1 requires it: run ./scripts/setup-browser")
        pytest.skip(f"{why}: ./scripts/setup-browser installs both")
    return _CHROMIUM.started()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test's own teardown (its page closed): the worker's Chromium stops unless the next test is a browser
    test too, and at the end of the worker's tests."""
    yield
    if _CHROMIUM.chromium is not None and (
        nextitem is None or nextitem.get_closest_marker("browser") is None
    ):
        _CHROMIUM.stop()
