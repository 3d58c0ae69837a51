"""The unit tests: pure, in-process and fast. Each is marked ``unit``, and a guard fails one that starts a process,
opens a socket or imports torch, naming what it did: such a test belongs in integration/ or e2e/.

The guard watches collection (a module's top-level imports) and each test's setup, call and teardown. It raises
``pytest.fail``, which ``except Exception`` does not catch, and fails the test afterwards if the failure was swallowed.
"""

from __future__ import annotations

import _posixsubprocess
import builtins
import importlib
import multiprocessing.process
import os
import socket
import subprocess
import sys

import pytest
import zmq
from layers import mark_layer

ELSEWHERE = "unit tests are pure: a test that needs it belongs in tests/integration or tests/e2e"

# Every way the standard library starts a process ends in one of these (subprocess in _posixsubprocess.fork_exec or
# os.posix_spawn, multiprocessing in os.fork or fork_exec); Popen and Process.start are patched too, for a clearer
# message.
OS_PROCESS_STARTERS = [
    "fork", "forkpty", "posix_spawn", "posix_spawnp", "system",
    "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
    "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
]  # fmt: skip


def _is_torch(name: str) -> bool:
    return name == "torch" or name.startswith("torch.")


class PurityGuard:
    """While entered, starting a process, opening a socket or importing torch fails the test with what it did."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.broken: list[str] = []
        self._undo: list[tuple[object, str, object]] = []

    def refuse(self, what: str) -> None:
        self.broken.append(what)
        pytest.fail(f"{self.where} {what}; {ELSEWHERE}", pytrace=True)

    def _patch(self, owner: object, name: str, replacement: object) -> None:
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def __enter__(self) -> PurityGuard:
        self._torch_loaded = "torch" in sys.modules
        self._patch_processes()
        self._patch_sockets()
        self._patch_imports()
        return self

    def __exit__(self, *exc_info: object) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()
        if not self._torch_loaded and "torch" in sys.modules and not any("torch" in b for b in self.broken):
            self.broken.append("imported torch (it is in sys.modules afterwards)")

    def check(self) -> None:
        """Fail now if a refusal was swallowed by the code under test (a bare ``except:``)."""
        if self.broken:
            pytest.fail(f"{self.where} {'; '.join(self.broken)}; {ELSEWHERE}", pytrace=False)

    def _patch_processes(self) -> None:
        guard = self

        def execute_child(popen, args, *rest, **kwargs):
            guard.refuse(f"started a process: subprocess.Popen({args!r})")

        def fork_exec(args, *rest, **kwargs):
            guard.refuse(f"started a process: _posixsubprocess.fork_exec({args!r})")

        def start(process):
            guard.refuse(f"started a process: multiprocessing {type(process).__name__}.start()")

        self._patch(subprocess.Popen, "_execute_child", execute_child)
        self._patch(_posixsubprocess, "fork_exec", fork_exec)
        self._patch(multiprocessing.process.BaseProcess, "start", start)
        for name in OS_PROCESS_STARTERS:
            if hasattr(os, name):
                self._patch(os, name, self._refuser(f"started a process: os.{name}"))

    def _refuser(self, what: str):
        def refused(*args, **kwargs):
            self.refuse(f"{what}({', '.join(map(repr, args))})")

        return refused

    def _patch_sockets(self) -> None:
        guard = self
        socket_init = socket.socket.__init__
        zmq_socket_init = zmq.Socket.__init__

        def open_socket(sock, family=-1, type=-1, proto=-1, fileno=None):
            # A socket wrapped around a descriptor that exists already (socketpair, fromfd: asyncio's self-pipe) is
            # no new endpoint; only a fresh one is refused.
            if fileno is None:
                guard.refuse(f"opened a socket: socket.socket(family={family!r}, type={type!r})")
            socket_init(sock, family, type, proto, fileno)

        def open_zmq_socket(sock, context=None, socket_type=0, **kwargs):
            if not kwargs.get("shadow"):
                guard.refuse(f"opened a ZeroMQ socket: zmq.Socket(type={socket_type!r})")
            zmq_socket_init(sock, context, socket_type, **kwargs)

        self._patch(socket.socket, "__init__", open_socket)
        self._patch(zmq.Socket, "__init__", open_zmq_socket)

    def _patch_imports(self) -> None:
        guard = self
        plain_import = builtins.__import__
        import_module = importlib.import_module

        # The import statement calls builtins.__import__ even when the module is loaded already, so a test that
        # imports torch fails whether or not an earlier test in this process loaded it.
        def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
            if level == 0 and _is_torch(name):
                guard.refuse(f"imported torch: import {name}")
            return plain_import(name, globals, locals, fromlist, level)

        def guarded_import_module(name, package=None):
            if _is_torch(name):
                guard.refuse(f"imported torch: importlib.import_module({name!r})")
            return import_module(name, package)

        self._patch(builtins, "__import__", guarded_import)
        self._patch(importlib, "import_module", guarded_import_module)


def _guarded(where: str):
    guard = PurityGuard(where)
    with guard:
        result = yield
    guard.check()
    return result


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    if not isinstance(collector, pytest.Module):
        return (yield)
    guard = PurityGuard(f"unit test module {collector.path.name}")
    with guard:
        report = yield
    if guard.broken and report.passed:
        report.outcome = "failed"
        report.longrepr = f"{guard.where} {'; '.join(guard.broken)}; {ELSEWHERE}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _guarded(f"unit test {item.name} (setup)"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _guarded(f"unit test {item.name}"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    return (yield from _guarded(f"unit test {item.name} (teardown)"))


def pytest_itemcollected(item):
    mark_layer(item, "unit")
