"""Starting tm's components beside a running command: where each runs (built-in shared ones as threads of one
process, the rest in processes of their own), the dashboard's port, and the watch for Python processes whose agent
never said hello.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from trainmeter_core.bus.hub import Hub
from trainmeter_core.model import records
from trainmeter_core.run.child import Child, agent_boot_dir, lower_own_priority
from trainmeter_core.run.stderr_lines import Say

if TYPE_CHECKING:
    from trainmeter_core.bus.supervisor import Placement
    from trainmeter_core.run.run_options import RunOptions


def plan_placements(plugins) -> list[Placement]:
    """Built-in shared components run as threads of one process; the rest each get their own process.

    ``TM_OWN_PROCESS=name,name`` moves named built-ins into processes of their own (a placement, not a code change).
    """
    from trainmeter_core.bus.supervisor import Placement

    own = {n for n in os.environ.get("TM_OWN_PROCESS", "").split(",") if n}
    disabled = {n for n in os.environ.get("TM_DISABLE_COMPONENTS", "").split(",") if n}
    shared: list[str] = []
    placements: list[Placement] = []
    seen: set[str] = set()
    for hook in ("trainmeter_components", "trainmeter_sinks"):
        for plugin_name, classes in plugins.per_plugin(hook):
            for cls in classes:
                name = getattr(cls, "name", "")
                if not name or name in seen or name in disabled:
                    continue
                seen.add(name)
                if plugin_name in plugins.builtin and getattr(cls, "shared", False) and name not in own:
                    shared.append(name)
                else:
                    placements.append(Placement(process=name, components=[name]))
    if shared:
        placements.insert(0, Placement(process="components", components=shared))
    return placements


def start_components(opts: RunOptions, plugins, hub: Hub, child: Child, run_dir: Path, say: Say, watch_stop):
    """The silence watch, the web port and the component processes, for a command that is still running (or failed)."""
    from trainmeter_core.bus.supervisor import Supervisor
    from trainmeter_core.run import webport

    if opts.agent:
        watch_silence(child, hub, say, watch_stop)
    if opts.gpus:
        os.environ["TM_GPUS"] = opts.gpus  # the components inherit it; the child already started without it
    os.environ.update(opts.component_env)  # likewise: secrets such as a webhook URL never reach the training
    lower_own_priority()
    placements = plan_placements(plugins)
    web = None
    if opts.web and any("web" in p.components for p in placements):
        try:
            web = webport.bind(opts.host, opts.port)
        except webport.WebPortError as exc:
            say(str(exc), always=True)
        else:
            os.environ["TM_WEB_FD"] = str(web.sock.fileno())
            if web.token:
                os.environ["TM_WEB_TOKEN"] = web.token
    else:
        placements = [p for p in placements if "web" not in p.components]
    supervisor = Supervisor(
        run_dir, placements, lambda r: hub.inject(_launcher(r)), pass_fds=(web.sock.fileno(),) if web else ()
    )
    # The dashboard's socket must outlive this function: every incarnation of the web process is handed its fd.
    supervisor.web_port = web
    supervisor.start()
    if web is not None:
        for line in web.startup_lines():
            say(line)
    say(f"run {run_dir.name} in {run_dir.parent}")
    return supervisor


def watch_silence(child: Child, hub: Hub, say: Say, stop: threading.Event) -> None:
    """Say once, for each Python process of the run whose agent never said hello, why and what fixes it."""

    def report(line: str) -> None:
        say(line)
        hub.inject(records.Notice(level="warning", topic="agent", message=line, source="launcher"))

    from trainmeter_core.run.silence import SilenceWatch

    SilenceWatch(
        child.pid,
        said_hello=lambda pid: pid in hub.hello_pids,
        anyone_said_hello=lambda: bool(hub.hello_pids),
        report=report,
        boot_dir=str(agent_boot_dir()),
        tm_python=sys.executable,
    ).start(stop)


def _launcher(record: records.Record) -> records.Record:
    record.source = record.source or "launcher"
    return record


def _launcher(record: records.Record) -> records.Record:
    record.source = record.source or "launcher"
    return record
