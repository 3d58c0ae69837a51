"""The launcher's wait for the final snapshot and the died alert waits only for what is pending: once the alerts
component said it is done (it acted on the final snapshot: ComponentContext.done), it waits no more, whether an alert
came or not (the died rule's episode may be open since an earlier attempt) and whether anyone still listens for
snapshots. A killed run's tm used to linger 3 s there, counted as the run down between a resume's attempts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainmeter_core.run import end_times, final_snapshot


class Hub:
    """The hub as final_with_components reads it: the last snapshot, the components done, who listens."""

    def __init__(self, done: set[str], topics: set[str], final: bool = True) -> None:
        self.last_snapshot = {"final": final}
        self.done_components = done
        self.topics = topics
        self.injected: list = []

    def listening(self, kind: str) -> bool:
        return kind in self.topics

    def inject(self, snapshot) -> None:
        self.injected.append(snapshot)


def components(*names: str):
    return SimpleNamespace(placements=[SimpleNamespace(components=list(names))])


def wait(hub: Hub, tm_status: int, said: list[str] | None = None, times: end_times.EndTimes | None = None):
    return final_snapshot.final_with_components(
        components("engine", "alerts"),
        hub,
        None,
        None,
        print if said is None else said.append,
        tm_status,
        times or end_times.EndTimes(),
    )


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
    monkeypatch.setattr(end_times.time, "monotonic", lambda: now[0])
    return slept


@pytest.mark.parametrize(
    "topics", [{"alert", "run.end"}, {"snapshot"}], ids=["nobody listens", "the web listens"]
)
def test_once_the_alerts_component_is_done_nothing_is_waited_for(naps, topics):
    hub = Hub(done={"alerts"}, topics=topics)
    assert wait(hub, 143) is None
    assert naps == []
    assert hub.injected == []


def test_with_the_alerts_component_listening_and_not_done_it_waits_until_its_deadline_and_no_longer(naps):
    hub = Hub(done=set(), topics={"snapshot"})
    said: list[str] = []
    times = end_times.EndTimes()
    wait(hub, 143, said, times)
    assert sum(naps) == pytest.approx(final_snapshot.DIED_ALERT_WAIT_S, abs=0.05)
    # The wait is timed as its own stage of the end, and said: an end that long is paid for by a scheduler's kill
    assert times.seconds["alerts done"] == pytest.approx(final_snapshot.DIED_ALERT_WAIT_S, abs=0.05)
    assert said == ["the alerts component did not act on the final snapshot within 3 s"]
    assert times.slow_line().startswith("ending the run took 3.0")
    assert "alerts done 3.0" in times.slow_line()


def test_a_run_that_ended_well_waits_for_no_alert(naps):
    wait(Hub(done=set(), topics={"snapshot"}), 0)
    assert naps == []
