"""A killed component process is restarted, says so on the bus, and costs the training and the log nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from deadline import wait_for
from tm_runs import REPO, TM, log_records, only_run, run_tm

LOOP = str(REPO / "tests" / "scripts" / "emit_loop.py")


def live_log(run_dir):
    try:
        return log_records(run_dir)
    except (OSError, ValueError):  # a line being written right now
        return []


def first_pid(records, process):
    for r in records:
        if r["kind"] == "component" and r["process"] == process and r["event"] in ("started", "restarted"):
            return r["child_pid"]
    return None


@pytest.mark.xdist_group("heavy")
@pytest.mark.parametrize("process", ["components", "host"])
def test_kill_9_of_a_component_process_restarts_it_and_loses_nothing(tm_env, tmp_path, process):
    env = dict(tm_env, TM_HOST_INTERVAL_S="0.2")
    if process == "host":
        env["TM_OWN_PROCESS"] = (
            "host"  # the host sampler in a process of its own: a placement, not a code change
        )
    steps = 80
    proc = subprocess.Popen(
        [TM, "--", sys.executable, LOOP, str(steps), "0.1", str(tmp_path / "done")],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs = tmp_path / "runs"
    run = wait_for(lambda: runs.exists() and any(runs.iterdir()) and only_run(runs), what="the run directory")
    wait_for(lambda: any(r["kind"] == "sample.host" for r in live_log(run)), what="a first host sample")
    pid = first_pid(live_log(run), process)
    assert pid is not None
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    def restarted():
        recs = live_log(run)
        crash = [
            r
            for r in recs
            if r["kind"] == "component" and r["event"] == "crashed" and r["process"] == process
        ]
        again = [
            r
            for r in recs
            if r["kind"] == "component" and r["event"] == "restarted" and r["process"] == process
        ]
        if not (crash and again):
            return None
        later = [r for r in recs if r["kind"] == "sample.host" and r["seq"] > again[0]["seq"]]
        return (crash[0], again[0]) if later else None

    crash, again = wait_for(restarted, what="the crash, the restart and host samples after it")
    assert crash["signal"] == signal.SIGKILL and crash["child_pid"] == pid
    assert again["child_pid"] != pid
    print(f"restart of {process} seen in the log {time.monotonic() - killed_at:.2f} s after kill -9")
    assert proc.wait(60) == 0, proc.stderr.read()
    assert (tmp_path / "done").read_text() == f"done {steps}\n"
    recs = log_records(run)
    assert [r["step"] for r in recs if r["kind"] == "step"] == list(range(1, steps + 1))
    metrics = [r for r in recs if r["kind"] == "metric"]
    assert len(metrics) == steps
    summary = (run / "summary.json").read_text()
    assert '"steps": 80' in summary


@pytest.mark.xdist_group("heavy")
def test_kill_9_of_the_launcher_leaves_the_training_running_and_the_run_lost(tm_env, tmp_path):
    steps = 40
    done = tmp_path / "done"
    proc = subprocess.Popen(
        [TM, "--", sys.executable, LOOP, str(steps), "0.1", str(done)],
        env=tm_env,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # so the test can tell tm's processes from its own
    )
    runs = tmp_path / "runs"
    run = wait_for(lambda: runs.exists() and any(runs.iterdir()) and only_run(runs), what="the run directory")
    wait_for(lambda: any(r["kind"] == "step" for r in live_log(run)), what="a first step")
    component_pids = wait_for(
        lambda: {r["child_pid"] for r in live_log(run) if r["kind"] == "component" and r.get("child_pid")},
        what="the components' start records",
    )
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for(done.exists, what="the training to finish on its own")
    assert done.read_text() == f"done {steps}\n"

    def gone(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A zombie is gone in every way that matters (its parent, the test's init, reaps it later).
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"

    wait_for(lambda: all(gone(p) for p in component_pids), what="every tm component process to exit")
    listing = run_tm(["runs"], tm_env)
    assert run.name in listing.stdout
    line = next(line for line in listing.stdout.splitlines() if run.name in line)
    assert " lost " in line


def test_a_component_that_returns_on_its_own_is_stopped_not_restarted(tm_env, tmp_path):
    # A plugin's component with nothing to do (a sink without its setting, say) returns at once: its process exits 0.
    # That is a finish, said once as "stopped", not a crash to restart with backoff until the run ends.
    result = _run_beside_a_plugin_component(tm_env, tmp_path, "done-early", "        return\n", sleep_s=3)
    assert result.returncode == 0, result.stderr
    said = [
        r
        for r in log_records(only_run(tmp_path / "runs"))
        if r["kind"] == "component" and r["name"] == "done-early"
    ]
    assert [r["event"] for r in said] == ["started", "stopped"]
    # Its process exited by itself while the run went on (the supervisor saw exit code 0), not at the run's end: the
    # process's main thread is woken by its last component's end (it looked every 0.5 s before; never sleeps 60 s)
    assert said[-1].get("exit_code") == 0, said[-1]


@pytest.mark.xdist_group("heavy")
def test_a_component_process_that_does_not_stop_is_killed_said_and_its_wait_timed(tm_env, tmp_path):
    # A component process that ignores the stop (here: stopped with SIGSTOP, so SIGTERM waits; only SIGKILL ends it)
    # holds tm's exit for the supervisor's 3 s, which a scheduler's kill waits for: tm says so, and the summary's
    # tm_end_s puts the time in its stage.
    env = dict(tm_env, TM_DISABLE_COMPONENTS="web")
    proc = subprocess.Popen(
        [TM, "--", sys.executable, LOOP, "30", "0.05", str(tmp_path / "done")],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs = tmp_path / "runs"
    run = wait_for(lambda: runs.exists() and any(runs.iterdir()) and only_run(runs), what="the run directory")
    pid = wait_for(lambda: first_pid(live_log(run), "components"), what="the components process")
    os.kill(pid, signal.SIGSTOP)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "tm: the components process (" in stderr, stderr
    assert "did not stop within 3 s of SIGTERM and was killed" in stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["tm_end_s"]["components"] == pytest.approx(3.0, abs=0.5), summary["tm_end_s"]
    assert "tm: ending the run took " in stderr and "components 3." in stderr, stderr


@pytest.mark.xdist_group("heavy")
def test_a_component_that_ignores_the_stop_is_named_with_where_it_was_before_its_process_ends(
    tm_env, tmp_path
):
    # A plugin's component that never looks at ctx.stopping: its process waits for it 2.5 s, then says which
    # component it was and where, and ends without it, before the supervisor's kill at 3 s (which would say nothing
    # of where).
    run_body = "        import time\n\n        while True:\n            time.sleep(0.05)\n"
    result = _run_beside_a_plugin_component(tm_env, tmp_path, "stubborn", run_body, sleep_s=2)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "component stubborn did not stop" in line]
    assert len(said) == 1, result.stderr
    assert "within 2.5 s of the stop" in said[0] and "tm_stubborn.py:" in said[0] and " in run" in said[0], (
        said
    )
    assert "was killed" not in result.stderr, result.stderr
    ended_s = json.loads((only_run(tmp_path / "runs") / "summary.json").read_text())["tm_end_s"]["components"]
    assert 2.3 < ended_s < 2.95, ended_s


@pytest.mark.xdist_group("heavy")
def test_a_component_process_stopped_while_it_loads_its_plugin_ends_at_once(tm_env, tmp_path):
    # A plugin whose hook takes 8 s in its component's process (a slow import, at the lowered priority of a busy
    # machine): the command ends after 1 s, so the stop comes while that process loads. Nothing of it ran, so it ends
    # then, instead of loading on until the supervisor's kill at 3 s.
    hook_body = (
        "    import sys, time\n\n"
        "    if 'slowload' in sys.argv:  # its own process, not tm's or the other components'\n"
        "        time.sleep(8)\n"
    )
    result = _run_beside_a_plugin_component(
        tm_env, tmp_path, "slowload", "        ctx.stopping.wait()\n", sleep_s=1, hook_body=hook_body
    )
    assert result.returncode == 0, result.stderr
    assert "was killed" not in result.stderr, result.stderr
    records = log_records(only_run(tmp_path / "runs"))
    assert any(r["kind"] == "component" and r["name"] == "slowload" for r in records), (
        "its process never started"
    )
    ended_s = json.loads((only_run(tmp_path / "runs") / "summary.json").read_text())["tm_end_s"]["components"]
    assert ended_s < 2.0, ended_s


def _run_beside_a_plugin_component(
    tm_env, tmp_path, name: str, run_body: str, sleep_s: float, hook_body: str = ""
):
    """tm over a command that sleeps ``sleep_s``, with a plugin's component ``name`` (its own process) whose ``run``
    is ``run_body``, from a distribution ``tm-<name>`` installed in a folder of this test's; the dashboard off.
    ``hook_body`` runs first in the plugin's ``trainmeter_components`` hook (in every process that loads plugins)."""
    from test_plugins import fake_distribution

    module = "tm_" + name.replace("-", "_")
    site = tmp_path / "site"
    fake_distribution(
        site,
        f"tm-{name}",
        f"[trainmeter]\n{module.removeprefix('tm_')} = {module}\n",
        "from trainmeter_core.api import hookimpl\n\n"
        "class Plugged:\n"
        f"    name = {name!r}\n"
        "    subscribes = ()\n"
        "    shared = False\n\n"
        "    def run(self, ctx):\n"
        f"{run_body}\n"
        "@hookimpl\n"
        "def trainmeter_components():\n"
        f"{hook_body}"
        "    return [Plugged]\n",
    )
    env = dict(tm_env, PYTHONPATH=str(site), TM_DISABLE_COMPONENTS="web")
    return run_tm(["--", sys.executable, "-c", f"import time; time.sleep({sleep_s})"], env)
