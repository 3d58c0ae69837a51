"""The straggler and the communication metrics, from synthetic per-rank records of 4 ranks in an all_reduce
(``collective_world``): the slow rank named with its cause (compute, data wait, its GPU), no straggler over 1,000
jittery clean steps, each rank's exposed wait and its bus bandwidth by the nccl-tests definition, counted by hand."""

from __future__ import annotations

import pytest
from blocks import blockify
from collective_world import ALL_REDUCE_S, GRAD_B, RANKS, World, feed_world

from trainmeter_core.model import records
from trainmeter_core.model.alerts.episodes import Alerter, rule_config
from trainmeter_core.model.alerts.training import Straggler
from trainmeter_core.model.engine import Engine, collectives
from trainmeter_sources.gpu import fake_pynvml, nvml
from trainmeter_sources.gpu.sampler import GpuSession


def named(snapshot: records.Snapshot) -> tuple[float | None, str | None, str | None]:
    """(the straggler's rank, its host, the cause) as the snapshot has them."""
    rank, wait = snapshot.metrics["straggler_rank"], snapshot.metrics["straggler_wait_s"]
    return rank.value, rank.label, wait.label


def first_named(snapshots: list[records.Snapshot]) -> int | None:
    """The index of the first snapshot that names a straggler, None if none does."""
    return next((i for i, s in enumerate(snapshots) if s.metrics["straggler_rank"].value is not None), None)


def test_a_rank_slowed_200_ms_in_its_forward_is_named_with_cause_compute_within_50_steps():
    engine, world = Engine(), World(seed=3)
    feed_world(engine, world, 100)
    assert first_named(feed_world(engine, world, 0)) is None
    world.slow_compute[2] = 0.2
    after = feed_world(engine, world, 50, every=1)  # a snapshot each step, to find the first that names it
    index = first_named(after)
    assert index is not None and index < 50
    assert all(named(s) == (2.0, "n1", "compute") for s in after[index:])
    final = after[-1]
    # The others wait about the 200 ms it is late (EMAs settle over ~20 steps: 1 − 0.9^50 of it by now)
    assert 0.18 < final.metrics["straggler_wait_s"].value < 0.22
    (slow,) = [r for r in final.ranks if r.rank == 2]
    assert slow.compute_s is not None and slow.compute_s > 0.25  # its 100 ms and the 200 ms it was slowed
    assert all(r.compute_s < 0.15 for r in final.ranks if r.rank != 2)


def test_a_rank_slowed_200_ms_in_its_dataloader_is_named_with_cause_data_wait():
    engine, world = Engine(), World(seed=4)
    feed_world(engine, world, 100)
    world.slow_data[1] = 0.2
    after = feed_world(engine, world, 50, every=1)
    index = first_named(after)
    assert index is not None and index < 50
    assert all(named(s) == (1.0, "n1", "data wait") for s in after[index:])
    ranks = {r.rank: r for r in after[-1].ranks}
    assert ranks[1].data_wait_s > 0.18 and all(ranks[r].data_wait_s < 0.02 for r in (0, 2, 3))
    # Its compute is as the others': the data wait is what made it late
    assert abs(ranks[1].compute_s - ranks[0].compute_s) < 0.03


@pytest.fixture
def four_gpus():
    fake_pynvml.install(None)
    nvml._opened.clear()
    machine = fake_pynvml.install(fake_pynvml.FakeMachine(f"{RANKS}xH100"))
    yield machine
    fake_pynvml.install(None)
    nvml._opened.clear()


def test_a_throttled_gpu_is_named_as_the_cause(four_gpus):
    """Rank 3 computes slower because its GPU (the fake NVML's GPU 3) is held by a thermal slowdown."""
    four_gpus.gpus[3].throttle("thermal")
    session = GpuSession.open({"TM_FAKE_GPUS": f"{RANKS}xH100"}, host="n1")
    engine, world = Engine(), World(seed=5)
    facts = [*session.facts()] + [
        records.Fact(name="device", value={"type": "cuda", "index": r, "uuid": four_gpus.gpus[r].uuid},
                     provenance="detected", origin="agent", host="n1", rank=r)
        for r in range(RANKS)
    ]  # fmt: skip
    for record in facts:
        record.host = "n1"
        engine.feed(record)
    world.slow_compute[3] = 0.2
    snapshots = []
    for _ in range(10):
        for sample in session.sample(world.now_s):
            sample.host = "n1"
            engine.feed(sample)
        snapshots += feed_world(engine, world, 5)
    rank, host, cause = named(snapshots[-1])
    assert (rank, host) == (3.0, "n1")
    assert cause == "its GPU: n1/gpu3 throttled (sw_thermal)"
    assert "n1/gpu3" in engine.snapshot().explain["straggler_rank"].inputs["gpu"].source


def test_a_gpu_clocked_below_the_others_of_its_host_is_named_as_the_cause(four_gpus):
    for gpu in four_gpus.gpus:
        gpu.set(sm_clock_mhz=1980)
    four_gpus.gpus[0].set(sm_clock_mhz=1200)  # 39% below the others: no reason given, and slow
    session = GpuSession.open({"TM_FAKE_GPUS": f"{RANKS}xH100"}, host="n1")
    engine, world = Engine(), World(seed=6)
    for record in [*session.facts()] + [
        records.Fact(name="device", value={"type": "cuda", "index": r, "uuid": four_gpus.gpus[r].uuid},
                     provenance="detected", origin="agent", host="n1", rank=r)
        for r in range(RANKS)
    ]:  # fmt: skip
        record.host = "n1"
        engine.feed(record)
    world.slow_compute[0] = 0.2
    for _ in range(10):
        for sample in session.sample(world.now_s):
            sample.host = "n1"
            engine.feed(sample)
        snapshots = feed_world(engine, world, 5)
    rank, _, cause = named(snapshots[-1])
    assert rank == 0.0
    assert cause == "its GPU: n1/gpu0 at 1200 MHz, the others of n1 at 1980 MHz"


def test_no_straggler_and_no_alert_over_1000_jittery_clean_steps():
    """Each rank computes 100 ms ± 10 ms (gaussian) and waits 5 ms for its data on average (exponential): which rank
    arrives last changes every step, so no rank is named and the rule never fires, over 1,000 steps and 5 seeds."""
    for seed in range(5):
        engine, world = Engine(), World(seed=seed, jitter_s=0.01)
        alerts = Alerter([Straggler()], {"straggler": rule_config(Straggler(), {})})
        fired = []
        for snapshot in feed_world(engine, world, 1000):
            fired += [a for a in alerts.observe(snapshot) if a.state == "fired"]
            assert snapshot.metrics["straggler_rank"].value is None, seed
        assert fired == [], seed
        last = engine.snapshot()
        assert last.metrics["straggler_rank"].absent.startswith("no straggler: the others wait")
        assert last.metrics["straggler_wait_s"].value < collectives.STRAGGLER_SHARE * 0.135


def test_the_straggler_alert_names_the_rank_its_host_and_the_cause():
    engine, world = Engine(), World(seed=7, hosts=("n1", "n2"))  # ranks 1 and 3 on n2, its clock 1000 s ahead
    alerts = Alerter([Straggler()], {"straggler": rule_config(Straggler(), {"collective_fire_after_s": 0.0})})
    feed_world(engine, world, 60)
    world.slow_data[3] = 0.25
    fired = []
    for snapshot in feed_world(engine, world, 50, every=1):
        fired += [a for a in alerts.observe(snapshot) if a.state == "fired"]
    (alert,) = fired
    assert alert.subject == "rank 3"
    assert alert.message.startswith("rank 3 on n2 makes the other ranks wait ")
    assert alert.message.endswith("; cause: data wait")
    numbers = alert.numbers
    assert numbers["rank"] == 3.0
    assert numbers["wait_caused_s"] > collectives.STRAGGLER_SHARE * numbers["step_time_median_s"]


def test_bus_bandwidth_of_an_all_reduce_on_4_ranks_by_hand():
    engine = Engine()
    for step in range(1, 4):
        for rank in range(RANKS):
            engine.feed(
                records.Metric(
                    values={
                        "collective_wait_s": 0.1,
                        "coll.all_reduce.4.bytes": 100e6,
                        "coll.all_reduce.4.time_s": 0.5,
                        "coll.all_reduce.4.count": 2.0,
                        "coll.all_gather.4.bytes": 10e6,
                        "coll.all_gather.4.time_s": 0.2,
                        "coll.all_gather.4.count": 1.0,
                        "coll.barrier.4.count": 1.0,
                        "coll.my_op.4.bytes": 1.0,
                        "coll.my_op.4.time_s": 1.0,
                    },
                    origin="collectives", step=step, host="n1", rank=rank, t=float(step),
                )
            )  # fmt: skip
    metrics = engine.snapshot().metrics
    # all_reduce: S = 100 MB, t = 0.5 s: algbw = 2e8 B/s; × 2(n−1)/n = 2 × 3 / 4 = 1.5: busbw = 3e8 B/s
    assert metrics["bus_bandwidth_bps.all_reduce.4.rank2"].value == pytest.approx(3e8)
    assert metrics["bus_bandwidth_bps.all_reduce.4.rank2"].unit == "B/s"
    # all_gather: S = n × the input = 40 MB, t = 0.2 s: algbw = 2e8 B/s; × (n−1)/n = 0.75: busbw = 1.5e8 B/s
    assert metrics["bus_bandwidth_bps.all_gather.4.rank0"].value == pytest.approx(1.5e8)
    assert metrics["bus_bandwidth_bps.barrier.4.rank0"].absent == "a barrier moves no data"
    assert (
        metrics["bus_bandwidth_bps.my_op.4.rank0"].absent
        == "nccl-tests gives no bus bandwidth factor for my_op"
    )
    assert metrics["collective_wait_s.rank3"].value == pytest.approx(0.1)
    assert metrics["collective_wait_s"].value == pytest.approx(0.1)


def test_collective_records_make_no_series_and_every_ranks_count():
    engine, world = Engine(), World(seed=8)
    feed_world(engine, world, 30)
    snapshot = engine.snapshot()
    assert snapshot.series == {}
    assert not any(key.startswith("tm:") and "coll" in key for key in engine.history.series_names())
    assert sorted(r.rank for r in snapshot.ranks if r.collective_steps == 30) == [0, 1, 2, 3]
    for rank in snapshot.ranks:
        # compute = step − exposed wait − data wait, each an EMA per step
        assert rank.compute_s == pytest.approx(rank.step_time_s - rank.collective_wait_s - rank.data_wait_s)
    # Every rank waits at least the all_reduce itself
    assert all(r.collective_wait_s >= ALL_REDUCE_S for r in snapshot.ranks)
    bandwidth = snapshot.metrics["bus_bandwidth_bps.all_reduce.4.rank0"]
    assert bandwidth.value == pytest.approx(
        GRAD_B / engine.state.ranks[0].collectives["all_reduce.4"].time_ema_s * 1.5
    )


def test_without_a_collective_probe_the_metrics_are_absent_with_the_reason():
    engine, world = Engine(), World(seed=9)
    for record in world.steps(30):
        if isinstance(record, records.Metric):
            continue
        engine.feed(record)
    metrics = engine.snapshot().metrics
    for key in ("collective_wait_s", "straggler_rank", "straggler_wait_s"):
        assert metrics[key].absent == collectives.NO_PROBE
    assert not any(key.startswith("bus_bandwidth_bps.") for key in metrics)
    assert all(r.collective_wait_s is None and r.compute_s is None for r in engine.snapshot().ranks)


def test_one_rank_with_collective_waits_names_no_straggler():
    engine, world = Engine(), World(seed=10)
    for record in world.steps(30):
        if isinstance(record, records.Metric) and record.rank != 0:
            continue
        engine.feed(record)
    metrics = engine.snapshot().metrics
    assert metrics["straggler_rank"].absent == collectives.FEW_RANKS
    assert metrics["straggler_rank"].value is None


def test_the_step_time_comparison_stays_for_ranks_that_step_on_their_own():
    stats = [
        records.RankStat(rank=r, host="n1", steps=30, step_time_s=0.1 if r else 0.3) for r in range(RANKS)
    ]
    snapshot = records.Snapshot(t=0.0, tick=1, metrics={}, ranks=stats)
    alerts = Alerter([Straggler()], {"straggler": rule_config(Straggler(), {"fire_after_s": 0.0})})
    (alert,) = alerts.observe(snapshot)
    assert alert.subject == "rank 0" and "steps in 0.3 s" in alert.message


def test_a_restored_engine_and_a_log_replay_give_the_live_snapshots():
    """Replay equals live: the records through their log lines, the engine checkpointed and restored half-way."""
    live, world = Engine(), World(seed=11)
    logged: list[records.Record] = []
    world.slow_compute[1] = 0.2
    for record in world.steps(60):
        logged.append(record)
    tick = records.Tick(t=world.now_s, n=1, interval_s=1.0)
    for record in [*logged, tick]:
        live.feed(record)
    lines = [records.to_log_line(records.to_builtins(r)) for r in logged]
    replayed = Engine()
    for line in lines[:120]:
        replayed.feed(records.from_log_line(line))
    replayed = Engine.from_state(replayed.state_bytes())
    for line in lines[120:]:
        replayed.feed(records.from_log_line(line))
    (again,) = replayed.feed(tick)
    (before,) = [live.snapshot()]
    assert again.metrics == before.metrics
    assert again.ranks == before.ranks
    assert named(again)[0] == 1.0


def test_collective_records_in_blocks_count_as_when_sent_alone():
    """The probe's records may travel as metric rows of the agent's blocks: the engine takes them the same."""
    world = World(seed=14)
    world.slow_compute[0] = 0.2
    logged = []
    for seq, record in enumerate(world.steps(40), 1):
        record.seq, record.wall = seq, 1.7e9 + record.t
        logged.append(record)
    by_rank = sorted(
        logged, key=lambda r: (r.rank, r.seq)
    )  # one producer's rows in a row: blocks can hold them
    for seq, record in enumerate(by_rank, 1):
        record.seq = seq
    blocked = blockify(by_rank)
    assert any(type(r) is records.Block and "collectives" in r.metric_origin for r in blocked)
    alone, in_blocks = Engine(), Engine()
    for record in by_rank:
        alone.feed(record)
    for record in blocked:
        in_blocks.feed(record)
    assert in_blocks.snapshot().ranks == alone.snapshot().ranks
    assert in_blocks.state.ranks[0].collectives == alone.state.ranks[0].collectives


def test_a_rank_keeps_at_most_kinds_max_operation_kinds():
    engine = Engine()
    values = {f"coll.op{i}.2.bytes": 1.0 for i in range(collectives.KINDS_MAX + 10)}
    engine.feed(records.Metric(values=values, origin="collectives", step=1, host="n1", rank=0, t=1.0))
    assert len(engine.state.ranks[0].collectives) == collectives.KINDS_MAX


def test_the_straggler_alert_clears_once_the_rank_keeps_up_again():
    engine, world = Engine(), World(seed=16)
    config = {"collective_fire_after_s": 0.0, "clear_after_s": 0.0}
    alerts = Alerter([Straggler()], {"straggler": rule_config(Straggler(), config)})
    feed_world(engine, world, 60)
    world.slow_compute[0] = 0.2
    states = [(a.state, a.subject) for s in feed_world(engine, world, 30, every=1) for a in alerts.observe(s)]
    del world.slow_compute[0]
    after = [a for s in feed_world(engine, world, 60, every=1) for a in alerts.observe(s)]
    assert states == [("fired", "rank 0")]
    (cleared,) = after
    assert (cleared.state, cleared.subject) == ("cleared", "rank 0")


def lagging_world(steps: dict[int, range], wait_s) -> Engine:
    """An engine fed clean ranks whose rows reached it over different steps (``steps``: rank → its steps), as the
    probe's reads deliver them seconds apart: at step s every rank waits ``wait_s(s)`` + 0.1 ms × its rank in a
    100 ms step."""
    engine = Engine()
    for rank, reported in steps.items():
        for step in reported:
            t = 100.0 + 0.1 * step
            values = {"collective_wait_s": wait_s(step) + 0.0001 * rank}
            engine.feed(
                records.Metric(values=values, origin="collectives", step=step, host="n1", rank=rank, t=t)
            )
            engine.feed(records.Step(step=step, host="n1", rank=rank, t=t))
    return engine


def test_ranks_whose_rows_arrived_up_to_different_steps_are_compared_over_the_same_steps():
    """Every rank waits 50 ms a step in the first 150 steps and 10 ms after; rank 3's rows arrived up to step 300, the
    others' up to step 140. Their EMAs differ by 40 ms, 40% of the step (the straggler named before this comparison);
    over the steps every rank reported they differ by the 0.1 ms a rank adds, and no rank is named."""
    early = range(1, 141)
    engine = lagging_world(
        {0: early, 1: early, 2: early, 3: range(1, 301)}, lambda s: 0.05 if s <= 150 else 0.01
    )
    snapshot = engine.snapshot()
    emas = {r.rank: r.collective_wait_s for r in snapshot.ranks}
    assert emas[0] - emas[3] > 0.035  # the EMAs alone would name rank 3
    assert snapshot.metrics["straggler_rank"].value is None
    assert snapshot.metrics["straggler_rank"].absent.startswith(
        "no straggler: the others wait 0.2 ms per step for rank 0"
    )
    inputs = snapshot.explain["straggler_wait_s"].inputs
    compared = collectives.STRETCHES_COMPARED * collectives.STRETCH_STEPS
    assert inputs["steps_compared"].value == compared
    assert inputs["steps_compared"].source == f"steps {136 - compared} to 135"  # the last stretch all ended
    assert inputs["rank 3 wait"].value == pytest.approx(0.0503)


def test_ranks_that_share_no_reported_steps_name_no_straggler_and_say_why():
    engine = lagging_world({0: range(1, 21), 1: range(2000, 2030)}, lambda step: 0.01)
    assert engine.state.ranks[1].wait_stretches == [250, 251, 252, 253]
    metrics = engine.snapshot().metrics
    why = f"the ranks' collective waits share no {collectives.STRETCH_STEPS} steps that every rank reported to their end"
    assert metrics["straggler_rank"].absent == why and metrics["straggler_wait_s"].absent == why


def test_a_resumed_attempts_earlier_steps_start_the_ranks_stretches_again():
    engine = lagging_world({0: range(1, 101)}, lambda step: 0.01)
    rank = engine.state.ranks[0]
    assert (
        rank.wait_stretches == list(range(13)) and sum(rank.wait_counts) == 100
    )  # steps 1-100, stretches 0-12
    for step in range(41, 41 + 8 * collectives.STRETCHES_KEPT + 1):  # the attempt resumed at step 41
        values = {"collective_wait_s": 0.5}
        engine.feed(
            records.Metric(values=values, origin="collectives", step=step, host="n1", rank=0, t=200.0)
        )
        if step == 41:
            assert (rank.wait_stretches, rank.wait_sums_s, rank.wait_counts) == ([5], [0.5], [1])
    assert len(rank.wait_stretches) == collectives.STRETCHES_KEPT
    assert rank.wait_stretches[-1] == (41 + 8 * collectives.STRETCHES_KEPT) // 8
