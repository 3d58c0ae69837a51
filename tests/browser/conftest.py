"""The browser tests: the dashboard and the reports as a person sees them in Chromium (one per xdist worker, the
``browser`` fixture of tests/conftest.py). Each is marked ``browser`` and ``heavy``: two never share the cores."""

from __future__ import annotations

import os
from importlib import metadata

import pytest
from dashboard_page import Page
from layers import mark_layer


def pytest_itemcollected(item):
    mark_layer(item, "browser", heavy=True)


@pytest.fixture
def page(browser):
    opened = Page(browser)
    yield opened
    opened.close()


@pytest.fixture
def web_env(tm_env, tmp_path):
    """tm's environment, with the ``web`` entry point visible even before the checkout was reinstalled."""
    names = {ep.name for ep in metadata.entry_points(group="trainmeter")}
    if "web" not in names:
        info = tmp_path / "ep" / "trainmeter_web_test-0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trainmeter-web-test\nVersion: 0\n")
        (info / "entry_points.txt").write_text("[trainmeter]\nweb = trainmeter_web.plugin\n")
        tm_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(info.parent), tm_env.get("PYTHONPATH", "")) if p
        )
    return tm_env
