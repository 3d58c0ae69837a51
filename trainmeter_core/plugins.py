"""The plugin manager: loads each entry point of a group on its own, so one broken plugin is reported and skipped.

pluggy's ``load_setuptools_entrypoints`` stops at the first entry point that fails to import; tm must not. Every
plugin, built-in or not, is listed with its distribution, version, the hooks it implements, or its error.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any

import pluggy

from trainmeter_core import hookspecs
from trainmeter_core.model.records import PluginInfo

GROUP = "trainmeter"
AGENT_GROUP = "trainmeter.agent"
BUILTIN_DISTRIBUTION = "trainmeter"


class Distribution:
    """An installed distribution, as far as tm asks: its name and version, read from its metadata's first lines."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._headers: dict[str, str] | None = None

    def _header(self, key: str) -> str | None:
        if self._headers is None:
            self._headers = {}
            for name in ("METADATA", "PKG-INFO"):
                try:
                    with open(os.path.join(self.folder, name), encoding="utf-8", errors="replace") as f:
                        for line in f:
                            if not line.strip():
                                break  # the headers end at the first blank line
                            key_, sep, value = line.partition(":")
                            if sep and not line[:1].isspace():
                                self._headers.setdefault(key_.strip(), value.strip())
                    break
                except OSError:
                    continue
        return self._headers.get(key)

    @property
    def name(self) -> str | None:
        return self._header("Name")

    @property
    def version(self) -> str | None:
        return self._header("Version")


class EntryPoint:
    """One entry point a distribution declares (``name = module:attr``), imported only by ``load``."""

    __slots__ = ("dist", "group", "name", "value")

    def __init__(self, name: str, value: str, group: str, dist: Distribution) -> None:
        self.name, self.value, self.group, self.dist = name, value, group, dist

    def load(self) -> Any:
        module_name, _, attrs = self.value.partition(":")
        target = importlib.import_module(module_name.strip())
        for attr in attrs.split("[", 1)[0].strip().split("."):
            if attr:
                target = getattr(target, attr)
        return target


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _scan(path: tuple[str, ...]) -> list[EntryPoint]:
    """Every entry point of every distribution on ``path``: the first distribution of a name wins, as for Python's
    importlib.metadata. Read straight from each ``*.dist-info``/``*.egg-info`` folder's entry_points.txt: importing
    importlib.metadata (and the email parser it needs) would cost a launcher more than the scan itself."""
    found: list[EntryPoint] = []
    seen: set[str] = set()
    for base in path:
        try:
            names = os.listdir(base or ".")
        except OSError:
            continue
        # In the folder's own order, dist-info before egg-info: the order importlib.metadata finds them in.
        folders = [n for n in names if n.endswith(".dist-info")] + [
            n for n in names if n.endswith(".egg-info")
        ]
        for folder_name in folders:
            project = _normalized(folder_name.rpartition(".")[0].partition("-")[0])
            if project in seen:
                continue
            seen.add(project)
            folder = os.path.join(base or ".", folder_name)
            try:
                with open(os.path.join(folder, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            dist = Distribution(folder)
            group = None
            for raw in text.splitlines():
                line = raw.strip()
                if not line or line[0] in "#;":
                    continue
                if line.startswith("[") and line.endswith("]"):
                    group = line[1:-1].strip()
                    continue
                name, sep, value = line.partition("=")
                if sep and group is not None:
                    found.append(EntryPoint(name.strip(), value.strip(), group, dist))
    return found


# One scan of the installed distributions per process and import path: the launcher and the components process each
# need two groups of it.
_scanned: tuple[tuple[str, ...], list[EntryPoint]] | None = None


def _entry_points(group: str) -> list[EntryPoint]:
    global _scanned
    path = tuple(sys.path)
    if _scanned is None or _scanned[0] != path:
        _scanned = (path, _scan(path))
    seen: set[tuple[str, str]] = set()
    found = []
    for ep in _scanned[1]:
        if ep.group != group:
            continue
        key = (ep.name, ep.value)
        if key in seen:  # the same distribution visible twice on sys.path
            continue
        seen.add(key)
        found.append(ep)
    return found


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
