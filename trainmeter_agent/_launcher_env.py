"""What the launcher told this process through its environment (its ranks, the taps it may attach, the launcher's
pid), and the ``hello`` record that says who the process is to the run.

Read when the first record goes out or at exit, never per iteration; trainmeter_core is imported only by ``hello``.
"""

from __future__ import annotations

import os
import sys

from trainmeter_agent._plugin_list import listed_names


def env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def launcher_alive() -> bool:
    pid = env_int("TM_LAUNCHER_PID")
    if pid is None or pid <= 0:
        return True  # not told: assume a live hub and let the producer's bounded linger decide
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, under another user
        return True
    return True


def tracker_names() -> list[str]:
    """The taps this process may attach: the launcher's list and the built-in ones (none with ``--no-tap``)."""
    if os.environ.get("TM_NO_TAP") == "1":
        return []
    from trainmeter_agent.taps import BUILTIN

    return list(dict.fromkeys([*listed_names(), *BUILTIN]))


def hello_record(records, role: str):
    """The process's ``hello``: its command line (redacted), its interpreter, its role and ranks, its trackers.
    ``records`` is ``trainmeter_core.model.records``, which the agent imports on its first record."""
    from trainmeter_core import __version__
    from trainmeter_core.model.redaction import redact_argv

    argv = list(getattr(sys, "orig_argv", None) or sys.argv)
    return records.Hello(
        protocol=records.PROTOCOL_VERSION,
        agent_version=__version__,
        python=sys.version.split()[0],
        executable=sys.executable,
        argv=redact_argv(argv),
        ppid=os.getppid(),
        role=role,
        local_rank=env_int("LOCAL_RANK"),
        world_size=env_int("WORLD_SIZE"),
        local_world_size=env_int("LOCAL_WORLD_SIZE"),
        node_rank=env_int("GROUP_RANK") if "GROUP_RANK" in os.environ else env_int("NODE_RANK"),
        trackers=tracker_names(),
    )
