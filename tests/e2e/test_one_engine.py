"""One engine per run: in a live run with its dashboard, exactly one process builds snapshots. Every ``Engine`` made in
any of tm's processes is written down (a ``sitecustomize`` on tm's path wraps its constructor), every snapshot on the
bus is captured by an independent subscriber, and the dashboard is asked for its snapshot mid-run."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from deadline import wait_for
from tm_runs import REPO, TM, log_records, only_run

CAPTURE = str(REPO / "tests" / "scripts" / "capture_snapshots.py")
LOOP = """
import os, sys, time
from trainmeter_agent import emit
step = 0
while not os.path.exists(sys.argv[1]):
    step += 1
    emit(step=step, tokens=2048, train_loss=4.0 / step)
    time.sleep(0.05)
"""
# Loaded by every Python process tm starts (the launcher, its components, the web process): each Engine constructed
# appends the pid of the process that made it.
SITECUSTOMIZE = """
import importlib.abc, importlib.machinery, os, sys

LOG = os.environ.get("TM_TEST_ENGINE_LOG")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "trainmeter_core.model.engine.engine":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            init = module.Engine.__init__

            def noted(self, *args, **kwargs):
                with open(LOG, "a") as f:
                    f.write(f"{os.getpid()}\\n")
                init(self, *args, **kwargs)

            module.Engine.__init__ = noted

        spec.loader.exec_module = exec_module
        return spec


if LOG:
    sys.meta_path.insert(0, _Finder())
"""


def with_web_entry_point(env: dict, tmp_path: Path) -> None:
    """The ``web`` entry point, visible even before the checkout was reinstalled (as in the browser tests)."""
    if "web" in {ep.name for ep in md.entry_points(group="trainmeter")}:
        return
    info = tmp_path / "ep" / "trainmeter_web_test-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trainmeter-web-test\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[trainmeter]\nweb = trainmeter_web.plugin\n")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(info.parent), env.get("PYTHONPATH", "")) if p)


def without_wall_windows(snapshot: dict) -> dict:
    """The dashboard adds each metric's window in wall time beside the engine's monotonic one; nothing else."""
    out = dict(snapshot)
    out["metrics"] = {
        key: {k: v for k, v in metric.items() if k not in ("window_start_wall", "window_end_wall")}
        for key, metric in snapshot["metrics"].items()
    }
    return out


@pytest.mark.heavy
@pytest.mark.xdist_group("heavy")
def test_in_a_live_run_only_the_engine_component_builds_snapshots_and_the_dashboard_serves_them(
    tm_env, tmp_path
):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    engines = tmp_path / "engines.txt"
    env = dict(tm_env, TM_TEST_ENGINE_LOG=str(engines), TM_HOST_INTERVAL_S="0.5")
    # Long enough that the launcher never replays the end itself: that fallback is for an engine that is gone.
    env["TM_ENGINE_FINAL_WAIT_S"] = "30"
    with_web_entry_point(env, tmp_path)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook), env.get("PYTHONPATH", "")) if p)
    script, stop = tmp_path / "loop.py", tmp_path / "stop"
    script.write_text(LOOP)
    proc = subprocess.Popen(
        [TM, "--port", "0", str(script), str(stop)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    try:
        port = int(
            wait_for(
                lambda: re.search(r"dashboard http://localhost:(\d+)/", "".join(lines)), what="the dashboard"
            ).group(1)
        )
        run = only_run(tmp_path / "runs")
        out = tmp_path / "live.jsonl"
        capture_env = {k: v for k, v in env.items() if k != "TM_TEST_ENGINE_LOG"}
        sub = subprocess.Popen([sys.executable, CAPTURE, str(run), str(out)], env=capture_env)
        captured = lambda: out.read_text().splitlines()[1:] if out.exists() else []  # noqa: E731
        wait_for(lambda: len(captured()) >= 2, what="two snapshots on the bus")

        def served():
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/api/snapshot", headers={"Host": f"localhost:{port}"}
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                doc = json.loads(response.read())
            return doc if doc.get("steps") else None

        dashboard = wait_for(served, what="the dashboard's snapshot with steps")
        stop.touch()
        assert proc.wait(120) == 0, "".join(lines)
        assert sub.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    live = [json.loads(line) for line in captured()]
    started = {
        r["name"]: r["child_pid"]
        for r in log_records(run)
        if r["kind"] == "component" and r["event"] == "started"
    }
    engine_pid, web_pid = started["engine"], started["web"]
    assert engine_pid != web_pid  # the web component has a process of its own
    # Every snapshot on the bus, the final one included, came from the engine component's process.
    assert live[-1]["final"] is True
    assert {(s["source"], s["pid"]) for s in live} == {("engine", engine_pid)}
    # One Engine was made in all of tm's processes, and it was the engine component's: none in the web process, none
    # in the launcher.
    assert engines.read_text().split() == [str(engine_pid)]
    # The dashboard served exactly a snapshot the engine published.
    (same,) = [s for s in live if s["through_seq"] == dashboard["through_seq"]]
    assert without_wall_windows(dashboard) == same


@pytest.mark.heavy
@pytest.mark.xdist_group("heavy")
def test_without_an_engine_the_launcher_replays_the_end_itself_and_publishes_the_final_snapshot(
    tm_env, tmp_path
):
    env = dict(tm_env, TM_DISABLE_COMPONENTS="engine,web")
    script, stop = tmp_path / "loop.py", tmp_path / "stop"
    script.write_text(LOOP)
    proc = subprocess.Popen(
        [TM, str(script), str(stop)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        runs = tmp_path / "runs"
        run = wait_for(
            lambda: runs.exists() and any(runs.iterdir()) and only_run(runs), what="the run directory"
        )
        wait_for(
            lambda: (run / "endpoints.json").exists() and (run / "meta.json").exists(), what="the endpoints"
        )
        out = tmp_path / "live.jsonl"
        sub = subprocess.Popen([sys.executable, CAPTURE, str(run), str(out)], env=env)
        wait_for(lambda: out.exists() and out.read_text().startswith("ready"), what="the subscriber")
        wait_for(lambda: any(r["kind"] == "tick" for r in log_records(run, live=True)), what="a tick")
        stop.touch()
        assert proc.wait(120) == 0
        assert sub.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    live = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    launcher_pid = json.loads((run / "endpoints.json").read_text())["launcher_pid"]
    # No engine ran: the one snapshot on the bus is the launcher's replay of the log, the final one.
    assert [(s["final"], s["pid"]) for s in live] == [(True, launcher_pid)]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["snapshot"]["final"] is True and summary["snapshot"]["steps"] == summary["steps"] > 0
