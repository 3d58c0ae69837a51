"""At a terminal, the command gets the foreground (Ctrl-C and breakpoint() behave as without tm), and tm takes it back."""

from __future__ import annotations

import os
import pty
import select
import sys
import time

import pytest
from tm_runs import TM


def run_in_pty(
    argv: list[str], env: dict[str, str], send: bytes | None = None, after: bytes = b""
) -> tuple[int, str]:
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session leader whose controlling terminal is the pty, like a login shell
        os.execve(argv[0], argv, env)
    out = b""
    sent = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the other side closed
                break
            if not chunk:
                break
            out += chunk
        if send is not None and not sent and after in out:
            os.write(fd, send)
            sent = True
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


@pytest.mark.xdist_group("heavy")
def test_the_command_owns_the_terminal_and_tm_takes_it_back(tm_env):
    code = "import os; print('FG', os.tcgetpgrp(0) == os.getpgrp(), os.getpgrp() == os.getpid(), flush=True)"
    status, out = run_in_pty([TM, "--", sys.executable, "-c", code], tm_env)
    assert status == 0, out
    assert "FG True True" in out  # its own process group, and the foreground one


@pytest.mark.xdist_group("heavy")
def test_ctrl_c_at_the_terminal_interrupts_the_command_as_without_tm(tm_env):
    code = (
        "import time\n"
        "try:\n    print('READY', flush=True)\n    time.sleep(30)\n"
        "except KeyboardInterrupt:\n    print('INTERRUPTED', flush=True)\n    raise SystemExit(130)\n"
    )
    status, out = run_in_pty([TM, "--", sys.executable, "-c", code], tm_env, send=b"\x03", after=b"READY")
    assert "INTERRUPTED" in out, out
    assert status == 130
    assert "Traceback" not in out
    assert "finished" in out  # tm itself was not interrupted: it printed its summary line
