"""The guard of tests/unit/conftest.py: a planted unit test that starts a process, opens a socket or imports torch
fails with a message naming what it did, wherever it does it (the test, a fixture, the module's top, a swallowed
refusal); a pure one passes, marked ``unit``, and the guard leaves the interpreter as it found it.

Each planted file runs under a copy of the guard in pytester's own folder, in this process: the guard refuses before
anything starts, so no planted process, socket or torch import ever happens.
"""

from __future__ import annotations

import builtins
import socket
import subprocess
from pathlib import Path

import pytest

GUARD = Path(__file__).with_name("conftest.py")
PURE_ELSEWHERE = "unit tests are pure: a test that needs it belongs in tests/integration or tests/e2e"


def run_planted(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makeconftest(GUARD.read_text())
    # A stand-in torch beside the planted file: should the guard let an import through, it loads this empty package
    # rather than torch itself (which cannot be loaded twice in one process once pytester has unloaded it).
    pytester.mkpydir("torch").joinpath("nn.py").write_text("")
    pytester.makepyfile(test_planted=source)
    return pytester.runpytest_inprocess("-p", "no:xdist", "-p", "no:cacheprovider", "-q", *args)


def test_a_pure_test_passes_and_is_marked_unit(pytester):
    source = """
import asyncio

def test_pure(tmp_path):
    (tmp_path / "a.txt").write_text("files are fine")
    assert asyncio.run(asyncio.sleep(0, result=2)) == 2  # the loop's self-pipe is a socketpair, not an endpoint
"""
    result = run_planted(pytester, source, "-m", "unit")
    result.assert_outcomes(passed=1)


IMPURE = {
    "subprocess": (
        "import subprocess\nsubprocess.run(['true'])",
        "started a process: subprocess.Popen(['true'])",
    ),
    "os.system": ("import os\nos.system('true')", "started a process: os.system('true')"),
    # Should the guard let them through, the forked child exits at once and the exec finds no file: a planted test
    # never takes over the process that runs this one.
    "os.fork": ("import os\nif os.fork() == 0:\n    os._exit(0)", "started a process: os.fork()"),
    "os.execv": (
        "import os\nos.execv('/nonexistent/tm-probe', ['tm-probe'])",
        "started a process: os.execv('/nonexistent/tm-probe', ['tm-probe'])",
    ),
    "multiprocessing": (
        "import multiprocessing\nmultiprocessing.Process(target=print).start()",
        "started a process: multiprocessing Process.start()",
    ),
    "socket": ("import socket\nsocket.socket()", "opened a socket: socket.socket("),
    "tcp connection": (
        "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
        "opened a socket: socket.socket(family=<AddressFamily.AF_INET",
    ),
    "zmq": (
        "import zmq\ncontext = zmq.Context()\ntry:\n    context.socket(zmq.PUSH)\nfinally:\n    context.destroy(linger=0)",
        "opened a ZeroMQ socket: zmq.Socket(type=<SocketType.PUSH: 8>)",
    ),
    "import torch": ("import torch", "imported torch: import torch"),
    "from torch import": ("from torch import nn", "imported torch: import torch"),
    "import_module": (
        "import importlib\nimportlib.import_module('torch.nn')",
        "imported torch: importlib.import_module('torch.nn')",
    ),
}


def indented(code: str) -> str:
    return "\n".join("    " + line for line in code.splitlines())


@pytest.mark.parametrize("what", list(IMPURE))
def test_an_impure_unit_test_fails_naming_what_it_did(pytester, what):
    code, named = IMPURE[what]
    result = run_planted(pytester, f"def test_impure():\n{indented(code)}\n")
    result.assert_outcomes(failed=1)
    assert f"unit test test_impure {named}" in result.stdout.str()
    assert PURE_ELSEWHERE in result.stdout.str()


def test_a_refusal_the_code_swallows_still_fails_the_test(pytester):
    source = """
import subprocess

def test_swallows():
    try:
        subprocess.run(["true"])
    except BaseException:
        pass
"""
    result = run_planted(pytester, source)
    result.assert_outcomes(failed=1)
    assert "unit test test_swallows started a process: subprocess.Popen(['true'])" in result.stdout.str()


def test_torch_loaded_earlier_in_the_process_is_still_refused(pytester):
    source = """
import sys
import types

def test_imports_a_loaded_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    import torch
"""
    result = run_planted(pytester, source)
    result.assert_outcomes(failed=1)
    assert "unit test test_imports_a_loaded_torch imported torch: import torch" in result.stdout.str()


def test_a_fixture_that_opens_a_socket_fails_the_setup(pytester):
    source = """
import socket
import pytest

@pytest.fixture
def server():
    return socket.socket()

def test_uses_a_server(server):
    pass
"""
    result = run_planted(pytester, source)
    result.assert_outcomes(errors=1)
    assert "unit test test_uses_a_server (setup) opened a socket" in result.stdout.str()


def test_a_module_that_imports_torch_at_its_top_fails_to_collect(pytester):
    result = run_planted(pytester, "import torch\n\ndef test_never_runs():\n    pass\n")
    result.assert_outcomes(errors=1)
    assert "unit test module test_planted.py imported torch: import torch" in result.stdout.str()


def test_the_guard_puts_back_what_it_replaced(pytester):
    import importlib
    import multiprocessing.process
    import os

    import zmq

    def watched():
        return (
            subprocess.Popen._execute_child,
            multiprocessing.process.BaseProcess.start,
            os.fork,
            os.posix_spawn,
            socket.socket.__init__,
            zmq.Socket.__init__,
            builtins.__import__,
            importlib.import_module,
        )

    before = watched()
    result = run_planted(pytester, "import subprocess\n\ndef test_impure():\n    subprocess.run(['true'])\n")
    result.assert_outcomes(failed=1)
    assert watched() == before  # this test's own guard's replacements, as they were before the planted run
