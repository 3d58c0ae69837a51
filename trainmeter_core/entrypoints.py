"""The installed distributions' entry points, read straight from their metadata folders; it imports no pluggy.

The launcher writes the agent's plugin list from it before the training command starts (so the agent never starts
without that list), and the plugin manager (``trainmeter_core.plugins``) loads its groups from the same one scan.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any

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
