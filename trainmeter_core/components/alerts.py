"""The alerts component: runs every alert rule on the engine's snapshots and publishes ``alert`` records.

It reads the rules from the ``trainmeter_alert_rules`` hook and their thresholds from ``[alerts.<rule>]`` of the run's
tm.toml; after a restart it takes the open episodes back from the run log, so an alert is never fired twice. It only
publishes: delivering alerts is the sinks' work, and it never writes a file.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainmeter_core.bus.component import Component, ComponentContext
from trainmeter_core.model import records
from trainmeter_core.model.alerts.episodes import Alerter, alert_config
from trainmeter_core.runlog.reader import read_log

#: After the launcher asks components to stop, how long to wait for the final snapshot (it follows run.end).
STOP_DRAIN_S = 1.5


def tm_toml_path(meta: Mapping[str, Any]) -> Path:
    """The tm.toml the run's declared inputs came from: next to the script, or in the working directory."""
    cwd = Path(meta.get("cwd") or ".")
    command = meta.get("command") or []
    if meta.get("script_mode") and command:
        return (cwd / command[0]).resolve().parent / "tm.toml"
    return cwd / "tm.toml"


def read_tm_toml(meta: Mapping[str, Any]) -> tuple[dict, str | None]:
    """The run's tm.toml as a document ({} when there is none), and the one-line error if it cannot be read."""
    from trainmeter_core.model.declared import DeclaredInputError, load_tm_toml

    path = tm_toml_path(meta)
    if not path.is_file():
        return {}, None
    try:
        return load_tm_toml(path), None
    except DeclaredInputError as exc:
        return {}, str(exc)


def collect_rules(plugins: Any) -> tuple[list[Any], list[str]]:
    """Every rule the plugins provide (the first to take a name wins), and one line per rule that was refused."""
    rules: list[Any] = []
    problems: list[str] = []
    taken: dict[str, str] = {}
    for plugin_name, provided in plugins.per_plugin("trainmeter_alert_rules"):
        for rule in provided:
            name = getattr(rule, "name", "")
            if not name or not callable(getattr(rule, "evaluate", None)):
                problems.append(
                    f"plugin {plugin_name}: {rule!r} is no alert rule (it needs a name and evaluate)"
                )
            elif name in taken:
                problems.append(f"plugin {plugin_name}: alert rule {name} is taken by {taken[name]}; skipped")
            else:
                taken[name] = plugin_name
                rules.append(rule)
    for info in plugins.errors():
        if info.error and "trainmeter_alert_rules" in info.error:
            problems.append(f"plugin {info.name}: {info.error}")
    return rules, problems


def build_alerter(meta: Mapping[str, Any], rules: list[Any]) -> tuple[Alerter, list[str]]:
    """The alerter with the run's thresholds, and one line per tm.toml entry it could not use."""
    document, problem = read_tm_toml(meta)
    path = str(tm_toml_path(meta))
    configs, errors = alert_config(document, rules, where=path)
    return Alerter(rules, configs), ([problem] if problem else []) + errors


class AlertsComponent(Component):
    name = "alerts"
    subscribes = ("snapshot",)
    shared = True

    def run(self, ctx: ComponentContext) -> None:
        from trainmeter_core import plugins as plugins_mod

        rules, problems = collect_rules(plugins_mod.load())
        alerter, errors = build_alerter(ctx.meta, rules)
        for line in problems + errors:
            _say(ctx, line, "error")
        alerter.restore(read_log(ctx.run_dir, kinds={"alert"}))
        reported = 0
        drain_until = None
        while True:
            if ctx.stopping.is_set() and drain_until is None:
                drain_until = time.monotonic() + STOP_DRAIN_S
            if drain_until is not None and time.monotonic() >= drain_until:
                return
            record = ctx.recv(1.0)  # at once at the stop, and every STOP_CHECK_S from then on
            if not isinstance(record, records.Snapshot):
                continue
            for alert in alerter.observe(record):
                ctx.publish(alert)
            for line in alerter.errors[reported:]:
                _say(ctx, line, "error")
            reported = len(alerter.errors)
            if record.final:
                ctx.done()  # its alerts are out: the launcher waits for them no longer
                return  # nothing follows the final snapshot


def _say(ctx: ComponentContext, message: str, level: str) -> None:
    ctx.publish(records.Notice(level=level, topic="alerts", message=message))  # type: ignore[arg-type]
    try:
        sys.stderr.write(f"tm: alerts: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
