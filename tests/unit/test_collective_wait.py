"""The hang's culprit from the ranks' stall reports (``collective_wait.py``), and the hung rule's collective part:
who waits in which collective, who never entered it, a phase that explains the wait, the stacks on the alert."""

from __future__ import annotations

from trainmeter_core.model import records
from trainmeter_core.model.alerts import Hung
from trainmeter_core.model.alerts.collective_wait import describe, find_hang
from trainmeter_core.model.alerts.episodes import Alerter, rule_config

WORLD = {"desc": "default_pg", "ranks": [0, 1, 2, 3]}


def report(
    rank: int, entered: int, waiting: bool, phase: str | None = None, stalled: bool = True
) -> records.Fact:
    """Rank ``rank``'s collective.stall fact: it entered sequence number ``entered`` of group 0 (the last completed is
    one less when it waits in that one)."""
    value = {
        "stalled": stalled,
        "step": 19,
        "groups": {"0": {**WORLD, "entered": entered, "completed": entered - 1 if waiting else entered}},
        "waiting": [{"group": "0", "op": "all_reduce", "seq": entered, "bytes": 9376}] if waiting else [],
        "phase": phase,
        "stacks": f"stacks of rank {rank}",
    }
    fact = records.Fact(
        name="collective.stall", value=value, provenance="detected", origin="agent:collectives"
    )
    fact.rank = rank
    return fact


def facts(*reports: records.Fact) -> dict[str, records.Fact]:
    return {f"collective.stall@rank{fact.rank}": fact for fact in reports}


def test_three_ranks_in_all_reduce_25_name_the_rank_that_stayed_at_24():
    hang = find_hang(
        facts(report(0, 25, True), report(1, 24, False), report(2, 25, True), report(3, 25, True))
    )
    assert (hang.group, hang.desc, hang.op, hang.seq) == ("0", "default_pg", "all_reduce", 25)
    assert hang.entered == [0, 2, 3] and hang.missing == [1] and hang.silent == []
    assert sorted(hang.stacks) == [0, 1, 2, 3] and hang.stacks[1] == "stacks of rank 1"
    assert describe(hang, 61.2) == (
        "ranks 0, 2, 3 wait in all_reduce #25 of group 0 (default_pg) for 61 s: rank 1, alive, never entered it "
        "(every rank's stacks are attached)"
    )


def test_a_rank_that_sent_no_report_is_missing_and_silent_beside_one_that_reported():
    hang = find_hang(facts(report(0, 25, True), report(1, 24, False), report(2, 25, True)))
    assert hang.missing == [1, 3] and hang.silent == [3]
    assert describe(hang, 61.0).endswith(
        "rank 1, alive, never entered it; rank 3 never entered it and sent no report (every rank's stacks are attached)"
    )


def test_no_culprit_is_named_when_every_rank_short_of_the_collective_is_unheard():
    # One node's hub of a job hears its own ranks only: the others report to the job hub.
    assert find_hang(facts(report(0, 25, True), report(1, 25, True), report(2, 25, True))) is None


def test_no_rank_waiting_or_every_rank_entered_is_no_culprit():
    assert find_hang(facts(report(0, 24, False), report(1, 24, False))) is None
    everyone = [report(rank, 25, True) for rank in range(4)]
    assert find_hang(facts(*everyone)) is None  # all entered: slow network, not a rank that never came


def test_a_rank_stepping_again_is_not_a_report():
    hang = find_hang(facts(report(0, 25, True), report(1, 24, False, stalled=False), report(2, 24, False)))
    assert hang.missing == [1, 2, 3] and hang.silent == [1, 3]


def snap(t: float, since_step_s: float, fact_map: dict) -> records.Snapshot:
    metrics = {
        "since_step_s": records.MetricValue(value=since_step_s),
        "child_alive": records.MetricValue(value=1.0),
        "step_time_median_s": records.MetricValue(value=0.1),
    }
    return records.Snapshot(tick=int(t), t=t, steps=19, metrics=metrics, facts=fact_map, elapsed_s=t)


def alerter(**config) -> Alerter:
    rule = Hung()
    return Alerter([rule], {rule.name: rule_config(rule, config)})


def test_hung_fires_after_collective_floor_s_naming_the_culprit_with_every_ranks_stacks():
    hung = facts(report(0, 25, True), report(1, 24, False), report(2, 25, True), report(3, 25, True))
    alerts = alerter(collective_floor_s=5, clear_after_s=1)
    assert alerts.observe(snap(10.0, 4.0, hung)) == []  # under the collective floor; the step floor is 300 s
    (fired,) = alerts.observe(snap(11.0, 6.0, hung))
    assert (fired.state, fired.subject) == ("fired", "rank 1")
    assert "ranks 0, 2, 3 wait in all_reduce #25 of group 0 (default_pg)" in fired.message
    assert fired.attachments == {f"rank {k} stacks": f"stacks of rank {k}" for k in range(4)}
    assert fired.numbers["seq"] == 25.0 and fired.numbers["collective_floor_s"] == 5.0
    stepping = facts(*(report(k, 25, False, stalled=False) for k in range(4)))
    alerts.observe(snap(12.0, 0.1, stepping))
    (cleared,) = alerts.observe(snap(13.5, 0.1, stepping))
    assert (cleared.state, cleared.subject, cleared.attachments) == ("cleared", "rank 1", {})


def test_a_culprit_saving_a_checkpoint_is_that_phase_not_a_hang():
    saving = facts(report(0, 24, False, phase="checkpoint"), report(1, 25, True), report(2, 25, True))
    saving.update(facts(report(3, 25, True)))
    assert alerter(collective_floor_s=5).observe(snap(100.0, 90.0, saving)) == []


def test_without_stall_reports_the_step_floor_alone_judges():
    alerts = alerter(collective_floor_s=5, floor_s=300)
    assert alerts.observe(snap(100.0, 90.0, {})) == []


def test_a_hang_in_a_subgroup_names_only_that_groups_ranks():
    pair = {"desc": "tp", "ranks": [2, 3]}

    def report_in_pair(rank: int, entered: int, waiting: bool) -> records.Fact:
        fact = report(rank, 40, False)
        fact.value["groups"]["1"] = {
            **pair,
            "entered": entered,
            "completed": entered - 1 if waiting else entered,
        }
        fact.value["waiting"] = [{"group": "1", "op": "all_gather", "seq": entered}] if waiting else []
        return fact

    # Ranks 0 and 1 wait for nothing of group 1 (they are not in it); rank 2 waits in its all_gather #7, rank 3 is at 6.
    hang = find_hang(
        facts(
            report(0, 40, False),
            report(1, 40, False),
            report_in_pair(2, 7, True),
            report_in_pair(3, 6, False),
        )
    )
    assert (hang.group, hang.desc, hang.op, hang.seq, hang.entered, hang.missing) == (
        "1",
        "tp",
        "all_gather",
        7,
        [2],
        [3],
    )


def test_a_waiting_ranks_report_missing_for_a_moment_is_the_same_hang_not_a_second_alert():
    # ci70: under load, rank 2's report was gone for a moment (a step learnt after it), so the verdict named rank 2 as
    # silent too; the subject (and so the episode) is the ranks that reported and never entered, rank 1 alone
    hung = facts(report(0, 25, True), report(1, 24, False), report(2, 25, True), report(3, 25, True))
    gap = facts(report(0, 25, True), report(1, 24, False), report(3, 25, True))
    alerts = alerter(collective_floor_s=5, clear_after_s=1)
    (fired,) = alerts.observe(snap(11.0, 6.0, hung))
    assert alerts.observe(snap(12.0, 7.0, gap)) == []
    assert alerts.observe(snap(14.0, 9.0, gap)) == []  # past clear_after_s: still the one episode, fired
    assert alerts.observe(snap(15.0, 10.0, hung)) == []
    assert fired.subject == "rank 1" and alerts.open_episodes() == [("hung", "rank 1")]
    # and the words of a verdict with a silent rank name it beside the culprit
    (alone,) = alerter(collective_floor_s=5).observe(snap(11.0, 6.0, gap))
    assert alone.subject == "rank 1" and "rank 2 never entered it and sent no report" in alone.message
