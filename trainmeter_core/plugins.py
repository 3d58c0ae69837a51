"""The plugin manager: loads each entry point of a group on its own, so one broken plugin is reported and skipped.

pluggy's ``load_setuptools_entrypoints`` stops at the first entry point that fails to import; tm must not. Every
plugin, built-in or not, is listed with its distribution, version, the hooks it implements, or its error.
"""

from __future__ import annotations

from typing import Any

import pluggy

from trainmeter_core import hookspecs
from trainmeter_core.entrypoints import AGENT_GROUP, BUILTIN_DISTRIBUTION, GROUP, EntryPoint, _entry_points
from trainmeter_core.model.records import PluginInfo

__all__ = ["AGENT_GROUP", "BUILTIN_DISTRIBUTION", "GROUP", "EntryPoint", "Plugins", "load"]


class Plugins:
    """A pluggy manager plus what was loaded and what failed."""

    def __init__(self, group: str = GROUP) -> None:
        self.group = group
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.infos: list[PluginInfo] = []
        self.builtin: set[str] = set()

    @property
    def hook(self):
        return self.pm.hook

    def load_entry_points(self) -> Plugins:
        for ep in _entry_points(self.group):
            dist = getattr(ep, "dist", None)
            dist_name = dist.name if dist is not None else None
            version = dist.version if dist is not None else None
            try:
                plugin = ep.load()
                self.pm.register(plugin, name=ep.name)
            except BaseException as exc:  # a plugin's import may raise anything, SystemExit included
                if isinstance(exc, KeyboardInterrupt):
                    raise
                import traceback  # only for a plugin that failed to load

                last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
                where = f" ({last[0].filename}:{last[0].lineno})" if last else ""
                self.infos.append(
                    PluginInfo(
                        name=ep.name,
                        group=self.group,
                        distribution=dist_name,
                        version=version,
                        error=f"{type(exc).__name__}: {exc}{where}",
                    )
                )
                continue
            if dist_name == BUILTIN_DISTRIBUTION:
                self.builtin.add(ep.name)
            self.infos.append(
                PluginInfo(
                    name=ep.name,
                    group=self.group,
                    distribution=dist_name,
                    version=version,
                    provides=self.provides(ep.name),
                )
            )
        return self

    def register(self, plugin: Any, name: str, builtin: bool = False) -> None:
        """Register a plugin object directly (tests, and the fixtures that stand in for an installed plugin)."""
        self.pm.register(plugin, name=name)
        if builtin:
            self.builtin.add(name)
        self.infos.append(PluginInfo(name=name, group=self.group, provides=self.provides(name)))

    def provides(self, name: str) -> list[str]:
        plugin = self.pm.get_plugin(name)
        return sorted(
            caller.name.removeprefix("trainmeter_")
            for caller in self.pm.get_hookcallers(plugin) or []
            if caller.name.startswith("trainmeter_")
        )

    def per_plugin(self, hook_name: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call one hook on each plugin separately: (plugin name, result), skipping and recording failures."""
        results = []
        caller = getattr(self.pm.hook, hook_name)
        for impl in caller.get_hookimpls():
            try:
                result = impl.function(**kwargs)
            except Exception as exc:
                self.infos.append(
                    PluginInfo(
                        name=impl.plugin_name,
                        group=self.group,
                        error=f"{hook_name}: {type(exc).__name__}: {exc}",
                    )
                )
                continue
            if result is not None:
                results.append((impl.plugin_name, result))
        return results

    def errors(self) -> list[PluginInfo]:
        return [info for info in self.infos if info.error]


def load(group: str = GROUP) -> Plugins:
    return Plugins(group).load_entry_points()
