"""tm's own end, timed stage by stage (summary.json's ``tm_end_s``): a quick end says nothing, a slow one names its
stages, longest first, and a stage entered twice adds up."""

from __future__ import annotations

import pytest

from trainmeter_core.run import end_times


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(end_times.time, "monotonic", lambda: now[0])
    return now


def test_a_quick_end_says_nothing_and_keeps_its_stages_in_order(clock):
    times = end_times.EndTimes()
    for stage, seconds in (("run.end", 0.05), ("components", 0.2), ("recorder", 0.01)):
        with times.stage(stage):
            clock[0] += seconds
    assert list(times.seconds) == ["run.end", "components", "recorder"]
    assert times.total_s() == pytest.approx(0.26)
    assert times.slow_line() is None


def test_a_slow_end_names_its_stages_longest_first_and_a_stage_twice_adds_up(clock):
    times = end_times.EndTimes()
    with times.stage("components"):
        clock[0] += 0.4
    with times.stage("alerts done"):
        clock[0] += 2.8
    with times.stage("components"):
        clock[0] += 0.1
    assert times.seconds["components"] == pytest.approx(0.5)
    assert times.slow_line() == (
        "ending the run took 3.30 s after the command ended: alerts done 2.80 s, components 0.50 s"
        " (summary.json: tm_end_s)"
    )


def test_a_stage_that_raises_is_timed_all_the_same(clock):
    times = end_times.EndTimes()
    with pytest.raises(RuntimeError), times.stage("hub"):
        clock[0] += 1.5
        raise RuntimeError("the hub's thread failed")
    assert times.seconds == {"hub": pytest.approx(1.5)}
