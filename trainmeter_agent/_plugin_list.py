"""Which tracker libraries and ``trainmeter.agent`` plugins a process of this run watches for: the launcher's plugin
list (``agent-plugins.json`` in the run directory, or its names in the environment) and the trackers tm knows.

It imports no other module of the agent, so the bootstrap, the agent and the tap loader can all read it.
"""

from __future__ import annotations

import os

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
