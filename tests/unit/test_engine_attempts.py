"""A resumed run in the engine: one timeline over its attempts, the gap counted as downtime, the steps an attempt did
again counted as superseded, and every number the same however the log is cut or where the attempt ran."""

from __future__ import annotations

import msgspec
import pytest

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine

WALL = 900.0  # every record's wall time is its t + 900 s: one host, one clock, unless a test says otherwise


class Log:
    """Records in hub order over several attempts, numbered as the hub numbers them (on, across attempts)."""

    def __init__(self) -> None:
        self.records: list = []

    def add(self, record, wall_offset: float = WALL):
        record.seq = len(self.records) + 1
        record.host = record.host or "n1"
        if not record.wall:
            record.wall = record.t + wall_offset
        self.records.append(record)
        return record

    def start(self, t, attempt=1, **header):
        return self.add(
            records.RunStart(
                t=t, run_id="r1", name="train", run_dir="/runs/r1", command=["python", "train.py"], cwd="/w",
                tm_version="0.1.0", python="3.11", platform="linux", attempt=attempt, **header,
            )
        )  # fmt: skip

    def steps(self, first, last, t0, dt=1.0, tokens=100, first_fields=None, **header):
        """Steps ``first..last`` of rank 0, one every ``dt`` from ``t0``; the first has no step time (a new process)."""
        for i, step in enumerate(range(first, last + 1)):
            fields = dict(first_fields or {}) if i == 0 else {"step_time_s": dt}
            self.add(records.Step(t=t0 + i * dt, step=step, tokens=tokens, **fields, **header))

    def phase(self, name, start_t, end_t, step=None, **header):
        return self.add(records.Phase(t=end_t, phase=name, start_t=start_t, end_t=end_t, step=step, **header))

    def tick(self, t, n, **header):
        return self.add(records.Tick(t=t, n=n, interval_s=1.0, **header))

    def end(self, t, **fields):
        fields.setdefault("status", 0)
        fields.setdefault("reason", "exited")
        fields.setdefault("exit_code", 0)
        return self.add(records.RunEnd(t=t, elapsed_s=0.0, **fields))


def feed(logged, engine=None):
    engine = engine or Engine()
    out = []
    for record in logged:
        out.extend(engine.feed(record))
    return engine, out


def preempted_after_checkpoint() -> Log:
    """Attempt 1 steps 1..10 (t 110..119), writes its checkpoint of step 10 (119.0..119.5) and is killed: its last
    record is the tick at 120. Attempt 2 starts at 150, 30 s later by both clocks, loads step 10 and steps 11..20
    (t 160..169); the run ends at 170.5."""
    log = Log()
    log.start(100.0)
    log.steps(1, 10, 110.0)
    log.phase("checkpoint", 119.0, 119.5, step=10)
    log.tick(120.0, 1)
    log.start(150.0, attempt=2, resume_reason="--resume")
    log.steps(11, 20, 160.0, first_fields={"resumed_from": 10})
    log.tick(170.0, 2)
    log.end(170.5)
    return log


def test_a_run_resumed_from_its_last_checkpoint_counts_every_step_once_and_the_gap_as_downtime():
    _, snapshots = feed(preempted_after_checkpoint().records)
    final = snapshots[-1]
    assert final.final and final.steps == 20
    assert final.tokens == 2000  # 20 steps × 100 tokens
    assert final.elapsed_s == pytest.approx(70.5)  # 100 → 170.5, the gap included
    # startup: 100 → 110 = 10 and 150 → 160 = 10 (attempt 2 starting up); the checkpoint 0.5; down: last tick 120
    # (wall 1020) → start 150 (wall 1050) = 30; after the last step: 119.5 → 120 (the kill) = 0.5 and 169 → 170.5 = 1.5;
    # compute: 119 − 110 = 9 and 169 − 160 = 9
    assert final.phases_s == pytest.approx(
        {"startup": 20.0, "compile": 0.0, "data_wait": 0.0, "checkpoint": 0.5, "checkpoint_load": 0.0,
         "eval": 0.0, "profiler": 0.0, "hang": 0.0, "superseded": 0.0, "down": 30.0, "after_last_step": 2.0,
         "other": 0.0, "compute": 18.0}
    )  # fmt: skip
    assert sum(final.phases_s.values()) == pytest.approx(final.elapsed_s)
    # goodput = compute 18 / 70.5 = 0.2553…: the 30 s down and 20 s of start-up are lost time
    assert final.metrics["goodput"].value == pytest.approx(18 / 70.5)
    note = final.explain["goodput"].note
    assert note.startswith("lost 52.5 s of 70.5 s: down between attempts 30.0 s, start-up and imports 20.0 s")
    # one bar per attempt: each attempt's share, the gap before it its down; together the run's split
    first, second = final.attempts
    assert first.phases_s == pytest.approx(
        {**dict.fromkeys(final.phases_s, 0.0), "startup": 10.0, "checkpoint": 0.5, "after_last_step": 0.5,
         "compute": 9.0}
    )  # fmt: skip
    assert second.phases_s == pytest.approx(
        {**dict.fromkeys(final.phases_s, 0.0), "startup": 10.0, "down": 30.0, "after_last_step": 1.5,
         "compute": 9.0}
    )  # fmt: skip
    first, second = final.attempts
    assert (first.attempt, first.end, first.first_step, first.last_step, first.steps) == (
        1,
        "lost",
        1,
        10,
        10,
    )
    assert (first.last_t, first.last_wall) == (120.0, 1020.0)
    assert (second.attempt, second.end, second.first_step, second.last_step, second.steps) == (
        2,
        "exited 0",
        11,
        20,
        10,
    )
    assert second.gap_s == pytest.approx(30.0) and second.resumed_from == 10
    assert final.metrics["attempt"].value == 2.0
    assert final.metrics["superseded_steps"].value == 0.0


@pytest.mark.parametrize("late", [False, True], ids=["phase-in-time", "phase-two-steps-late"])
def test_steps_an_attempt_does_again_are_superseded_and_their_time_is_lost(late):
    log = Log()
    log.start(100.0)
    log.steps(1, 10, 110.0)  # step k at 109 + k
    if not late:
        log.phase("checkpoint", 119.2, 119.5, step=10)  # after step 10 (119), before step 11 (120)
    log.steps(11, 12, 120.0, first_fields={"step_time_s": 1.0})
    if late:
        # The agent batches phases: the checkpoint's record may reach the hub after the steps that followed it.
        log.phase("checkpoint", 119.2, 119.5, step=10)
    log.phase("data_wait", 121.5, 121.7)  # between steps 12 and 13: inside the stretch that will be redone
    log.steps(13, 15, 122.0, first_fields={"step_time_s": 1.0})
    log.tick(124.5, 1)  # attempt 1's last tick: where it ended
    log.start(130.0, attempt=2)
    log.steps(11, 20, 140.0, first_fields={"resumed_from": 10})
    log.tick(150.0, 2)
    log.end(150.5)
    _, snapshots = feed(log.records)
    final = snapshots[-1]
    assert (
        final.steps == 20 and final.tokens == 2000
    )  # steps 1..20 once each: 11..15 of attempt 1 are superseded
    assert final.metrics["superseded_steps"].value == 5.0
    inputs = final.explain["superseded_steps"].inputs
    assert inputs["superseded_tokens"].value == 500  # 5 steps × 100
    # The stretch after the checkpoint (119.5) to attempt 1's last step (124) = 4.5 s, less its data wait 0.2 s
    assert inputs["superseded_s"].value == pytest.approx(4.3)
    # startup 10 + (130 → 140) 10 = 20; checkpoint 0.3; data wait 0.2; down 124.5 → 130 = 5.5; superseded 4.3;
    # compute 110 → 119.5 less the checkpoint = 9.2, and 140 → 149 = 9: 18.2; after the last step 124 → 124.5 and
    # 149 → 150.5: 2.0
    assert final.phases_s == pytest.approx(
        {"startup": 20.0, "compile": 0.0, "data_wait": 0.2, "checkpoint": 0.3, "checkpoint_load": 0.0,
         "eval": 0.0, "profiler": 0.0, "hang": 0.0, "superseded": 4.3, "down": 5.5, "after_last_step": 2.0,
         "other": 0.0, "compute": 18.2}
    )  # fmt: skip
    assert sum(final.phases_s.values()) == pytest.approx(final.elapsed_s) == 50.5
    assert final.metrics["goodput"].value == pytest.approx(18.2 / 50.5)
    # attempt 1's bar holds the steps attempt 2 did again
    assert final.attempts[0].phases_s["superseded"] == pytest.approx(4.3)
    assert final.attempts[0].phases_s["compute"] == pytest.approx(9.2)
    assert final.attempts[1].phases_s["superseded"] == pytest.approx(0.0, abs=1e-9)
    first = final.attempts[0]
    assert (first.last_step, first.superseded_steps, first.superseded_s) == (15, 5, pytest.approx(4.3))


def test_each_ranks_steps_count_the_steps_it_kept_as_the_runs_steps_do():
    # Two ranks step 1..15 in attempt 1; attempt 2 resumes after step 10 and steps 11..20: steps 11..15 of attempt 1
    # are superseded for both ranks, so each rank counts 20 (25 step records less the 5 done again), as the run does.
    log = Log()
    log.start(100.0)
    for step in range(1, 16):
        log.steps(step, step, 109.0 + step, rank=0)
        log.steps(step, step, 109.0 + step + 0.01, rank=1)
    log.tick(124.5, 1)
    log.start(130.0, attempt=2)
    for step in range(11, 21):
        first = {"resumed_from": 10} if step == 11 else {"step_time_s": 1.0}
        # rank 1 reports first in this attempt: the order of the ranks' records never matters
        log.steps(step, step, 129.0 + step, first_fields=first, rank=1)
        log.steps(step, step, 129.0 + step + 0.01, first_fields=first, rank=0)
    log.tick(150.0, 2)
    log.end(150.5)
    _, snapshots = feed(log.records)
    final = snapshots[-1]
    assert final.steps == 20 and final.metrics["superseded_steps"].value == 5.0
    assert {r.rank: r.steps for r in final.ranks} == {0: 20, 1: 20}
    # while attempt 2 runs: the steps 11..14 it has taken again count once, not twice
    engine, _ = feed(log.records[: len(log.records) - 12])  # up to step 15 of attempt 2, both ranks
    snap = engine.snapshot()
    assert snap.steps == 15 and {r.rank: r.steps for r in snap.ranks} == {0: 15, 1: 15}


def test_without_a_checkpoint_mark_the_recent_steps_give_the_exact_point_to_go_back_to():
    log = Log()
    log.start(100.0)
    log.steps(1, 15, 110.0)  # no checkpoint phase: the agent did not see the save
    log.tick(124.5, 1)
    log.start(130.0, attempt=2)
    log.steps(11, 20, 140.0, first_fields={"resumed_from": 10})
    log.end(150.0)
    _, snapshots = feed(log.records)
    final = snapshots[-1]
    # step 10 at 119 to step 15 at 124: 5 s superseded
    assert final.steps == 20 and final.tokens == 2000
    assert final.explain["superseded_steps"].inputs["superseded_s"].value == pytest.approx(5.0)


def test_an_attempt_on_another_clock_joins_the_timeline_by_the_wall_clock():
    same = preempted_after_checkpoint()
    other = Log()
    for record in msgspec.json.decode(msgspec.json.encode(same.records), type=list[records.AnyRecord]):
        if record.seq >= 14:  # attempt 2 from its run.start: a rebooted node, whose monotonic clock restarted
            record.t -= 145.0
            record.host = "n2"
            if isinstance(record, records.Phase):
                record.start_t -= 145.0
                record.end_t -= 145.0
        other.records.append(record)
    assert isinstance(other.records[13], records.RunStart) and other.records[13].t == 5.0
    _, a = feed(same.records)
    _, b = feed(other.records)
    for key in ("goodput", "steps", "tokens"):
        assert (b[-1].metrics.get(key), b[-1].steps, b[-1].tokens) == (
            a[-1].metrics.get(key),
            a[-1].steps,
            a[-1].tokens,
        )
    assert b[-1].phases_s == pytest.approx(a[-1].phases_s)
    assert b[-1].elapsed_s == pytest.approx(70.5)


def test_while_an_attempt_restarts_it_is_not_hung_and_its_start_up_is_counted_up_to_now():
    log = preempted_after_checkpoint()
    log.records = log.records[:14]  # through attempt 2's run.start
    log.tick(155.0, 2)
    _, snapshots = feed(log.records)
    live = snapshots[-1]
    assert not live.final and live.state == "running"
    assert live.metrics["since_step_s"].absent == "attempt 2 is restarting: no step of it yet"
    assert live.metrics["since_attempt_start_s"].value == pytest.approx(5.0)  # 150 → 155
    # attempt 2 starting up so far: 150 → 155 = 5 (and attempt 1's 10); after attempt 1's last step: 119.5 → 120
    assert live.phases_s["startup"] == pytest.approx(15.0) and live.phases_s["down"] == pytest.approx(30.0)
    assert live.phases_s["after_last_step"] == pytest.approx(0.5)
    assert live.phases_s["compute"] == pytest.approx(9.0)
    assert sum(live.phases_s.values()) == pytest.approx(live.elapsed_s) == 55.0
    assert [a.end for a in live.attempts] == ["lost", "running"]


def test_an_attempt_that_ended_with_a_signal_says_so_and_the_next_one_is_live_again():
    log = Log()
    log.start(100.0)
    log.steps(1, 5, 110.0)
    log.end(115.0, status=143, reason="signaled", exit_code=None, signal=15, signal_name="SIGTERM")
    log.start(120.0, attempt=2)
    log.tick(121.0, 1)
    engine, snapshots = feed(log.records)
    assert snapshots[0].final  # attempt 1's end
    live = snapshots[-1]
    assert not live.final and live.state == "running"
    assert live.metrics["exit_code"].absent == "the run has not ended"
    assert live.attempts[0].end == "killed by SIGTERM"


def test_steps_that_start_again_at_one_are_all_superseded_and_the_warning_says_how_to_do_better():
    log = Log()
    log.start(100.0)
    log.steps(1, 10, 110.0)
    log.tick(120.0, 1)
    log.start(150.0, attempt=2)
    log.steps(1, 10, 160.0)  # the training started over (or tm could not see the step it resumed from)
    log.end(170.0)
    _, snapshots = feed(log.records)
    final = snapshots[-1]
    assert final.steps == 10 and final.tokens == 1000
    assert final.metrics["superseded_steps"].value == 10.0
    assert any(w.startswith("attempt 2 started again at step 1") for w in final.warnings)


def test_counters_over_the_training_window_leave_the_time_between_attempts_out():
    log = preempted_after_checkpoint()
    logged = log.records
    cpu = [
        *(records.SampleHost(t=t, root_pid=1, procs=1, cpu_cores=1.0, window_s=1.0) for t in range(111, 120)),
        *(records.SampleHost(t=t, root_pid=1, procs=1, cpu_cores=0.1, window_s=1.0) for t in range(151, 160)),
        *(records.SampleHost(t=t, root_pid=1, procs=1, cpu_cores=1.0, window_s=1.0) for t in range(161, 170)),
    ]
    merged = Log()
    for record in sorted([*logged, *cpu], key=lambda r: (r.t, 0 if isinstance(r, records.RunStart) else 1)):
        record.seq = None
        merged.add(record)
    _, snapshots = feed(merged.records)
    # busy 1.0 over every second of both attempts' steps; the 0.1 of the restart lies between them
    assert snapshots[-1].metrics["host_cpu_cores_avg"].value == pytest.approx(1.0)


def test_a_restored_engine_continues_a_resumed_run_exactly():
    logged = preempted_after_checkpoint().records
    _, whole = feed(logged)
    for cut in (5, 14, 17):
        engine, head = feed(logged[:cut])
        restored = Engine.from_state(engine.state_bytes())
        _, tail = feed(logged[cut:], restored)
        assert [msgspec.json.encode(s) for s in head + tail] == [msgspec.json.encode(s) for s in whole]


def test_a_run_started_once_lists_no_attempts_and_no_resume_numbers():
    log = Log()
    log.start(100.0)
    log.steps(1, 10, 110.0)
    log.end(120.0)
    _, snapshots = feed(log.records)
    final = snapshots[-1]
    assert final.attempts == []
    assert not {"attempt", "superseded_steps", "since_attempt_start_s"} & set(final.metrics)
    # the buckets of a resumed run are there, and hold nothing: one attempt is never down nor does steps again
    assert (final.phases_s["down"], final.phases_s["superseded"]) == (0.0, 0.0)


def test_the_mfu_over_the_training_window_leaves_the_joins_out():
    log = preempted_after_checkpoint()
    facts = [
        records.Fact(t=101.0, name="flop_per_token", value=1e9, provenance="declared", origin="--flops-per-token"),
        records.Fact(t=101.0, name="device", value={"type": "cpu"}, provenance="detected", origin="agent", rank=0),
        records.Fact(
            t=101.0, name="peak", provenance="detected", origin="tm peak", device="n1/cpu",
            value={"flop_per_s": 1e12, "label": "measured", "source": "tm peak", "device_type": "cpu"},
        ),
    ]  # fmt: skip
    logged = [log.records[0], *facts, *log.records[1:]]
    for index, record in enumerate(logged):
        record.seq, record.host = index + 1, "n1"
    _, snapshots = feed(logged)
    avg = snapshots[-1].metrics["mfu_avg"]
    # window: 110 → 169 less the join 119 → 160 = 18 s; its tokens, those of each attempt's steps after its first
    # (whose work lies before the window): 9 + 9 steps × 100 = 1,800. 1e9 × 1,800 / (1e12 × 18) = 0.1
    assert snapshots[-1].explain["mfu_avg"].inputs["window_s"].value == pytest.approx(18.0)
    assert avg.value == pytest.approx(0.1)


# ----------------------------------------------------------------------------------------------------------------------
# Alerts: the attempt before, said while the next one restarts


def alerts_of(logged) -> list[records.Alert]:
    from trainmeter_core.model.alerts import Died, Hung
    from trainmeter_core.model.alerts.episodes import Alerter

    alerter = Alerter([Died(), Hung()])
    _, snapshots = feed(logged)
    return [alert for snapshot in snapshots for alert in alerter.observe(snapshot)]


def test_a_lost_attempt_is_reported_while_the_next_restarts_and_cleared_once_it_steps():
    log = preempted_after_checkpoint()
    logged = log.records[:14]  # through attempt 2's run.start (t 150)
    log.records = logged
    log.tick(151.0, 2)  # restarting
    log.steps(11, 12, 160.0, first_fields={"resumed_from": 10})
    log.tick(170.0, 3)  # stepping again, 20 s into attempt 2
    fired, cleared = alerts_of(log.records)
    assert (fired.rule, fired.state, fired.severity) == ("died", "fired", "warning")
    assert fired.message == (
        "attempt 1 of the run was lost after step 10: tm stopped with the training, so no exit was seen; "
        "attempt 2 resumes it"
    )
    assert fired.numbers == {"attempt": 2.0, "gap_s": 30.0, "steps": 10.0}
    assert (cleared.state, cleared.episode) == ("cleared", fired.episode)
    assert (
        cleared.message
        == "cleared after 19 s: the run resumed: attempt 2 steps again from step 11 after 30 s down"
    )
    # no hang: from 119 to 160 no step came, but attempt 2 was restarting
    assert all(a.rule != "hung" for a in (fired, cleared))


def test_a_died_alert_of_the_attempt_before_stays_until_the_next_one_steps():
    log = Log()
    log.start(100.0)
    log.steps(1, 5, 110.0)
    log.end(115.0, status=143, reason="signaled", exit_code=None, signal=15, signal_name="SIGTERM")
    log.start(120.0, attempt=2)
    log.tick(121.0, 1)
    log.steps(6, 7, 130.0, first_fields={"resumed_from": 5})
    log.tick(131.0, 2)
    fired, cleared = alerts_of(log.records)
    assert fired.message == "the training process was killed by SIGTERM (signal 15) after 5 steps"
    assert cleared.state == "cleared" and cleared.message.endswith(
        "the run resumed: attempt 2 steps again from step 6 after 5 s down"
    )


def test_progress_and_eta_go_on_from_the_steps_the_run_kept():
    log = Log()
    log.start(100.0)
    log.add(
        records.Fact(
            t=100.5, name="budget_tokens", value=4000, provenance="declared", origin="--budget-tokens"
        )
    )
    log.steps(1, 15, 110.0)  # killed after step 15, resumed from the checkpoint of step 10
    log.tick(124.5, 1)
    log.start(130.0, attempt=2)
    log.steps(11, 20, 140.0, first_fields={"resumed_from": 10})
    log.tick(149.5, 2)
    _, snapshots = feed(log.records)
    live = snapshots[-1]
    # 20 steps × 100 tokens kept of a 4,000-token budget: half way; tokens/s, an EMA of 100 tokens per 1 s step, is 100
    assert live.metrics["progress"].value == pytest.approx(0.5)
    assert live.metrics["tokens_per_s"].value == pytest.approx(100.0)
    assert live.metrics["eta_s"].value == pytest.approx(20.0)  # the 2,000 tokens left at 100 tokens/s


def test_a_run_resumed_twice_after_an_attempt_that_never_stepped_counts_both_gaps():
    log = Log()
    log.start(100.0)
    log.steps(1, 10, 110.0)
    log.phase("checkpoint", 119.0, 119.5, step=10)
    log.tick(120.0, 1)  # attempt 1 ends here
    log.start(130.0, attempt=2)  # 10 s later; it loads the checkpoint and dies before its first step
    log.tick(135.0, 2)
    log.start(150.0, attempt=3)  # 15 s after attempt 2's last tick
    log.steps(11, 20, 160.0, first_fields={"resumed_from": 10})
    log.end(170.5)
    _, snapshots = feed(log.records)
    final = snapshots[-1]
    assert final.steps == 20 and final.tokens == 2000
    # down 10 + 15 = 25; startup 10 (attempt 1) + 5 (attempt 2, all its life) + 10 (attempt 3) = 25; after the last
    # step 0.5 (119.5 → 120) + 1.5; compute 9 + 9 = 18
    assert final.phases_s == pytest.approx(
        {"startup": 25.0, "compile": 0.0, "data_wait": 0.0, "checkpoint": 0.5, "checkpoint_load": 0.0,
         "eval": 0.0, "profiler": 0.0, "hang": 0.0, "superseded": 0.0, "down": 25.0, "after_last_step": 2.0,
         "other": 0.0, "compute": 18.0}
    )  # fmt: skip
    assert [(a.attempt, a.end, a.first_step, a.steps, a.gap_s) for a in final.attempts] == [
        (1, "lost", 1, 10, None),
        (2, "lost", None, 0, 10.0),
        (3, "exited 0", 11, 10, 15.0),
    ]
