"""The alerts component: rules from the plugins, thresholds from the run's tm.toml, episodes taken back from the run
log after a restart, one notice per unusable entry. Run on a stand-in context (records in, records out)."""

from __future__ import annotations

import threading
from collections import deque

import pytest

from trainmeter_core.components import alerts as alerts_component
from trainmeter_core.components.alerts import AlertsComponent, collect_rules, tm_toml_path
from trainmeter_core.model import records
from trainmeter_core.model.alerts import BUILTIN_RULES
from trainmeter_core.plugins import Plugins


class StandIn:
    def __init__(self, run_dir, meta, logged):
        self.run_dir = run_dir
        self.meta = meta
        self.stopping = threading.Event()
        self.published = []
        self.said_done = 0
        self._records = deque(logged)

    def recv(self, timeout_s):
        if self._records:
            return self._records.popleft()
        self.stopping.set()
        self.stopping.wait(timeout_s)
        return None

    def publish(self, record):
        self.published.append(record)
        return True

    def done(self):
        self.said_done += 1


@pytest.fixture(autouse=True)
def short_drain(monkeypatch):
    monkeypatch.setattr(alerts_component, "STOP_DRAIN_S", 0.05)


def mv(value):
    return records.MetricValue(value=value)


def stepping(t, since, final=False, **extra):
    metrics = {
        "since_step_s": mv(since),
        "step_time_median_s": mv(0.1),
        "child_alive": mv(0.0 if final else 1.0),
    }
    metrics.update({k: mv(v) for k, v in extra.items()})
    return records.Snapshot(tick=int(t), t=float(t), final=final, steps=30, metrics=metrics)


def script_run(tmp_path, toml: str | None):
    (tmp_path / "job").mkdir()
    if toml is not None:
        (tmp_path / "job" / "tm.toml").write_text(toml)
    return {"cwd": str(tmp_path), "command": ["job/train.py", "--lr", "3e-4"], "script_mode": True}


def published(ctx, kind=records.Alert):
    return [r for r in ctx.published if isinstance(r, kind)]


def test_tm_toml_is_next_to_the_script_or_in_the_working_directory(tmp_path):
    assert tm_toml_path({"cwd": "/w", "command": ["sub/train.py"], "script_mode": True}) == tm_toml_path(
        {"cwd": "/w/sub", "command": ["train.py"], "script_mode": True}
    )
    assert (
        str(tm_toml_path({"cwd": "/w", "command": ["torchrun", "x.py"], "script_mode": False}))
        == "/w/tm.toml"
    )


def test_the_builtin_rules_come_through_the_hook_like_a_plugins(tmp_path):
    from trainmeter_core import builtin

    plugins = Plugins()
    plugins.register(builtin, name="core", builtin=True)
    rules, problems = collect_rules(plugins)
    assert [r.name for r in rules] == [cls.name for cls in BUILTIN_RULES] and problems == []


def test_a_rule_name_taken_twice_keeps_the_first_and_says_so():
    class Twin:
        name = "hung"

        def evaluate(self, state, snapshot):
            raise AssertionError("never run")

    class Other:
        from trainmeter_core import hookimpl

        @hookimpl
        def trainmeter_alert_rules(self):
            return [Twin(), object()]

    from trainmeter_core import builtin

    plugins = Plugins()
    plugins.register(builtin, name="core", builtin=True)
    plugins.register(Other(), name="other")
    rules, problems = collect_rules(plugins)
    assert [r for r in rules if r.name == "hung"][0].__class__.__name__ == "Hung"
    assert problems[0] == "plugin other: alert rule hung is taken by core; skipped"
    assert problems[1].startswith("plugin other: <object object at") and problems[1].endswith(
        "is no alert rule (it needs a name and evaluate)"
    )


def test_thresholds_from_tm_toml_scale_the_hung_rule(tmp_path):
    meta = script_run(tmp_path, "budget_tokens = '1M'\n[alerts.hung]\nfloor_s = 2\nclear_after_s = 1\n")
    # floor 2 s (10 × 0.1 = 1 s is less): fired at since 3 (t 13), steps again from t 14, cleared at t 15
    snapshots = [stepping(10 + i, since=float(i)) for i in range(4)] + [stepping(14, 0.1), stepping(15, 0.1)]
    ctx = StandIn(tmp_path, meta, snapshots)
    AlertsComponent().run(ctx)
    assert [(a.rule, a.state, a.t) for a in published(ctx)] == [
        ("hung", "fired", 13.0),
        ("hung", "cleared", 15.0),
    ]
    assert published(ctx, records.Notice) == []


def test_an_unusable_alerts_entry_is_one_notice_and_the_rule_keeps_its_defaults(tmp_path, capsys):
    meta = script_run(tmp_path, "[alerts.hung]\nfloor_s = 'soon'\n")
    ctx = StandIn(tmp_path, meta, [stepping(10 + i, since=float(i)) for i in range(4)])
    AlertsComponent().run(ctx)
    (notice,) = published(ctx, records.Notice)
    where = tmp_path / "job" / "tm.toml"
    assert notice.level == "error" and notice.topic == "alerts"
    assert (
        notice.message
        == f"{where} [alerts.hung] floor_s: expected a number ≥ 0, got 'soon' (the rule keeps its defaults)"
    )
    assert published(ctx) == []  # the default floor is 300 s
    assert f"tm: alerts: {notice.message}" in capsys.readouterr().err


def test_after_a_restart_an_open_episode_is_not_fired_again(tmp_path):
    meta = script_run(tmp_path, "[alerts.hung]\nfloor_s = 2\nclear_after_s = 1\n")
    before = records.Alert(
        seq=5, rule="hung", state="fired", message="no step", t=12.0, since_t=12.0, episode=1
    )
    (tmp_path / "events-0001.jsonl").write_bytes(records.to_log_line(records.to_builtins(before)))
    ctx = StandIn(tmp_path, meta, [stepping(20, 8.0), stepping(21, 0.1), stepping(22, 0.1)])
    AlertsComponent().run(ctx)
    assert [(a.state, a.episode) for a in published(ctx)] == [("cleared", 1)]


def test_the_final_snapshot_is_judged_and_ends_the_component(tmp_path):
    final = stepping(30, 0.5, final=True, exit_signal=9.0)
    ctx = StandIn(tmp_path, script_run(tmp_path, None), [final, stepping(31, 99.0)])
    AlertsComponent().run(ctx)
    (died,) = published(ctx)
    assert (died.rule, died.state, died.numbers["signal"]) == ("died", "fired", 9.0)
    assert len(ctx._records) == 1  # returned after the final snapshot, without reading on
    assert ctx.said_done == 1  # and said so: the launcher's end waits for its alert no longer
