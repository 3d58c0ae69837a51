"""The launcher's wait for the final snapshot and the died alert waits only for what is pending: once the alerts
component wrote its alert after run.end, it waits no more, even though that component stopped listening since (a
killed run's tm used to linger 3 s there, counted as the run down between a resume's attempts)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainmeter_core.run import final_snapshot


class Hub:
    """The hub as final_with_components reads it: the last snapshot, the late alerts, who listens."""

    def __init__(self, late_alerts: int, topics: set[str], final: bool = True) -> None:
        self.last_snapshot = {"final": final}
        self.late_alerts = late_alerts
        self.topics = topics
        self.injected: list = []

    def listening(self, kind: str) -> bool:
        return kind in self.topics

    def inject(self, snapshot) -> None:
        self.injected.append(snapshot)


def components(*names: str):
    return SimpleNamespace(placements=[SimpleNamespace(components=list(names))])


@pytest.fixture
def naps(monkeypatch):
    """Each sleep of the waits, counted; the clock moves by the sleep, so a wait that never ends ends at its deadline."""
    slept: list[float] = []
    now = [0.0]

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(final_snapshot.time, "sleep", sleep)
    monkeypatch.setattr(final_snapshot.time, "monotonic", lambda: now[0])
    return slept


def test_a_died_alert_already_written_ends_the_wait_though_nobody_listens_for_snapshots_any_more(naps):
    hub = Hub(late_alerts=1, topics={"alert", "run.end"})
    assert (
        final_snapshot.final_with_components(components("engine", "alerts"), hub, None, None, print, 143)
        is None
    )
    assert naps == []  # no wait at all
    assert hub.injected == []


def test_with_no_alert_yet_it_waits_for_the_alerts_component_then_for_its_alert(naps):
    hub = Hub(late_alerts=0, topics={"snapshot"})
    final_snapshot.final_with_components(components("engine", "alerts"), hub, None, None, print, 143)
    # listening already; the alert never comes here, so it waits for it until its deadline, and no longer
    assert sum(naps) == pytest.approx(final_snapshot.DIED_ALERT_WAIT_S, abs=0.05)


def test_a_run_that_ended_well_waits_for_no_alert(naps):
    hub = Hub(late_alerts=0, topics=set())
    final_snapshot.final_with_components(components("engine", "alerts"), hub, None, None, print, 0)
    assert naps == []
