"""trainmeter's core: records, the bus, plugins, the launcher, the recorder and the pure formulas.

Plugin authors need one import, ``from trainmeter_core import hookimpl``; it is resolved lazily so that the agent,
which imports ``trainmeter_core.records`` inside a training process, never pays for pluggy.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name in ("hookimpl", "hookspec"):
        from trainmeter_core import hookspecs

        return getattr(hookspecs, name)
    raise AttributeError(f"module 'trainmeter_core' has no attribute {name!r}")
