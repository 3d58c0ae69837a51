"""What the launcher tells a training process: its environment (ranks, the launcher's pid, ``--no-tap``) and the list
of ``trainmeter.agent`` plugins it writes in the run directory; and the ``hello`` that says who the process is.

It imports neither the bootstrap, the agent nor the tap loader, so all three read it (only ``tracker_names`` reads the
built-in taps' names); it is read at the start, at the first record, at a tracker's import and at exit.
"""

from __future__ import annotations

import os
import sys

#: Tracker modules whose import loads the tracker taps (the plugins the launcher lists may add their own names).
TRACKER_MODULES = ("wandb", "tensorboardX", "torch.utils.tensorboard", "mlflow")
#: The launcher's list of the ``trainmeter.agent`` entry points, in the run directory.
PLUGIN_LIST = "agent-plugins.json"


def listed_names() -> list[str]:
    """The entry point names in the launcher's plugin list for this run, loading nothing: from the environment the
    launcher gives the command, else from the list's file in the run directory."""
    run_dir = os.environ.get("TM_RUN_DIR")
    if not run_dir or os.environ.get("TM_NO_TAP") == "1":
        return []
    names = os.environ.get("TM_AGENT_PLUGIN_NAMES")
    if names is not None:
        return [name for name in names.split("\n") if name]
    path = os.path.join(run_dir, PLUGIN_LIST)
    if not os.path.exists(path):
        return []
    try:
        import json  # here, not at the top: the bootstrap runs before the user's code and imports this module

        with open(path, encoding="utf-8") as listing:
            return [str(e["name"]) for e in json.load(listing) if isinstance(e, dict) and "name" in e]
    except Exception:
        return []


def plugin_entries() -> tuple[list[dict], str]:
    """The ``trainmeter.agent`` entry points, from the launcher's list or (without one) package metadata."""
    run_dir = os.environ.get("TM_RUN_DIR")
    if run_dir:
        import json

        try:
            with open(os.path.join(run_dir, PLUGIN_LIST), encoding="utf-8") as listing:
                entries = json.load(listing)
            return [
                e for e in entries if isinstance(e, dict) and isinstance(e.get("value"), str)
            ], PLUGIN_LIST
        except FileNotFoundError:
            pass
    from importlib import metadata

    entries = []
    for entry in metadata.entry_points(group="trainmeter.agent"):
        dist = getattr(entry, "dist", None)
        entries.append(
            {
                "name": entry.name,
                "value": entry.value,
                "distribution": dist.metadata["Name"] if dist is not None else None,
                "version": dist.version if dist is not None else None,
            }
        )
    return entries, "package metadata"


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
