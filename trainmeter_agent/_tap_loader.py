"""Loads the tracker taps lazily: when the user's code imports a tracker, the ``trainmeter.agent`` plugins the launcher
listed in ``<TM_RUN_DIR>/agent-plugins.json`` are loaded and each tap attaches to its library.

Ranks never scan package metadata unless that file is missing; pluggy is never imported (each plugin's
``trainmeter_trackers`` is called directly, so the ``hookimpl`` options are not read here); a failing plugin or tap
stops itself only, with one line.
"""

from __future__ import annotations

import importlib
import sys
import time

from trainmeter_agent._import_watch import imported
from trainmeter_agent._launcher_env import TRACKER_MODULES, plugin_entries
from trainmeter_agent._real_number import NotANumber, real_number


class TapSink:
    """The ``emit`` a tap is given (``trainmeter_core.api.TapEmit``): checks the values, sends them as metrics with
    the tap's origin."""

    def __init__(self, agent, name: str) -> None:
        self.agent = agent
        self.name = name
        self.on = True

    def __call__(self, values: dict, step=None) -> None:
        if not self.on:
            return
        try:
            agent = self.agent
            if agent._faults:
                agent.check_fault(f"tap.{self.name}")
            numbers = {}
            for key, value in values.items():
                try:
                    numbers[str(key)] = real_number(value)
                except NotANumber:
                    continue  # a tracker logs images, tables and text too: skipped without a word
            if numbers:
                step = (
                    int(step)
                    if isinstance(step, int) or (isinstance(step, float) and step.is_integer())
                    else None
                )
                agent.tapped(self.name, numbers, step)
        except Exception as exc:
            self.stop(exc)

    def stop(self, exc: BaseException) -> None:
        self.on = False
        self.agent.stop_probe(f"tap.{self.name}", exc)


class TapLoader:
    """Loads the plugin list once (at the first tracker import) and attaches each tap when its library is imported."""

    def __init__(self, agent, watcher) -> None:
        self.agent = agent
        self.watcher = watcher
        self.loaded = False
        self.taps: dict[str, object] = {}
        self.attached: set[str] = set()
        self.loaded_from: str | None = None  # "agent-plugins.json" or "package metadata"
        self.agent_trackers = TRACKER_MODULES  # already watched: their import calls tracker_imported

    def tracker_imported(self, module) -> None:
        """A tracker (or a listed plugin's library) was imported: load the plugins once, attach what can attach."""
        if not self.loaded:
            self.loaded = True
            self._load()
        for name, tap in self.taps.items():
            if name in self.attached:
                continue
            # The module whose import brought us here has run its code but is still flagged as initialising.
            target = module if getattr(module, "__name__", None) == tap.module else imported(tap.module)
            if target is not None:
                self._attach(name, tap, target)
            elif tap.module not in sys.modules and tap.module not in self.agent_trackers:
                self.watcher.watch(tap.module, f"tap.{name}", lambda m, n=name, t=tap: self._attach(n, t, m))

    def _load(self) -> None:
        started = time.perf_counter()
        entries, where = plugin_entries()
        from trainmeter_agent import taps as builtin

        values = {entry["value"] for entry in entries}
        # The built-in taps ship in this package: a stale install's metadata cannot lose them.
        entries += [{"name": n, "value": v} for n, v in builtin.BUILTIN.items() if v not in values]
        for entry in entries:
            try:
                module_name, _, attr = entry["value"].partition(":")
                plugin = importlib.import_module(module_name)
                for part in filter(None, attr.split(".")):
                    plugin = getattr(plugin, part)
                provided = plugin.trainmeter_trackers()
                for tap in provided or []:
                    if tap.name not in self.taps:
                        self.taps[tap.name] = tap
            except Exception as exc:
                self.agent.say(f"tracker plugin {entry.get('name')} ({entry['value']}) not loaded: {exc}")
        self.agent.iterations._agent_s += time.perf_counter() - started
        self.loaded_from = where

    def _attach(self, name: str, tap, module) -> None:
        if name in self.attached:
            return
        self.attached.add(name)
        sink = TapSink(self.agent, name)
        try:
            tap.attach(module, sink)
            self.agent.probe_state(f"tap.{name}", "attached")
        except Exception as exc:
            sink.stop(exc)
