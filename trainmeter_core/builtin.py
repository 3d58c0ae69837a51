"""The core's own plugin: what tm itself provides through the hooks every plugin uses."""

from __future__ import annotations

from trainmeter_core import hookimpl


@hookimpl
def trainmeter_components():
    from trainmeter_core.engine_component import EngineComponent

    return [EngineComponent]


@hookimpl
def trainmeter_secret_options():
    # tm's own options and variables that carry secrets.
    return ["--heartbeat", "TM_HEARTBEAT_URL", "TM_WEB_TOKEN"]
