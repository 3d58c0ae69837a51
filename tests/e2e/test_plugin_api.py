"""The public plugin API: one dependency-free ``hookimpl`` that pluggy reads as its own, a ``trainmeter_core.api`` that
is cheap to import and resolves each name to its one definition, tm's own pieces following the Protocols, and a
tracker tap, a sink and a platform adapter written from the Protocols alone that load and work in real runs."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

import pluggy
import pytest
from test_plugins import fake_distribution
from tm_runs import REPO, log_records, only_run, run_tm

from trainmeter_core import api, hookimpl, hookspecs
from trainmeter_core.plugins import AGENT_GROUP, Plugins

heavy = pytest.mark.xdist_group("heavy")


# --------------------------------------------------------------------------------------------------------------------
# The marker


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"tryfirst": True},
        {"trylast": True},
        {"hookwrapper": True},
        {"wrapper": True},
        {"optionalhook": True},
        {"specname": "trainmeter_sinks"},
        {"tryfirst": True, "optionalhook": True, "specname": "trainmeter_commands"},
    ],
)
def test_hookimpl_sets_exactly_what_pluggys_marker_sets(options):
    pluggys = pluggy.HookimplMarker("trainmeter")

    def ours():
        pass

    def theirs():
        pass

    (hookimpl(**options) if options else hookimpl)(ours)
    (pluggys(**options) if options else pluggys)(theirs)
    assert ours.trainmeter_impl == theirs.trainmeter_impl


def test_pluggy_registers_what_the_light_marker_marked_and_honours_its_options():
    class Plain:
        @hookimpl
        def trainmeter_secret_options(self):
            return ["PLAIN"]

    class First:
        @hookimpl(tryfirst=True)
        def trainmeter_secret_options(self):
            return ["FIRST"]

    class Last:
        @hookimpl(trylast=True)
        def trainmeter_secret_options(self):
            return ["LAST"]

    class Wrapper:
        @hookimpl(wrapper=True)
        def trainmeter_secret_options(self):
            answers = yield
            return [*answers, ["WRAPPED"]]

    class Renamed:
        @hookimpl(specname="trainmeter_secret_options")
        def secrets(self):
            return ["RENAMED"]

    class Optional:
        @hookimpl(optionalhook=True)
        def trainmeter_not_a_hook_of_tm(self):
            return None

    plugins = Plugins()
    for plugin in (Last(), Plain(), First(), Wrapper(), Renamed(), Optional()):
        plugins.register(plugin, name=type(plugin).__name__)
    plugins.pm.check_pending()  # an unknown hook without optionalhook would raise here
    # pluggy calls the tryfirst implementation first and the trylast one last, the rest latest-registered first,
    # and the wrapper around them all.
    assert plugins.hook.trainmeter_secret_options() == [
        ["FIRST"],
        ["RENAMED"],
        ["PLAIN"],
        ["LAST"],
        ["WRAPPED"],
    ]
    assert plugins.provides("Renamed") == ["secret_options"]


def test_an_unknown_hook_marked_without_optionalhook_is_refused_by_pluggy():
    class Typo:
        @hookimpl
        def trainmeter_sink(self):  # trainmeter_sinks misspelled
            return []

    plugins = Plugins()
    plugins.register(Typo(), name="typo")
    with pytest.raises(pluggy.PluginValidationError, match="trainmeter_sink"):
        plugins.pm.check_pending()


def test_the_marker_the_hookspecs_and_the_core_are_one_object():
    assert hookspecs.hookimpl is hookimpl is api.hookimpl
    assert hookspecs.PROJECT == api.PROJECT == "trainmeter"


# --------------------------------------------------------------------------------------------------------------------
# The module


def test_importing_the_api_and_hookimpl_loads_nothing_heavy(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        from trainmeter_core import hookimpl
        import trainmeter_core.api
        heavy = ("pluggy", "zmq", "aiohttp", "msgspec", "torch", "trainmeter_core.model.records")
        print([m for m in heavy if m in sys.modules])
        trainmeter_core.api.Alert  # a record type is resolved on first use, not before
        print([m for m in heavy if m in sys.modules])
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TM_")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "['msgspec', 'trainmeter_core.model.records']"]


def test_every_public_name_resolves_to_its_one_definition():
    from trainmeter_core.model import money, records

    assert api.records is records
    assert api.money is money
    for name in api.__all__:
        value = getattr(api, name)
        if name in api._LAZY:
            home = api._LAZY[name]()
            assert value is getattr(home, name)
            if hasattr(value, "__module__"):  # a class or a function: defined there, not imported there
                inside = hasattr(home, "__path__") and value.__module__.startswith(home.__name__ + ".")
                assert value.__module__ == home.__name__ or inside, name  # a package: in one of its modules
        elif name not in ("records", "money", "PROJECT", "hookimpl"):
            assert getattr(value, "_is_protocol", False) and value.__module__ == api.__name__, name
    assert set(api.__all__) <= set(dir(api))
    with pytest.raises(AttributeError, match="has no attribute 'Engine'"):
        api.Engine  # noqa: B018


def test_tms_own_pieces_follow_the_protocols():
    plugins = Plugins().load_entry_points()
    assert plugins.errors() == []
    checks = {
        "trainmeter_components": api.BusComponent,
        "trainmeter_sinks": api.Sink,
        "trainmeter_alert_rules": api.AlertRule,
        "trainmeter_commands": api.Command,
    }
    for hook, protocol in checks.items():
        answers = [item for _, items in plugins.per_plugin(hook) for item in items]
        assert answers and all(isinstance(item, protocol) for item in answers), (hook, answers)
    adapters = [
        cls for _, found in plugins.per_plugin("trainmeter_platform_adapters") for cls in found.values()
    ]
    assert adapters and all(isinstance(cls(), api.PlatformAdapter) for cls in adapters)

    from trainmeter_agent import _tap_loader, taps

    for name in taps.BUILTIN:
        (tap,) = getattr(taps, name).trainmeter_trackers()
        assert isinstance(tap, api.TrackerTap), name
    assert isinstance(_tap_loader.TapSink(agent=None, name="x"), api.TapEmit)
    assert not isinstance(object(), api.TrackerTap)  # the check can fail


# --------------------------------------------------------------------------------------------------------------------
# Plugins written from the Protocols alone, in real runs


def imports_of_tm(source: str) -> set[str]:
    """Every module of tm a plugin's source imports."""
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            modules.add(node.module or "")
    return {m for m in modules if m.startswith("trainmeter")}


TAP_PLUGIN = '''
"""A tap for notebook_tracker, written from trainmeter_core.api alone."""
from trainmeter_core.api import TrackerTap, hookimpl


class NotebookTap(TrackerTap):
    name = "notebook"
    module = "notebook_tracker"

    def attach(self, module, emit):
        original = module.record

        def record(key, value, step=None):
            result = original(key, value, step)
            if emit.on:
                emit({key: value}, step)
            return result

        module.record = record


@hookimpl
def trainmeter_trackers():
    return [NotebookTap()]
'''
TRACKER = "RECORDED = []\n\ndef record(key, value, step=None):\n    RECORDED.append((key, value, step))\n"
TAPPED_LOOP = """
import notebook_tracker
import torch  # a training script: the agent reads the launcher's plugin list once torch is imported

for step, loss in ((1, 2.5), (2, 2.25), (3, torch.tensor(2.0))):
    notebook_tracker.record("loss", loss, step=step)
print(notebook_tracker.RECORDED[-1][:2])
"""


@heavy
def test_a_tap_from_the_protocols_alone_sees_the_trackers_calls_in_a_tm_run(tm_env, tmp_path, torch):
    assert imports_of_tm(TAP_PLUGIN) == {"trainmeter_core.api"}
    site = tmp_path / "site"
    # The entry point is named after the library: the agent watches for the import of each listed name.
    fake_distribution(
        site, "tm-notebook-tap", "[trainmeter.agent]\nnotebook_tracker = tm_notebook_tap\n", TAP_PLUGIN
    )
    (site / "notebook_tracker.py").write_text(TRACKER)
    env = dict(tm_env, PYTHONPATH=str(site), TM_DISABLE_COMPONENTS="web")
    done = run_tm(["--", sys.executable, "-c", TAPPED_LOOP], env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "('loss', tensor(2.))"  # the library still did its own work
    records = log_records(only_run(tmp_path / "runs"))
    tapped = [
        (r["values"], r.get("step"))
        for r in records
        if r["kind"] == "metric" and r.get("origin") == "notebook"
    ]
    # 2.5 and 2.25 as logged, and the 0-dim CPU tensor read as the float 2.0
    assert tapped == [({"loss": 2.5}, 1), ({"loss": 2.25}, 2), ({"loss": 2.0}, 3)]
    facts = {r["name"]: r["value"] for r in records if r["kind"] == "fact"}
    assert facts["probe.tap.notebook"] == "attached"
    listing = json.loads((only_run(tmp_path / "runs") / "agent-plugins.json").read_text())
    assert {"name": "notebook_tracker", "value": "tm_notebook_tap"}.items() <= listing[0].items()
    # `tm plugins` registers the same module with pluggy, which reads the light marker as its own.
    listed = run_tm(["plugins", "--json"], env)
    infos = {i["name"]: i for i in map(json.loads, listed.stdout.splitlines())}
    assert infos["notebook_tracker"]["group"] == AGENT_GROUP and infos["notebook_tracker"]["provides"] == [
        "trackers"
    ]


@heavy
def test_the_plugin_list_is_there_when_the_agent_starts_so_a_quick_command_gets_its_tap(tm_env, tmp_path):
    # The agent reads the launcher's list once, at its start, to know which imports load a tap. Written after the
    # command started, the list missed 3 of 8 quick commands on a 2-core machine: their tap never attached.
    site = tmp_path / "site"
    fake_distribution(
        site, "tm-notebook-tap", "[trainmeter.agent]\nnotebook_tracker = tm_notebook_tap\n", TAP_PLUGIN
    )
    (site / "notebook_tracker.py").write_text(TRACKER)
    code = "import notebook_tracker\nnotebook_tracker.record('loss', 2.5, step=1)"
    for attempt in range(8):
        runs = tmp_path / f"runs{attempt}"
        env = dict(tm_env, PYTHONPATH=str(site), TM_RUNS_DIR=str(runs), TM_DISABLE_COMPONENTS="web")
        done = run_tm(["--", sys.executable, "-c", code], env)
        assert done.returncode == 0, done.stderr
        tapped = [
            r["values"]
            for r in log_records(only_run(runs))
            if r["kind"] == "metric" and r.get("origin") == "notebook"
        ]
        assert tapped == [{"loss": 2.5}], f"attempt {attempt}"


SINK_PLUGIN = '''
"""A sink that keeps a ledger of the run's alerts in the run directory, written from trainmeter_core.api alone."""
import json

from trainmeter_core.api import Sink, alerts_until_stopped, hookimpl


class Ledger(Sink):
    name = "ledger"
    subscribes = ("alert",)

    def run(self, ctx):
        with open(ctx.run_dir / "ledger.jsonl", "a", encoding="utf-8") as ledger:
            for alert in alerts_until_stopped(ctx):
                entry = {"seq": alert.seq, "rule": alert.rule, "state": alert.state, "run": ctx.meta["run_id"]}
                ledger.write(json.dumps(entry) + "\\n")
                ledger.flush()


@hookimpl
def trainmeter_sinks():
    return [Ledger]
'''
# A plugin's sink starts after the training did and reads the bus live, so it may miss an alert published before it
# subscribed: the loss goes NaN and back (tm.toml clears each episode after 1 s, never damped as a flap) until the
# ledger holds a fired alert.
NAN_LOOP = """
import math, os, time
from trainmeter_agent import emit

ledger = os.path.join(os.environ["TM_RUN_DIR"], "ledger.jsonl")
deadline = time.monotonic() + 90
step = 0
while time.monotonic() < deadline and not (os.path.exists(ledger) and '"fired"' in open(ledger).read()):
    phase_s = (time.monotonic() % 4.0)  # 1.5 s of NaN, then 2.5 s of a finite loss
    step += 1
    emit(step=step)
    emit(train_loss=math.nan if phase_s < 1.5 else 1.0 / step)
    time.sleep(0.1)
"""
TM_TOML = "[alerts.loss_nan]\nclear_after_s = 1\nflap_window_s = 0\n"


@heavy
def test_a_sink_from_the_protocols_alone_receives_real_alerts_over_the_bus(tm_env, tmp_path):
    assert imports_of_tm(SINK_PLUGIN) == {"trainmeter_core.api"}
    site = tmp_path / "site"
    fake_distribution(site, "tm-ledger", "[trainmeter]\nledger = tm_ledger\n", SINK_PLUGIN)
    work = tmp_path / "work"
    work.mkdir()
    (work / "tm.toml").write_text(TM_TOML)
    env = dict(tm_env, PYTHONPATH=str(site), TM_DISABLE_COMPONENTS="web")
    done = run_tm(["--", sys.executable, "-c", NAN_LOOP], env, cwd=work)
    assert done.returncode == 0, done.stderr
    run_dir = only_run(tmp_path / "runs")
    ledger = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    assert ("loss_nan", "fired") in {(e["rule"], e["state"]) for e in ledger}
    # The ledger holds every alert the hub numbered and logged, once each and in order.
    alerts = [r for r in log_records(run_dir) if r["kind"] == "alert"]
    assert [(a["seq"], a["rule"], a["state"]) for a in alerts] == [
        (e["seq"], e["rule"], e["state"]) for e in ledger
    ]
    assert {e["run"] for e in ledger} == {run_dir.name}
    components = [r for r in log_records(run_dir) if r["kind"] == "component" and r["name"] == "ledger"]
    assert components and components[0]["process"] == "ledger"  # a plugin's sink runs in a process of its own


# The same sink, started late: its process spends 4 s before it subscribes (as a plugin with a slow import would), so
# the one loss_nan alert of a loop whose loss goes NaN for good at step 3 is on the bus before it listens.
SLOW_SINK_PLUGIN = SINK_PLUGIN.replace(
    "@hookimpl\ndef trainmeter_sinks():\n",
    "@hookimpl\ndef trainmeter_sinks():\n"
    "    import sys, time\n"
    "    if sys.argv[0].endswith('component_host.py') and 'ledger' in sys.argv:  # the ledger's own process\n"
    "        time.sleep(4)\n",
)
NAN_FOR_GOOD_LOOP = """
import math, time
from trainmeter_agent import emit
for step in range(1, 81):
    emit(step=step, train_loss=math.nan if step >= 3 else 1.0)
    time.sleep(0.1)
"""


@heavy
def test_a_sink_that_starts_late_still_gets_the_alerts_raised_before_it_listened(tm_env, tmp_path):
    assert "time.sleep(4)" in SLOW_SINK_PLUGIN
    site = tmp_path / "site"
    fake_distribution(site, "tm-ledger", "[trainmeter]\nledger = tm_ledger\n", SLOW_SINK_PLUGIN)
    work = tmp_path / "work"
    work.mkdir()
    env = dict(tm_env, PYTHONPATH=str(site), TM_DISABLE_COMPONENTS="web")
    done = run_tm(["--", sys.executable, "-c", NAN_FOR_GOOD_LOOP], env, cwd=work)
    assert done.returncode == 0, done.stderr
    run_dir = only_run(tmp_path / "runs")
    records = log_records(run_dir)
    alerts = [r for r in records if r["kind"] == "alert"]
    assert ("loss_nan", "fired") in {(a["rule"], a["state"]) for a in alerts}
    # The alert was on the bus before the ledger's process could subscribe (4 s after it started).
    fired = next(a for a in alerts if a["rule"] == "loss_nan")
    started = next(r for r in records if r["kind"] == "component" and r["name"] == "ledger")
    assert fired["wall"] < started["wall"] + 4.0, (fired, started)
    ledger = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    assert [(a["seq"], a["rule"], a["state"]) for a in alerts] == [
        (e["seq"], e["rule"], e["state"]) for e in ledger
    ]
    assert started["event"] == "started"


ADAPTER_PLUGIN = '''
"""A platform adapter for a lab's L4 board and the spec that names it, written from trainmeter_core.api alone."""
from pathlib import Path

from trainmeter_core.api import NOT_ON_THIS_DEVICE, PlatformAdapter, hookimpl


class LabBoard(PlatformAdapter):
    name = "lab"
    not_offered = {
        "nvlink_tx_bps": f"{NOT_ON_THIS_DEVICE}: the lab board has no NVLink",
        "nvlink_rx_bps": f"{NOT_ON_THIS_DEVICE}: the lab board has no NVLink",
    }

    def adapt(self, reading):
        reading.put("temp_c", 41.5)  # the board's own sensor, in place of NVML's
        reading.miss("energy_j", "the lab board's energy counter is not wired")


@hookimpl
def trainmeter_platform_adapters():
    return {LabBoard.name: LabBoard}


@hookimpl
def trainmeter_device_specs():
    return [Path(__file__).resolve().parent / "tm_lab_specs"]
'''
WAIT_FOR_TWO_ROWS = """
import glob, os, time

def rows():
    return sum(open(p).read().count('"kind":"sample.gpu"') for p in glob.glob(os.environ["TM_RUN_DIR"] + "/events-*"))

end = time.monotonic() + 60
while time.monotonic() < end and rows() < 2:
    time.sleep(0.05)
"""


@heavy
def test_an_adapter_from_the_protocols_alone_fills_the_gpu_samplers_rows_over_the_fake_nvml(tm_env, tmp_path):
    assert imports_of_tm(ADAPTER_PLUGIN) == {"trainmeter_core.api"}
    site = tmp_path / "site"
    fake_distribution(site, "tm-lab", "[trainmeter]\nlab = tm_lab\n", ADAPTER_PLUGIN)
    # The lab's spec: the L4's datasheet figures, a longer match than the built-in spec's, and the adapter's name.
    spec = json.loads((REPO / "specs" / "l4.json").read_text())
    spec.update(id="lab-l4", display_name="NVIDIA L4 (lab board)", adapter="lab", match=["^NVIDIA L4$"])
    (site / "tm_lab_specs").mkdir()
    (site / "tm_lab_specs" / "lab-l4.json").write_text(json.dumps(spec))
    env = dict(
        tm_env,
        PYTHONPATH=str(site),
        TM_FAKE_GPUS="1xL4",
        TM_GPU_INTERVAL_S="0.1",
        TM_DISABLE_COMPONENTS="web",
    )
    done = run_tm(["--no-agent", "--", sys.executable, "-c", WAIT_FOR_TWO_ROWS], env)
    assert done.returncode == 0, done.stderr
    rows = [r for r in log_records(only_run(tmp_path / "runs")) if r["kind"] == "sample.gpu"]
    assert len(rows) >= 2
    for row in rows:
        assert (row["adapter"], row["spec_id"], row["temp_c"]) == ("lab", "lab-l4", 41.5)
        assert row["absent"]["energy_j"] == "the lab board's energy counter is not wired"
        assert row["absent"]["nvlink_tx_bps"] == "not on this device: the lab board has no NVLink"
        assert "power_w" in row  # what the adapter leaves alone still comes from NVML
