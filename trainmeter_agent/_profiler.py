"""Notices where torch.profiler writes its traces, so that tm imports them when the run ends, without a flag.

Every ``on_trace_ready`` handler that saves a Chrome trace ends in ``profile.export_chrome_trace(path)``
(``tensorboard_trace_handler`` included): that call is wrapped, runs first and untouched, and then the folder it
wrote to is said once as the ``profiler.trace_dir`` fact. It never reads a trace, never blocks, and a failure of its
own stops this probe only.
"""

from __future__ import annotations

import functools
import os

PROFILER_DIR_FACT = "profiler.trace_dir"
MAX_FOLDERS = 64


def attach(agent, profiler) -> None:
    """Wrap ``torch.profiler.profile.export_chrome_trace`` (the module is passed in, never imported here)."""
    profile = getattr(profiler, "profile", None)
    original = getattr(profile, "export_chrome_trace", None)
    if original is None:
        agent.probe_state("profiler", "not attached: torch.profiler.profile has no export_chrome_trace")
        return
    if getattr(original, "_tm_wrapped", False):
        return
    said: set[str] = set()

    @functools.wraps(original)
    def export_chrome_trace(self, path, *args, **kwargs):
        result = original(self, path, *args, **kwargs)
        if "profiler" not in agent.stopped:
            try:
                agent.check_fault("profiler")
                folder = os.path.dirname(os.path.abspath(os.fspath(path)))
                if folder not in said and len(said) < MAX_FOLDERS:
                    said.add(folder)
                    agent.fact(
                        PROFILER_DIR_FACT, folder, "profiler", note="tm imports its traces at the run's end"
                    )
            except Exception as exc:
                agent.stop_probe("profiler", exc)
        return result

    export_chrome_trace._tm_wrapped = True  # type: ignore[attr-defined]
    profile.export_chrome_trace = export_chrome_trace
    agent.probe_state("profiler", "attached")
