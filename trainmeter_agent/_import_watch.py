"""Runs the agent's callbacks right after the user's code has imported a module (torch, a tracker, a trainer).

A ``sys.meta_path`` finder that lets the other finders find the module and wraps only the loader's ``exec_module``:
the module's own code runs first and untouched (its errors are the user's), then the callbacks, each guarded. It
never imports a watched module itself, and leaves ``sys.meta_path`` once nothing is left to watch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

Callback = Callable[[object], None]


def imported(name: str) -> object | None:
    """The module if it is imported and finished initialising, else None."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    if module is None or getattr(spec, "_initializing", False):
        return None
    return module


class ModuleWatcher:
    """Calls ``callback(module)`` once each watched module has been imported by someone else."""

    def __init__(self, on_error: Callable[[str, BaseException], None]) -> None:
        self._watched: dict[str, list[tuple[str, Callback]]] = {}
        self._searching: set[str] = set()
        self._on_error = on_error  # (probe, exception): a failing callback stops its probe only
        self._installed = False

    def watch(self, name: str, probe: str, callback: Callback) -> None:
        """Run ``callback`` now if ``name`` is imported, else right after its import finishes."""
        module = imported(name)
        if module is not None:
            self._run(probe, callback, module)
            return
        self._watched.setdefault(name, []).append((probe, callback))
        if not self._installed:
            sys.meta_path.insert(0, self)
            self._installed = True

    def _run(self, probe: str, callback: Callback, module: object) -> None:
        try:
            callback(module)
        except Exception as exc:
            self._on_error(probe, exc)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self._watched or fullname in self._searching:
            return None
        try:
            self._searching.add(fullname)
            try:
                spec = None
                for finder in list(sys.meta_path):
                    find = getattr(finder, "find_spec", None)
                    if finder is self or find is None:
                        continue
                    spec = find(fullname, path, target)
                    if spec is not None:
                        break
            finally:
                self._searching.discard(fullname)
            if spec is None or spec.loader is None:
                return None  # not installed: the import fails as it would without tm
            original = getattr(spec.loader, "exec_module", None)
            if original is None:
                return None
            callbacks = self._watched.pop(fullname)
            self._leave_if_done()
            spec.loader.exec_module = self._wrap(spec.loader, original, fullname, callbacks)
            return spec
        except Exception as exc:
            for probe, _ in self._watched.pop(fullname, []):
                self._on_error(probe, exc)
            self._leave_if_done()
            return None

    def _leave_if_done(self) -> None:
        if self._watched or not self._installed:
            return
        self._installed = False
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def _wrap(self, loader, original, fullname: str, callbacks: list[tuple[str, Callback]]):
        watcher = self

        def exec_module(module):
            if getattr(module, "__name__", None) != fullname:
                return original(module)
            try:
                del loader.exec_module  # back to the loader's own method: a reload is not watched again
            except AttributeError:
                pass
            original(module)
            for probe, callback in callbacks:
                watcher._run(probe, callback, module)

        return exec_module
