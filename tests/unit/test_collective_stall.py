"""The collective probe's stall reports (``CollectiveProbe._check_stall``): a rank that goes ``stall_s`` without a
step says where it waits, and says it steps again once a step comes; a step learnt late (its window left after the
report) that is itself ``stall_s`` old replaces the report at once, never with "stepping again" in between."""

from __future__ import annotations

from trainmeter_agent._collectives import STALL_FACT, CollectiveProbe


class _Agent:
    def __init__(self) -> None:
        self.facts: list[tuple[str, dict, str]] = []

    def fact(self, key: str, value: dict, origin: str) -> None:
        self.facts.append((key, value, origin))


def _probe(monkeypatch) -> tuple[CollectiveProbe, _Agent]:
    monkeypatch.setenv("TM_COLLECTIVE_STALL_S", "1.5")
    agent = _Agent()
    probe = CollectiveProbe(agent)
    # The report's own contents (the flight recorder's groups and waits, the stacks) are the hang's: only its step
    # matters here
    probe.stall_report = lambda now: {"stalled": True, "step": probe._last_step, "at": now}
    return probe, agent


def _learnt(probe: CollectiveProbe, step: int, t: float) -> None:
    """A step record left for the bus: what ``saw_batch`` notes of it."""
    probe._last_step, probe._last_step_t = step, t


def test_a_step_learnt_after_the_report_but_as_old_as_a_stall_replaces_the_report_without_a_gap(monkeypatch):
    probe, agent = _probe(monkeypatch)
    _learnt(probe, 18, 100.0)
    probe._check_stall(101.0)
    assert agent.facts == []  # 1.0 s without a step: not yet
    probe._check_stall(101.6)
    assert [value for _, value, _ in agent.facts] == [{"stalled": True, "step": 18, "at": 101.6}]
    # Step 19 ended at 100.5, before the report, and its record left at 102.5 (a loaded machine's late window): the
    # rank has still not stepped for 2.1 s, so its report is sent again at step 19, in the old one's place
    _learnt(probe, 19, 100.5)
    probe._check_stall(102.6)
    assert [value for _, value, _ in agent.facts[1:]] == [{"stalled": True, "step": 19, "at": 102.6}]
    probe._check_stall(103.6)
    assert len(agent.facts) == 2  # said already for this step
    # A step that is recent: the rank steps again
    _learnt(probe, 20, 103.9)
    probe._check_stall(104.0)
    assert agent.facts[2:] == [(STALL_FACT, {"stalled": False, "step": 20}, "collectives")]
    assert {key for key, _, _ in agent.facts} == {STALL_FACT}
    # ...and a later stall is reported again
    probe._check_stall(105.0)
    assert len(agent.facts) == 3
    probe._check_stall(105.5)
    assert agent.facts[3][1] == {"stalled": True, "step": 20, "at": 105.5}
