"""Tracker taps: wandb (offline), TensorBoard, tensorboardX and MLflow (file store) deliver what the loop logs, as
plugins of the ``trainmeter.agent`` group loaded from the launcher's list; ``--no-tap`` and faults silence them.

The trackers are the packages of requirements-test.txt: without one a test skips (or fails under TM_REQUIRE_TORCH=1).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deadline import wait_for
from test_agent import REPO, SCRIPTS, Run, kinds, plain_env, tm_lines

from trainmeter_agent import _launcher_env, _tap_loader, taps

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


heavy = pytest.mark.xdist_group("heavy")
GPT = str(SCRIPTS / "gpt_loop.py")
# (option of gpt_loop.py, the package it needs, the metric origin, the loss key and the other key the loop logs)
TRACKERS = [
    ("--tensorboard", "tensorboard", "tensorboard", "loss/train", "opt/lr"),
    ("--tensorboardx", "tensorboardX", "tensorboardx", "loss/train", "opt/lr"),
    ("--wandb", "wandb", "wandb", "train/loss", "lr"),
    ("--mlflow", "mlflow", "mlflow", "train_loss", "lr"),
]


def require(module: str) -> None:
    """The package, or a failure under TM_REQUIRE_TORCH=1 (CI installs it), or a skip that says how to get it."""
    if importlib.util.find_spec(module) is None:
        if os.environ.get("TM_REQUIRE_TORCH") == "1":
            pytest.fail(
                f"{module} is required here (TM_REQUIRE_TORCH=1): pip install -r requirements-test.txt"
            )
        pytest.skip(f"{module} is not installed: pip install -r requirements-test.txt")


def gpt(run: Run, *args: str, **env: str) -> tuple[dict, subprocess.CompletedProcess]:
    env = run.env(WANDB_SILENT="true", WANDB_DISABLE_GIT="true", **env)
    done = subprocess.run(
        [sys.executable, GPT, *args], env=env, capture_output=True, text=True, timeout=120, cwd=run.run_dir
    )
    assert done.returncode == 0, done.stderr
    wait_for(lambda: run.hub.kinds.get("bye", 0) >= 1, what="the agent's bye")
    return json.loads(done.stdout), done


@heavy
@pytest.mark.parametrize(("option", "package", "origin", "loss_key", "other_key"), TRACKERS)
def test_a_tracker_delivers_the_loops_scalars_under_their_raw_keys(
    run, torch, tmp_path, option, package, origin, loss_key, other_key
):
    require(package)
    result, _ = gpt(run, "--steps", "5", option, str(tmp_path / "logs"))
    records = run.records()
    tapped = [m for m in kinds(records, "metric") if m.get("origin") == origin]
    losses = [(m["step"], m["values"][loss_key]) for m in tapped if loss_key in m["values"]]
    # The loop logs loss.item() (or the 0-dim CPU tensor itself) at steps 1..5: the same float32 values, widened.
    assert losses == [(n, float.fromhex(h)) for n, h in enumerate(result["losses"], start=1)]
    assert [m["values"][other_key] for m in tapped if other_key in m["values"]] == [3e-3] * 5
    from trainmeter_core.model.catalog import canonical

    assert (
        canonical(loss_key, seen_explicit_train=False) == "train_loss"
    )  # the raw key maps to the canonical series
    facts = {f["name"]: f["value"] for f in kinds(records, "fact")}
    assert facts[f"probe.tap.{origin}"] == "attached"


@heavy
def test_no_tap_leaves_the_trackers_alone(run, torch, tmp_path):
    require("tensorboard")
    gpt(run, "--steps", "3", "--tensorboard", str(tmp_path / "tb"), TM_NO_TAP="1")
    records = run.records()
    assert [m for m in kinds(records, "metric") if m.get("origin") == "tensorboard"] == []
    assert not any(f["name"].startswith("probe.tap.") for f in kinds(records, "fact"))
    assert "trackers" not in kinds(records, "hello")[0]  # none it may attach


@heavy
def test_an_internal_error_in_every_tap_says_one_line_each_and_changes_no_loss(run, torch, tmp_path):
    for _, package, *_ in TRACKERS:
        require(package)
    options = ["--steps", "3"]
    for option, *_ in TRACKERS:
        options += [option, str(tmp_path / option.strip("-"))]
    plain = subprocess.run(
        [sys.executable, GPT, *options],
        env=plain_env(WANDB_SILENT="true"),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert plain.returncode == 0, plain.stderr
    faults = ",".join(f"tap.{origin}" for _, _, origin, *_ in TRACKERS)
    result, done = gpt(run, *options, TM_AGENT_FAULT=faults)
    assert result["losses"] == json.loads(plain.stdout)["losses"]
    lines = sorted(tm_lines(done.stderr))
    assert len(lines) == 4, done.stderr
    for line, origin in zip(lines, sorted(o for _, _, o, *_ in TRACKERS), strict=True):
        assert line.startswith(f"tm: agent tap.{origin} stopped: InjectedFault"), line
    # Each went quiet: what is left is the loss the agent reads from backward(), not a tap's.
    assert [m for m in kinds(run.records(), "metric") if m.get("origin") not in ("emit", "backward")] == []


# --------------------------------------------------------------------------------------------------------------------
# Plugins: the launcher's list, a third-party tap, what pluggy sees


FAKE_TRACKER = "LOGGED = []\n\ndef log(**values):\n    LOGGED.append(values)\n"
FAKE_PLUGIN = """
from trainmeter_agent.taps import Tap, TrackerPlugin, wrap_logging_call

class FakeTap(Tap):
    name = "fake"
    module = "fake_tracker"

    def attach(self, module, emit):
        module.log = wrap_logging_call(module.log, emit, lambda args, kwargs: (kwargs, None))

plugin = TrackerPlugin(FakeTap())
"""


def test_a_third_party_tap_from_the_launchers_list_attaches_when_its_library_is_imported(run, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "fake_tracker.py").write_text(FAKE_TRACKER)
    (site / "fake_tap_plugin.py").write_text(FAKE_PLUGIN)
    listing = [
        {"name": "fake_tracker", "value": "fake_tap_plugin:plugin", "distribution": "fake", "version": "1.0"}
    ]
    (run.run_dir / "agent-plugins.json").write_text(json.dumps(listing))
    code = "import fake_tracker\nfake_tracker.log(loss=1.5, step_time=0.25)\nprint(fake_tracker.LOGGED)"
    done = run.python(["-c", code], run.env(pythonpath=[str(site)]))
    assert done.stdout.strip() == "[{'loss': 1.5, 'step_time': 0.25}]"  # the library still did its own work
    records = run.records()
    # The listed plugin first, then the built-in taps, which ship in the agent's own package.
    assert kinds(records, "hello")[0]["trackers"] == [
        "fake_tracker",
        "wandb",
        "tensorboard",
        "tensorboardx",
        "mlflow",
    ]
    assert [(m["origin"], m["values"]) for m in kinds(records, "metric")] == [
        ("fake", {"loss": 1.5, "step_time": 0.25})
    ]


def test_the_plugin_list_is_read_from_the_run_directory_and_metadata_only_without_it(tmp_path, monkeypatch):
    listing = [{"name": "x", "value": "x_module:plugin", "distribution": "x", "version": "2"}]
    (tmp_path / "agent-plugins.json").write_text(json.dumps(listing))
    monkeypatch.setenv("TM_RUN_DIR", str(tmp_path))
    assert _launcher_env.plugin_entries() == (listing, "agent-plugins.json")
    monkeypatch.setenv("TM_RUN_DIR", str(tmp_path / "missing"))
    assert _launcher_env.plugin_entries()[1] == "package metadata"


def test_pluggy_registers_the_builtin_taps_as_trackers_hook_implementations():
    from trainmeter_core.plugins import AGENT_GROUP, Plugins

    plugins = Plugins(AGENT_GROUP)
    for name in taps.BUILTIN:
        plugins.register(getattr(taps, name), name=name, builtin=True)
        assert plugins.provides(name) == ["trackers"]
    provided = [tap.name for taps_of_one in plugins.hook.trainmeter_trackers() for tap in taps_of_one]
    assert sorted(provided) == ["mlflow", "tensorboard", "tensorboardx", "wandb"]


def test_pyproject_registers_every_builtin_tap_in_the_agent_group():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["trainmeter.agent"] == taps.BUILTIN


# --------------------------------------------------------------------------------------------------------------------
# What a tap reads, and how often


class CollectingAgent:
    def __init__(self) -> None:
        self._faults: set[str] = set()
        self.metrics: list[tuple] = []
        self.stopped: list[str] = []

    def tapped(self, origin, values, step) -> None:
        self.metrics.append((origin, values, step))

    def stop_probe(self, probe, exc) -> None:
        self.stopped.append(probe)


def test_a_tap_reads_numbers_and_cpu_scalars_and_never_an_accelerator_tensor(torch):
    agent = CollectingAgent()
    sink = _tap_loader.TapSink(agent, "fake")
    meta = torch.tensor(1.0, device="meta")  # stands in for a tensor on an accelerator: reading it would fail
    sink({"a": 1, "b": torch.tensor(2.5), "c": meta, "d": torch.ones(2), "e": "text", "f": True}, 7)
    assert agent.metrics == [("fake", {"a": 1.0, "b": 2.5, "f": 1.0}, 7)]
    assert agent.stopped == []


def test_a_tracker_calling_its_own_tapped_function_is_logged_once(torch):
    agent = CollectingAgent()
    sink = _tap_loader.TapSink(agent, "fake")
    calls = []

    def inner(key, value):
        calls.append((key, value))

    wrapped_inner = taps.wrap_logging_call(inner, sink, lambda args, kwargs: ({args[0]: args[1]}, None))

    def outer(values):
        for key, value in values.items():
            wrapped_inner(key, value)  # what add_scalars or a wandb integration may do inside

    wrapped_outer = taps.wrap_logging_call(outer, sink, lambda args, kwargs: (args[0], 3))
    wrapped_outer({"x": 1.0, "y": 2.0})
    assert calls == [("x", 1.0), ("y", 2.0)]
    assert agent.metrics == [("fake", {"x": 1.0, "y": 2.0}, 3)]


def test_a_failing_tap_reader_stops_that_tap_only_and_the_call_returns(torch):
    agent = CollectingAgent()
    sink = _tap_loader.TapSink(agent, "fake")

    def broken_reader(args, kwargs):
        raise KeyError("surprise")

    logged = taps.wrap_logging_call(lambda value: value * 2, sink, broken_reader)
    assert logged(21) == 42 and logged(1) == 2
    assert agent.stopped == ["tap.fake"] and not sink.on


def test_the_builtin_taps_module_imports_no_tracker_and_no_pluggy():
    code = "import sys, trainmeter_agent.taps\nprint(sorted(m for m in ('pluggy', 'wandb', 'mlflow', 'tensorboardX', 'torch') if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=plain_env(), capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_tracker_plugin_names_are_plain_modules():
    for value in taps.BUILTIN.values():
        module, _, attr = value.partition(":")
        assert Path(REPO, *module.split(".")).with_suffix(".py").exists() and hasattr(taps, attr)
