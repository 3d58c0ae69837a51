"""The end-to-end tests: they run ``tm``, a training script or torch, as a user would. Each is marked ``e2e``; those
that time something or run several busy processes at once are also ``heavy`` (marked in their files), and two heavy
tests never share the cores; a test whose processes mostly wait is not, nor one whose one busy process is a torch loop
it times nothing of (docs/architecture.md, "Tests")."""

from layers import mark_layer


def pytest_itemcollected(item):
    mark_layer(item, "e2e")
