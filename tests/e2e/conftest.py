"""The end-to-end tests: they run ``tm``, a training script or torch, as a user would. Each is marked ``e2e``; those
with several processes or a torch loop are also ``heavy`` (marked in their files), and two heavy tests never share the
cores; a test whose processes mostly wait is not, nor the two largest files of one torch loop that time nothing
(docs/architecture.md, "Tests"). Those with several ranks or nodes busy at once are also ``ranks``: last in the heavy
tests' line."""

from layers import mark_layer


def pytest_itemcollected(item):
    mark_layer(item, "e2e")
