"""trainmeter's core: records, the bus, plugins, the launcher, the recorder and the pure formulas.

A plugin imports ``trainmeter_core.api`` (its Protocols, helpers and record types) and ``hookimpl``, here as well.
This module imports only the dependency-free hook marker: the agent imports the core's records inside a training
process and must never pay for pluggy, zmq or aiohttp here.
"""

from trainmeter_core.hookmarker import PROJECT, hookimpl

__version__ = "0.1.0"
__all__ = ["PROJECT", "__version__", "hookimpl"]
