"""The badput buckets (model/engine/badput.py, hangs.py): each phase its own bucket wherever it lies, a stall the hung
alert fired on is a hang, a checkpoint loaded before a resumed attempt's first step is no start-up, and the buckets
with the productive step time add up to the elapsed time, over the run and attempt by attempt."""

from __future__ import annotations

import pytest
from test_engine_attempts import Log, feed

from trainmeter_core.model import formulas, records


def hung(log: Log, t: float, steps: int, state: str = "fired") -> None:
    log.add(
        records.Alert(
            t=t,
            rule="hung",
            state=state,
            severity="critical",
            message="no step",
            numbers={"steps": float(steps)},
        )
    )


def test_a_stall_the_hung_alert_fired_on_is_a_hang_less_the_phases_inside_it():
    log = Log()
    log.start(100.0)
    log.steps(1, 10, 110.0)  # 110 .. 119
    hung(log, 125.0, 10)  # fired while step 10 was the latest
    log.phase("data_wait", 129.5, 130.0)  # inside the stall: the data wait's own
    log.steps(11, 15, 130.0)  # 130 .. 134
    hung(log, 136.0, 15, "cleared")
    log.end(135.0)
    final = feed(log.records)[1][-1]
    split = final.phases_s
    # hang: 119 → 130 = 11, less the 0.5 s data wait = 10.5; compute: 119 − 110 = 9 and 134 − 130 = 4: 13
    assert split["hang"] == pytest.approx(10.5)
    assert split["data_wait"] == pytest.approx(0.5)
    assert split["compute"] == pytest.approx(13.0)
    # startup 10, after the last step 1: 10 + 0.5 + 10.5 + 13 + 1 = 35 = elapsed, nothing other
    assert split["startup"] == pytest.approx(10.0) and split["after_last_step"] == pytest.approx(1.0)
    assert split["other"] == pytest.approx(0.0, abs=1e-9)
    assert sum(split.values()) == pytest.approx(final.elapsed_s) == 35.0
    assert final.metrics["goodput"].value == pytest.approx(13.0 / 35.0)


def test_a_hung_alert_that_arrives_after_the_run_stepped_again_opens_no_hang():
    log = Log()
    log.start(100.0)
    log.steps(1, 12, 110.0)
    hung(log, 122.5, 10)  # it judged step 10's stall, but steps 11 and 12 came first
    log.end(125.0)
    assert feed(log.records)[1][-1].phases_s["hang"] == 0.0


def test_a_hang_still_open_counts_up_to_now_and_to_the_end():
    log = Log()
    log.start(100.0)
    log.steps(1, 10, 110.0)
    hung(log, 125.0, 10)
    log.tick(128.0, 1)
    log.end(131.0)
    live, final = feed(log.records)[1]
    # live: 119 → 128 = 9 s of hang, compute 9 (the step in progress is the hang's)
    assert live.phases_s["hang"] == pytest.approx(9.0) and live.phases_s["compute"] == pytest.approx(9.0)
    # at the end: 119 → 131 = 12 s, none of it after the last step
    assert final.phases_s["hang"] == pytest.approx(12.0)
    assert final.phases_s["after_last_step"] == 0.0


def test_a_hang_inside_steps_done_again_stays_a_hang():
    log = Log()
    log.start(100.0)
    log.steps(1, 10, 110.0)
    log.phase("checkpoint", 119.2, 119.5, step=10)
    log.steps(11, 12, 120.0)  # 120, 121
    hung(log, 125.0, 12)
    log.steps(13, 15, 131.0)  # the stall: 121 → 131, 10 s
    log.tick(133.5, 1)
    log.start(140.0, attempt=2)
    log.steps(11, 20, 150.0, first_fields={"resumed_from": 10})
    log.end(160.0)
    final = feed(log.records)[1][-1]
    split = final.phases_s
    # superseded: the checkpoint's end 119.5 → step 15 at 133 = 13.5, less the 10 s hang = 3.5
    assert split["hang"] == pytest.approx(10.0)
    assert split["superseded"] == pytest.approx(3.5)
    assert split["other"] == pytest.approx(0.0, abs=1e-9)
    assert sum(split.values()) == pytest.approx(final.elapsed_s) == 60.0


def test_a_checkpoint_loaded_before_a_resumed_attempts_first_step_is_its_own_bucket():
    log = Log()
    log.start(100.0)
    log.steps(1, 10, 110.0)
    log.phase("checkpoint", 119.0, 119.5, step=10)
    log.tick(120.0, 1)
    log.start(150.0, attempt=2)
    log.phase("compile", 152.0, 155.0)
    log.phase("checkpoint_load", 155.0, 157.0)
    log.phase("data_wait", 159.0, 160.0)
    log.steps(11, 20, 160.0, first_fields={"resumed_from": 10})
    log.end(170.5)
    final = feed(log.records)[1][-1]
    split = final.phases_s
    # attempt 2's 10 s before its first step: 3 compiling, 2 loading, 1 waiting for data, 4 starting up; with attempt
    # 1's 10 s of start-up, 14
    assert (split["compile"], split["checkpoint_load"], split["data_wait"]) == pytest.approx((3.0, 2.0, 1.0))
    assert split["startup"] == pytest.approx(14.0)
    assert sum(split.values()) == pytest.approx(final.elapsed_s) == 70.5
    first, second = final.attempts
    assert (
        second.phases_s["checkpoint_load"] == pytest.approx(2.0) and first.phases_s["checkpoint_load"] == 0.0
    )
    # the attempts' bars add up to the run's split, bucket by bucket
    for name in (*formulas.BADPUT_BUCKETS, "compute"):
        assert first.phases_s[name] + second.phases_s[name] == pytest.approx(split[name], abs=1e-9), name
