"""The integration tests: a few parts together, in this process or in small subprocesses, over real sockets (the bus,
the hub, the job link, the web server). Each is marked ``integration``."""

from layers import mark_layer


def pytest_itemcollected(item):
    mark_layer(item, "integration")
