"""The core's own plugin: what tm itself provides through the hooks every plugin uses."""

from __future__ import annotations

from trainmeter_core import hookimpl


@hookimpl
def trainmeter_components():
    from trainmeter_core.components.alerts import AlertsComponent
    from trainmeter_core.components.engine import EngineComponent

    return [EngineComponent, AlertsComponent]


@hookimpl
def trainmeter_sinks():
    from trainmeter_core.components.heartbeat import HeartbeatSink, heartbeat_url
    from trainmeter_core.components.sinks import AlertsFileSink, TerminalSink

    # The heartbeat is opt-in: without a URL it is not even started.
    return [TerminalSink, AlertsFileSink] + ([HeartbeatSink] if heartbeat_url() else [])


@hookimpl
def trainmeter_alert_rules():
    from trainmeter_core.model.alerts import BUILTIN_RULES

    return [cls() for cls in BUILTIN_RULES]


@hookimpl
def trainmeter_secret_options():
    # tm's own options and variables that carry secrets.
    return ["--heartbeat", "TM_HEARTBEAT_URL", "TM_WEB_TOKEN"]


@hookimpl
def trainmeter_profiler_importers():
    from trainmeter_core.importers.kineto import KinetoImporter

    return [KinetoImporter()]
