"""The test layers, one folder each: what a layer's conftest.py marks its tests with, and which tests run one at a
time (``heavy``: several processes, torch or a browser, grouped so that two never share the two cores;
docs/architecture.md, "Tests", says which are not)."""

from __future__ import annotations

import pytest

LAYERS = ("unit", "integration", "e2e", "browser", "contracts")
HEAVY = (pytest.mark.heavy, pytest.mark.xdist_group("heavy"))


def mark_layer(item: pytest.Item, layer: str, heavy: bool = False) -> None:
    """Mark a test with its layer, and a heavy one also with the group that keeps two heavy tests off the same cores.

    A test that its file marks only ``heavy`` or only ``xdist_group("heavy")`` gets the other mark too, so that
    ``-m heavy`` selects exactly the tests that run one at a time.
    """
    assert layer in LAYERS, layer
    item.add_marker(getattr(pytest.mark, layer))
    grouped = any(mark.args[:1] == ("heavy",) for mark in item.iter_markers("xdist_group"))
    if heavy or grouped or item.get_closest_marker("heavy") is not None:
        for mark in HEAVY:
            item.add_marker(mark)
