"""The engine's train_loss: every value counted and kept in the history like the step times, whatever its origin (the
loss read at backward(), a tracker's, emit()'s), and the step of the first NaN or infinite one named.

The records come as a block of the agent's steady steps expands (``records.block.expand``): each iteration's loss
read at backward() comes just before its step record, so the engine holds a loss until its iteration is over.
"""

from __future__ import annotations

import math

from trainmeter_core.model import records
from trainmeter_core.model.alerts import LossNan
from trainmeter_core.model.alerts.episodes import Alerter
from trainmeter_core.model.engine import Engine

STEP_S = 0.05  # a step every 50 ms: a tick (every second) comes every 20 steps


def steady_steps(steps: int, loss, rank: int | None = None, pid: int = 42) -> list[records.Record]:
    """The records of ``steps`` steady iterations, loss ``loss(step)`` read at backward(), as a block of them expands
    (its clocks read together at t 0 and wall 1e9, so each row's wall is 1e9 + its t)."""
    numbers = range(1, steps + 1)
    losses = [loss(step) for step in numbers]
    block = records.Block(
        rows=steps + sum(1 for value in losses if value is not None),
        order="s" * steps,
        step=list(numbers),
        step_t=[step * STEP_S for step in numbers],
        step_time_s=[STEP_S if step > 1 else 0.0 for step in numbers],  # the first step has no interval
        optimizers=[1] * steps,
        agent_us=[None] * steps,
        micro_batches=[1] * steps,
        tokens=[64] * steps,
        tokens_source="input_ids",
        dp=1,
        loss=losses,
        loss_t=[
            None if value is None else step * STEP_S for step, value in zip(numbers, losses, strict=True)
        ],
        v=records.SCHEMA_VERSION,
        source="agent",
        host="n1",
        pid=pid,
        rank=rank,
        t=0.0,
        wall=1e9,
    )
    records.block.validate(block)
    return records.block.expand(block)


def with_ticks(logged: list[records.Record], every_s: float = 1.0) -> list[records.Record]:
    """``logged`` with a tick every ``every_s`` seconds (10 ms past each whole one), and a run.end after the last."""
    out: list[records.Record] = []
    n = 0
    for record in logged:
        while record.t > (n + 1) * every_s + 0.01:
            n += 1
            t = n * every_s + 0.01
            out.append(records.Tick(n=n, interval_s=every_s, child_alive=True, t=t, wall=1e9 + t))
        out.append(record)
    end_t = logged[-1].t + 0.01
    out.append(records.RunEnd(status=0, reason="exited", elapsed_s=end_t, t=end_t, wall=1e9 + end_t))
    return out


def replay(logged: list[records.Record]) -> tuple[Engine, list[records.Snapshot]]:
    engine = Engine()
    snapshots: list[records.Snapshot] = []
    for seq, record in enumerate(logged, start=1):
        record.seq = seq
        snapshots += engine.feed(record)
    return engine, snapshots


def loss_curve(step: int) -> float:
    return 4.0 / step**0.5


def test_every_loss_read_at_backward_is_kept_at_the_resolution_of_the_step_times():
    # 200 steps, 50 ms apart: 10 ticks. Each loss is held until the next one (or a tick) says its iteration is over.
    engine, _ = replay(with_ticks(steady_steps(200, loss_curve)))
    history = engine.history
    assert history.added_points("train_loss") == 200
    assert history.added_points("tm:rank:0:step_time_s") == 199  # 200 steps, 199 intervals
    raw = history.query("train_loss", "step")
    assert [(p.x, p.value, p.count) for p in raw] == [(float(s), loss_curve(s), 1) for s in range(1, 201)]
    # Thinned to 40 points, both merge 5 neighbours a point (ceil(200 / 40) = ceil(199 / 40) = 5) and keep every count.
    losses = history.query("train_loss", "step", max_points=40)
    times = history.query("tm:rank:0:step_time_s", "step", max_points=40)
    assert [p.count for p in losses] == [5] * 40 and sum(p.count for p in times) == 199
    assert [p.x for p in losses] == [
        float(s) for s in range(5, 201, 5)
    ]  # a merged point sits at its newest step
    assert losses[0].max == loss_curve(1) and losses[0].min == loss_curve(5)  # a spike survives thinning
    assert engine.snapshot().series["train_loss"].step == 200


def test_a_loss_read_at_backward_counts_as_many_points_as_emit_would():
    # The same values from emit() after each step: the same curve, point for point.
    emitted: list[records.Record] = []
    for record in steady_steps(150, loss_curve):
        if isinstance(record, records.Metric):
            continue
        emitted.append(record)
        emitted.append(
            records.Metric(
                values={"train_loss": loss_curve(record.step)}, step=record.step, t=record.t + 0.001
            )
        )
    by_emit, _ = replay(with_ticks(emitted))
    by_backward, _ = replay(with_ticks(steady_steps(150, loss_curve)))
    assert by_backward.history.query("train_loss", "step") == by_emit.history.query("train_loss", "step")
    assert by_backward.history.added_points("train_loss") == 150


def test_nan_from_step_101_on_counts_each_value_and_the_alert_names_step_101():
    # The loop's loss is NaN from step 101 to 150: 50 values, arriving 20 a tick, one alert at the first NaN step.
    logged = with_ticks(steady_steps(150, lambda step: math.nan if step >= 101 else loss_curve(step)))
    engine, snapshots = replay(logged)
    final = snapshots[-1]
    assert final.final and final.metrics["loss_nonfinite"].value == 50.0
    # The tick at 5.01 s (after step 100) saw no NaN; the one at 6.01 s saw steps 101..120, the first NaN at 101.
    by_tick = {s.tick: s for s in snapshots if not s.final}
    assert (
        by_tick[5].metrics["loss_tick_nonfinite_step"].absent
        == "no NaN or infinite train_loss since the previous tick"
    )
    assert by_tick[6].metrics["loss_tick_nonfinite_step"].value == 101.0
    assert by_tick[6].metrics["loss_nonfinite"].value == 20.0  # steps 101..120
    assert by_tick[7].metrics["loss_tick_nonfinite_step"].value == 121.0
    alerter = Alerter([LossNan()])
    fired = [alert for snapshot in snapshots for alert in alerter.observe(snapshot)]
    assert [(a.rule, a.state) for a in fired] == [("loss_nan", "fired")]
    assert fired[0].numbers["step"] == 101.0 and fired[0].numbers["latest_step"] == 120.0
    assert fired[0].message == (
        "train_loss is nan (the first NaN or infinite value at step 101; 20 so far, the latest at step 120)"
    )
    assert [p.count for p in engine.history.query("train_loss", "step")] == [1] * 150


def test_another_ranks_loss_read_at_backward_stays_out_of_train_loss():
    # Two DDP ranks, each reading its own shard's loss at backward(): train_loss is rank 0's, whose steps are the run's.
    rank_0 = steady_steps(30, loss_curve, rank=0, pid=1)
    rank_1 = steady_steps(30, lambda step: 100.0 + step, rank=1, pid=2)
    merged = sorted(rank_0 + rank_1, key=lambda r: (r.t, r.rank, isinstance(r, records.Step)))
    engine, _ = replay(with_ticks(merged))
    assert [p.value for p in engine.history.query("train_loss", "step")] == [
        loss_curve(s) for s in range(1, 31)
    ]


def test_the_loops_own_loss_after_its_step_still_replaces_the_one_read_at_backward():
    # backward (held), step, then the loop's emit for the same step: the loop's value is the one kept, once.
    logged: list[records.Record] = []
    for record in steady_steps(3, lambda step: 9.0):
        logged.append(record)
        if isinstance(record, records.Step):
            logged.append(
                records.Metric(values={"train_loss": 1.0 / record.step}, step=record.step, t=record.t)
            )
    engine, _ = replay(with_ticks(logged))
    assert [(p.x, p.value) for p in engine.history.query("train_loss", "step")] == [
        (1.0, 1.0),
        (2.0, 0.5),
        (3.0, 1 / 3),
    ]


def test_a_gpu_loss_read_a_few_steps_late_is_kept_too():
    # A CUDA loss is read once its copy has landed, some steps later, in step order: loss k comes after step k + 3.
    logged: list[records.Record] = []
    for step in range(1, 101):
        t = step * STEP_S
        logged.append(records.Step(step=step, t=t, wall=1e9 + t, step_time_s=STEP_S if step > 1 else None))
        if step > 3:
            late = step - 3
            logged.append(
                records.Metric(
                    values={"train_loss": loss_curve(late)}, step=late, t=t, wall=1e9 + t, origin="backward"
                )
            )
    engine, snapshots = replay(with_ticks(logged))
    points = engine.history.query("train_loss", "step")
    assert [(p.x, p.value) for p in points] == [(float(s), loss_curve(s)) for s in range(1, 98)]
    assert snapshots[-1].series["train_loss"].step == 97
