"""The contracts: what must stay true of the repository rather than of a run (the import-linter contracts, the docs
and their examples, the wheel, the setup scripts, the shape of the code). Each is marked ``contracts``."""

from layers import mark_layer


def pytest_itemcollected(item):
    mark_layer(item, "contracts")
