"""The browser tests: the dashboard and the reports as a person sees them in Chromium (one per xdist worker, the
``browser`` fixture of tests/conftest.py). Each is marked ``browser`` and ``heavy``: two never share the cores."""

from layers import mark_layer


def pytest_itemcollected(item):
    mark_layer(item, "browser", heavy=True)
