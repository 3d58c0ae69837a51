"""Episodes: a rule's condition fires once per episode, clears when it has stayed away, and flapping is damped; the
thresholds come from tm.toml's [alerts.<rule>] tables with one-line errors."""

from __future__ import annotations

import math

import pytest

from trainmeter_core.model import records
from trainmeter_core.model.alerts.episodes import (
    COMMON_DEFAULTS,
    AlertConfigError,
    Alerter,
    Condition,
    Rule,
    RuleState,
    Verdict,
    alert_config,
    rule_config,
)


class Scripted(Rule):
    """A rule whose condition is whatever the snapshot's ``on`` metric says (1 on, 0 off, absent: held)."""

    name = "scripted"
    severity = "warning"
    defaults = {"clear_after_s": 3.0}

    def evaluate(self, state: RuleState, snapshot: records.Snapshot) -> Verdict:
        value = snapshot.metrics.get("on")
        if value is None:
            return Verdict(held=True)
        if value.value:
            return Verdict(active=[Condition(f"on at tick {snapshot.tick}", {"tick": float(snapshot.tick)})])
        return Verdict(normal=[Condition("off", {"tick": float(snapshot.tick)})])


def snap(tick: int, on: bool | None, final: bool = False) -> records.Snapshot:
    metrics = {} if on is None else {"on": records.MetricValue(value=1.0 if on else 0.0)}
    return records.Snapshot(tick=tick, t=100.0 + tick, wall=1e9 + tick, metrics=metrics, final=final)


def run(alerter: Alerter, pattern: str, start: int = 1) -> list[tuple[int, str, int]]:
    """Feed one snapshot per character (1 on, 0 off, . held); return (tick, state, episode) of every alert."""
    out = []
    for tick, char in enumerate(pattern, start=start):
        for alert in alerter.observe(snap(tick, None if char == "." else char == "1")):
            out.append((tick, alert.state, alert.episode))
    return out


def test_a_condition_fires_once_and_clears_after_it_stayed_away_clear_after_s():
    alerter = Alerter([Scripted()])
    # on at ticks 3..6 (fired at 3, once); off from 7: t 107 quiet since, clears at t 110 (3 s later)
    assert run(alerter, "0011110000000") == [(3, "fired", 1), (10, "cleared", 1)]


def test_the_alert_record_carries_rule_severity_numbers_and_the_snapshot_time():
    alerter = Alerter([Scripted()])
    (alert,) = alerter.observe(snap(4, True))
    assert (alert.rule, alert.state, alert.severity, alert.source) == (
        "scripted",
        "fired",
        "warning",
        "alerts",
    )
    assert alert.message == "on at tick 4" and alert.numbers == {"tick": 4.0}
    assert (alert.t, alert.wall, alert.since_t, alert.subject) == (104.0, 1e9 + 4, 104.0, None)
    for tick in range(5, 9):
        cleared = alerter.observe(snap(tick, False))
    # quiet since t 105, cleared at t 108 (3 s): it lasted 108 − 104 = 4 s; the rule's normal words follow
    assert [(a.state, a.message, a.since_t) for a in cleared] == [
        ("cleared", "cleared after 4 s: off", 104.0)
    ]


def test_fire_after_s_needs_the_condition_to_hold_that_long():
    alerter = Alerter([Scripted()], {"scripted": dict(rule_config(Scripted(), {"fire_after_s": 2}))})
    # on at 2 (t 102) and 3 only: not 2 s yet; on again from 5: t 105, 106, 107 -> fires at 7, since_t 105
    alerts = []
    for tick, char in enumerate("01101111", start=1):
        alerts += alerter.observe(snap(tick, char == "1"))
    assert [(a.state, a.t, a.since_t) for a in alerts] == [("fired", 107.0, 105.0)]


def test_flapping_within_the_clear_wait_is_one_episode():
    alerter = Alerter([Scripted()])
    # on, off for 2 s (< 3), on, off for 2 s, on ...: one fired, never cleared while it flaps
    assert run(alerter, "1001001001001") == [(1, "fired", 1)]


def test_each_quick_refire_doubles_the_next_clear_wait():
    alerter = Alerter([Scripted()])
    # episode 1: fired at 1, off from 2, cleared at 5 (3 s). On again at 6, within the flap window: episode 2 is a
    # flap, so its clear waits 6 s: off from 7, cleared at 13. On at 14: a second flap, clear waits 12 s: 15 + 12 = 27.
    alerts = run(alerter, "10000" + "10000000" + "1" + "0" * 14)
    assert alerts == [
        (1, "fired", 1),
        (5, "cleared", 1),
        (6, "fired", 2),
        (13, "cleared", 2),
        (14, "fired", 3),
        (27, "cleared", 3),
    ]


def test_a_refire_after_a_quiet_flap_window_waits_the_plain_clear_time():
    alerter = Alerter([Scripted()], {"scripted": rule_config(Scripted(), {"flap_window_s": 5})})
    # cleared at 5; on again at 12 (7 s later > 5): no flap, clear after 3 s again: off from 13, cleared at 16
    assert run(alerter, "10000" + "000000" + "10000") == [
        (1, "fired", 1),
        (5, "cleared", 1),
        (12, "fired", 2),
        (16, "cleared", 2),
    ]


def test_a_held_verdict_keeps_the_episode_as_it_is():
    alerter = Alerter([Scripted()])
    # fired at 1; held for ten snapshots (an eval span): no clear although the condition was not seen.
    # On at 12, off from 13 (t 113): cleared at t 116, tick 16.
    assert run(alerter, "1" + "." * 10 + "10000") == [(1, "fired", 1), (16, "cleared", 1)]


def test_subjects_have_episodes_of_their_own():
    class TwoGpus(Rule):
        name = "two"
        defaults = {"clear_after_s": 0.0}

        def evaluate(self, state, snapshot):
            on = [name for name in ("gpu0", "gpu1") if name in snapshot.warnings]
            return Verdict(active=[Condition(f"{s} on", subject=s) for s in on])

    alerter = Alerter([TwoGpus()])
    seen = []
    for tick, on in enumerate([["gpu0"], ["gpu0", "gpu1"], ["gpu1"], []], start=1):
        seen += [
            (a.subject, a.state) for a in alerter.observe(records.Snapshot(tick=tick, t=tick, warnings=on))
        ]
    assert seen == [("gpu0", "fired"), ("gpu1", "fired"), ("gpu0", "cleared"), ("gpu1", "cleared")]


def test_a_snapshot_of_a_tick_already_seen_is_skipped():
    alerter = Alerter([Scripted()])
    assert len(alerter.observe(snap(5, True))) == 1
    assert alerter.observe(snap(5, True)) == [] and alerter.observe(snap(4, False)) == []


def test_a_rule_that_raises_is_turned_off_and_said_once():
    class Broken(Rule):
        name = "broken"

        def evaluate(self, state, snapshot):
            raise ZeroDivisionError("division by zero")

    alerter = Alerter([Broken(), Scripted()])
    assert [a.rule for a in alerter.observe(snap(1, True))] == ["scripted"]
    alerter.observe(snap(2, True))
    assert alerter.errors == [
        "alert rule broken failed and is off for this run: ZeroDivisionError: division by zero"
    ]


def test_restore_keeps_open_episodes_open_and_numbering_going():
    alerter = Alerter([Scripted()])
    logged = [
        records.Alert(rule="scripted", state="fired", message="m", episode=1, t=10.0, since_t=9.0),
        records.Alert(rule="scripted", state="cleared", message="m", episode=1, t=20.0),
        records.Alert(rule="scripted", state="fired", message="m", episode=2, t=30.0, since_t=30.0),
    ]
    alerter.restore(logged)
    assert alerter.open_episodes() == [("scripted", None)]
    assert alerter.observe(snap(1, True)) == []  # still the same episode: not fired twice
    # off from t 102, cleared at t 105 as episode 2
    assert run(alerter, "0000", start=2) == [(5, "cleared", 2)]


def test_the_final_snapshot_is_evaluated_whatever_its_tick():
    alerter = Alerter([Scripted()])
    alerter.observe(snap(9, False))
    (alert,) = alerter.observe(snap(9, True, final=True))
    assert alert.state == "fired"


def final(alerter: Alerter, pattern: str, last: bool | None) -> list[tuple[int, str, int]]:
    """``run`` of the pattern, then the run's final snapshot one tick later (``last``: on, off, or None: held)."""
    out = run(alerter, pattern)
    tick = len(pattern) + 1
    out += [(tick, a.state, a.episode) for a in alerter.observe(snap(tick, last, final=True))]
    return out


def test_at_the_runs_end_an_episode_whose_condition_is_gone_clears_without_waiting():
    alerter = Alerter([Scripted()])
    # on at 1..3, off at 4 and 5 (t 104, 105: 1 s of the 3 s clear wait), the run ends at 6 with it still off: the
    # wait is over with the run, so it clears at the final snapshot, saying so and why
    assert final(alerter, "11100", False) == [(1, "fired", 1), (6, "cleared", 1)]
    alerter = Alerter([Scripted()])
    run(alerter, "10")
    (cleared,) = alerter.observe(snap(3, False, final=True))
    assert cleared.message == "cleared at the run's end after 2 s: off"  # fired at t 101, the end at t 103
    assert cleared.numbers == {"tick": 3.0} and cleared.t == 103.0


def test_at_the_runs_end_a_condition_that_still_holds_stays_fired():
    assert final(Alerter([Scripted()]), "1100", True) == [(1, "fired", 1)]


def test_at_the_runs_end_a_rule_that_holds_clears_the_episodes_it_had_seen_go_quiet():
    # Quiet at its latest judgement (off at 3, 1 s into the wait): cleared at the end in the words it had then.
    alerter = Alerter([Scripted()])
    assert final(alerter, "110", None) == [(1, "fired", 1), (4, "cleared", 1)]
    # Still on at its latest judgement: a rule that cannot judge the end does not make it go away.
    assert final(Alerter([Scripted()]), "111", None) == [(1, "fired", 1)]


def test_a_disabled_rule_never_runs():
    configs, errors = alert_config({"alerts": {"scripted": {"enabled": False}}}, [Scripted()])
    assert errors == [] and configs["scripted"]["enabled"] == 0.0
    assert Alerter([Scripted()], configs).observe(snap(1, True)) == []


def test_rule_config_merges_common_defaults_rule_defaults_and_the_table():
    config = rule_config(Scripted(), {"fire_after_s": 5, "clear_after_s": 0.5})
    assert config == {**COMMON_DEFAULTS, "clear_after_s": 0.5, "fire_after_s": 5.0, "enabled": 1.0}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            {"clear_afte_s": 1},
            "tm.toml [alerts.scripted]: unknown key 'clear_afte_s'; accepted: clear_after_s, ",
        ),
        ({"fire_after_s": -1}, "tm.toml [alerts.scripted] fire_after_s: expected a number ≥ 0, got -1"),
        ({"fire_after_s": "2s"}, "tm.toml [alerts.scripted] fire_after_s: expected a number ≥ 0, got '2s'"),
        (
            {"fire_after_s": math.inf},
            "tm.toml [alerts.scripted] fire_after_s: expected a number ≥ 0, got inf",
        ),
        ({"fire_after_s": True}, "tm.toml [alerts.scripted] fire_after_s: expected a number ≥ 0, got True"),
        ({"enabled": "no"}, "tm.toml [alerts.scripted] enabled: expected true or false, got 'no'"),
    ],
)
def test_a_bad_threshold_is_one_line_naming_the_table_the_key_and_what_is_accepted(table, message):
    with pytest.raises(AlertConfigError) as caught:
        rule_config(Scripted(), table)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_alert_config_keeps_defaults_for_a_bad_table_and_names_unknown_rules():
    document = {"alerts": {"scripted": {"fire_after_s": "x"}, "hungg": {"floor_s": 1}}}
    configs, errors = alert_config(document, [Scripted()], where="/w/tm.toml")
    assert configs["scripted"]["fire_after_s"] == 0.0
    assert errors == [
        "/w/tm.toml [alerts.hungg]: no such alert rule; rules: scripted",
        "/w/tm.toml [alerts.scripted] fire_after_s: expected a number ≥ 0, got 'x' (the rule keeps its defaults)",
    ]
    assert alert_config({"alerts": 3}, [Scripted()])[1] == [
        "tm.toml: 'alerts' must be a table of rule tables, e.g. [alerts.hung]"
    ]
