"""The built-in sources, registered through the same ``trainmeter`` entry point group a third-party plugin uses."""

from __future__ import annotations

from trainmeter_core import hookimpl


@hookimpl
def trainmeter_components():
    from trainmeter_sources.host import HostSampler

    return [HostSampler]
