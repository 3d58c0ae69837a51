"""``--dist loadgroup`` as pytest-xdist means it, under pytest 9.2: a test's ``xdist_group`` travels in its node id.

pytest-xdist 3.8 writes the group into ``item._nodeid``, which pytest 9.2 no longer reads (the id is the structured
``item._id``), so every group was silently spread over the workers and two heavy tests shared the cores
(pytest-xdist issue 1386). This plugin writes the same suffix where pytest reads it, and does nothing once xdist's own
suffix shows in the node id.
"""

from __future__ import annotations

import pytest

try:
    from _pytest.nodeid import NodeId
except ImportError:  # pytest before 9.2, whose node id xdist's own suffix reaches
    NodeId = None


def group_of(item: pytest.Item) -> str | None:
    """The suffix xdist gives a test of these groups: their names, sorted and joined, as xdist 3.8 joins them."""
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) or None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # set on each xdist worker under --dist loadgroup
        return
    for item in items:
        group = group_of(item)
        if group is None or item.nodeid.endswith(f"@{group}") or NodeId is None:
            continue
        item._id = NodeId.parse(f"{item.nodeid}@{group}")
