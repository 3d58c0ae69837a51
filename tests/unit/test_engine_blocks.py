"""The engine takes a block whole: its state ends exactly as if each row had been fed in order (the whole state as
bytes, history included, and every snapshot field by field), for one rank's run with its losses (one NaN) and tokens,
a resumed run on another clock, a job's records from two nodes, and a live engine whose checkpoint fell inside a
block."""

from __future__ import annotations

import math
import random

from blocks import WALL0, blockify, expanded, training_run

from trainmeter_core.components.engine import LiveEngine
from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.model.history_sync import JournaledHistory


def fed(log: list) -> tuple[Engine, list[bytes]]:
    """An engine fed ``log`` in order, and its snapshots as MessagePack (NaN compares equal as bytes)."""
    engine = Engine()
    made = [records.encode(snapshot) for record in log for snapshot in engine.feed(record)]
    return engine, made


def assert_same_engine(blocked: list, rows: list) -> Engine:
    by_block, snapshots_by_block = fed(blocked)
    by_row, snapshots_by_row = fed(rows)
    assert snapshots_by_block == snapshots_by_row
    assert by_block.state_bytes() == by_row.state_bytes()
    assert by_block.state.through_seq == by_row.state.through_seq == rows[-1].seq
    return by_block


def test_a_block_fed_whole_leaves_the_state_its_rows_fed_one_by_one_leave_losses_and_tokens_included():
    rows = training_run(200, nan_at=37)
    blocked = blockify(rows, at_most=64)
    assert sum(type(item) is records.Block for item in blocked) >= 8
    assert expanded(blocked) == rows
    engine = assert_same_engine(blocked, rows)
    # Every step's loss was kept: the NaN at step 37 counted, the last loss 5/200, 200 steps of 1024 tokens.
    assert engine.state.loss_nonfinite == 1
    assert engine.state.series["train_loss"].value == 5.0 / 200
    assert engine.state.tokens_seen == 200 * 1024
    assert engine.state.last_step == 200


def test_a_block_whose_last_row_is_a_loss_and_one_holding_phases_alone_feed_as_their_rows():
    rows = training_run(30)
    # Cut the runs so that blocks end on a loss metric (its step in the next block) and hold a lone phase.
    blocked = blockify(rows, at_most=2)
    kinds = {
        tuple(records.kind_of(row) for row in records.block.expand(b))
        for b in blocked
        if type(b) is records.Block
    }
    assert ("phase", "metric") in kinds and ("step", "phase") in kinds
    assert_same_engine(blocked, rows)


def resumed_run() -> list[records.Record]:
    """Attempt 1 steps 1..40 and is lost; attempt 2 starts on a clock that restarted (its monotonic times from 0
    again, 100 s later on the wall clock), resumes after step 30 and steps 31..60 (its first step the resumed one)."""
    first = [record for record in training_run(40) if type(record) is not records.RunEnd]
    second = training_run(30)
    for record in second:
        record.wall += 100.0 + first[-1].t
        if type(record) is records.RunStart:
            record.attempt, record.resume_reason = 2, "--resume"
        if type(record) in (records.Step, records.Metric, records.Phase) and record.step is not None:
            record.step += 30
        if type(record) is records.Step and record.step == 31:
            record.resumed_from = 30
        if type(record) is records.Tick:
            record.n += 40 // 25
    log = first + second
    for seq, record in enumerate(log, start=1):
        record.seq = seq
    return log


def test_a_resumed_runs_blocks_on_the_next_attempts_clock_feed_as_their_rows():
    rows = resumed_run()
    blocked = blockify(rows, at_most=50)
    assert sum(type(item) is records.Block for item in blocked) >= 4
    engine = assert_same_engine(blocked, rows)
    assert len(engine.state.attempts) == 2 and engine.state.resume.t_offset != 0


AHEAD_S = 1000.0  # node1's clock runs this far ahead of the hub's


def job_run() -> list[records.Record]:
    """A two-node job as the job hub (node0) logs it: node0's rank 0 and node1's rank 1 each send their steps in
    turns of ten, node1's on its own clock (the clock map says how far ahead)."""
    place = records.JobPlace(id="j", node_rank=0, nnodes=2, hub="10.0.0.1:29401", found_by="torchrun flags")
    log: list[records.Record] = [
        records.RunStart(
            t=0.5, host="node0", run_id="r0", name="job", run_dir="/r0", command=["torchrun"], cwd="/",
            tm_version="0", python="3.11", platform="linux", job=place,
        ),
        records.ClockMap(
            t=0.6, host="node0", node_rank=1, node_host="node1", offset_s=-AHEAD_S, basis="round_trip",
            uncertainty_s=1e-4,
        ),
        records.NodeEvent(t=0.6, host="node0", node_rank=1, node_host="node1", event="joined"),
    ]  # fmt: skip
    node0 = [
        r for r in training_run(60, host="node0", rank=0) if type(r) not in (records.RunStart, records.RunEnd)
    ]
    node1 = [
        r for r in training_run(60, host="node1", rank=1) if type(r) not in (records.RunStart, records.RunEnd)
    ]
    node1 = [r for r in node1 if type(r) is not records.Tick]
    for record in node1:
        record.t += AHEAD_S
        if type(record) is records.Phase:
            record.start_t += AHEAD_S
            record.end_t += AHEAD_S
    steps_seen = 0
    at0 = at1 = 0
    while at0 < len(node0) or at1 < len(node1):
        # Ten steps of node0 (with what comes between them), then ten of node1.
        for source, at in ((node0, at0), (node1, at1)):
            stop = at
            taken = 0
            while stop < len(source) and taken < 10:
                if type(source[stop]) is records.Step:
                    taken += 1
                stop += 1
            log.extend(source[at:stop])
            if source is node0:
                at0 = stop
            else:
                at1 = stop
            steps_seen += taken
    log.append(
        records.RunEnd(t=log[-1].t + 1, host="node0", status=0, reason="exited", exit_code=0, elapsed_s=1.0)
    )
    for seq, record in enumerate(log, start=1):
        record.seq = seq
        record.wall = record.wall or WALL0 + record.t
    return log


def test_a_jobs_blocks_from_two_nodes_feed_as_their_rows_on_the_hubs_clock():
    rows = job_run()
    blocked = blockify(rows)
    hosts = {item.host for item in blocked if type(item) is records.Block}
    assert hosts == {"node0", "node1"}
    engine = assert_same_engine(blocked, rows)
    assert engine.state.nodes and engine.state.last_step == 60


def test_a_live_engine_whose_checkpoint_fell_inside_a_block_feeds_only_the_rows_after_it():
    rows = training_run(50)
    blocked = blockify(rows, at_most=40)
    block = next(item for item in blocked if type(item) is records.Block and item.seq > 20)
    through = block.seq - block.rows // 2  # inside the block
    # The engine that wrote the checkpoint was fed every row up to ``through``.
    restored = LiveEngine(Engine(history=JournaledHistory()))
    for row in rows:
        if row.seq <= through:
            restored.catch_up(row)
    everything = LiveEngine(Engine(history=JournaledHistory()))
    for row in rows:
        everything.catch_up(row)
    for item in blocked:
        restored.catch_up(item)
    assert restored.through_seq == everything.through_seq == rows[-1].seq
    assert restored.engine.state_bytes() == everything.engine.state_bytes()


def test_a_live_block_after_the_checkpoint_makes_no_snapshot_and_the_tick_after_it_the_rows_snapshot():
    rows = training_run(25)  # one tick, after step 25
    blocked = blockify(rows)
    by_block, by_row = LiveEngine(), LiveEngine()
    out_block = [out for item in blocked for out in by_block.feed(item)]
    out_row = [out for row in rows for out in by_row.feed(row)]
    snapshots = [records.encode(o) for o in out_block if type(o) is records.Snapshot]
    assert snapshots == [records.encode(o) for o in out_row if type(o) is records.Snapshot]
    assert len(snapshots) == 2  # the tick's and the final one
    final = out_block[-2]
    assert final.final and not math.isnan(by_block.engine.state.series["train_loss"].value)


JOB_RANKS = (("node0", 0), ("node0", 1), ("node1", 2), ("node1", 3))
# node1's clock behind the hub's by a time that makes its moved times round (a data wait's end less its start, both
# moved, differs from the same unmoved in its last bits)
NODE1_BEHIND_S = AHEAD_S + 0.1234567


def ranks_job_run(layout: tuple[tuple[str, int], ...] = JOB_RANKS) -> list[records.Record]:
    """A job of two nodes with two ranks each (``layout``: each rank's host and number), as node0's job hub logs it:
    each rank (its own process) sends its steps in turns of ten, the ranks' turns one after another; node1's on its
    own clock (behind the hub's), its ranks slower by a few ms, so that every step's marks find both hosts and their lag moves. A layout
    on node0 alone is a single node's run of several ranks (no node, no clock map)."""
    place = records.JobPlace(id="j", node_rank=0, nnodes=2, hub="10.0.0.1:29401", found_by="torchrun flags")
    log: list[records.Record] = [
        records.RunStart(
            t=0.5, host="node0", run_id="r0", name="job", run_dir="/r0", command=["torchrun"], cwd="/",
            tm_version="0", python="3.11", platform="linux", job=place,
        ),
    ]  # fmt: skip
    if any(host == "node1" for host, _ in layout):
        log += [
            records.ClockMap(
                t=0.6, host="node0", node_rank=1, node_host="node1", offset_s=NODE1_BEHIND_S, basis="round_trip",
                uncertainty_s=1e-4,
            ),
            records.NodeEvent(t=0.6, host="node0", node_rank=1, node_host="node1", event="joined"),
        ]  # fmt: skip
    ranks = []
    for host, rank in layout:
        own = [
            r
            for r in training_run(40, host=host, rank=rank)
            if type(r) not in (records.RunStart, records.RunEnd)
        ]
        if rank:
            own = [r for r in own if type(r) is not records.Tick]
        late = (0.0 if host == "node1" else NODE1_BEHIND_S) + 0.002 * rank  # on its own host's clock
        for record in own:
            record.pid = 10 + rank  # each rank its own process, so its own blocks
            record.t += late
            if type(record) is records.Phase:
                record.start_t += late
                record.end_t += late
        ranks.append(own)
    at = [0] * len(ranks)
    while any(at[i] < len(own) for i, own in enumerate(ranks)):
        for i, own in enumerate(ranks):
            stop, taken = at[i], 0
            while stop < len(own) and taken < 10:
                taken += type(own[stop]) is records.Step
                stop += 1
            log.extend(own[at[i] : stop])
            at[i] = stop
    log.append(
        records.RunEnd(t=log[-1].t + 1, host="node0", status=0, reason="exited", exit_code=0, elapsed_s=1.0)
    )
    for seq, record in enumerate(log, start=1):
        record.seq = seq
        record.wall = WALL0 + record.t
    return log


def test_a_jobs_blocks_from_nodes_of_several_ranks_feed_as_their_rows_marks_and_lags_included():
    # A node's rows are moved onto the hub's clock in place and each step marked before its handler takes it
    # (nodes.arrive_rows): the state (every node's lag, each step's marks) ends as the rows fed one by one leave it.
    rows = ranks_job_run()
    blocked = blockify(rows)
    producers = {(item.host, item.rank) for item in blocked if type(item) is records.Block}
    assert producers == {("node0", 0), ("node0", 1), ("node1", 2), ("node1", 3)}
    engine = assert_same_engine(blocked, rows)
    state = engine.state
    assert sorted(state.ranks) == [0, 1, 2, 3] and state.last_step == 40
    assert state.nodes["node1"].lag_ema_s is not None and state.nodes["node1"].lag_ema_s > 0.001
    assert state.nodes["node1"].last_t == max(r.t for r in rows if r.host == "node1") + NODE1_BEHIND_S


def test_a_single_nodes_blocks_of_several_ranks_feed_as_their_rows():
    # Ranks 1 to 3 are not the step clock's: their rows go by Engine._on_other_rank (their losses and data waits
    # without a record built), and leave the state their rows fed one by one leave.
    rows = ranks_job_run((("node0", 0), ("node0", 1), ("node0", 2), ("node0", 3)))
    blocked = blockify(rows)
    assert {item.rank for item in blocked if type(item) is records.Block} == {0, 1, 2, 3}
    engine = assert_same_engine(blocked, rows)
    state = engine.state
    assert not state.nodes and sorted(state.ranks) == [0, 1, 2, 3]
    assert all(state.ranks[rank].data_wait_ema_s is not None for rank in (1, 2, 3))
    assert all(state.ranks[rank].steps == 40 for rank in (1, 2, 3))


def random_ranks_run(rng: random.Random) -> list[records.Record]:
    """A run of 1 to 3 nodes of 1 to 3 ranks whose rows vary where another rank's block may: a node's clock mapped
    (or not: a job whose map has not come), a rank heard from late (its first steps inside a block), data waits
    missing or out of order, losses missing, a metric emitted or a collectives row between steps, a step time that
    is zero, a tick now and then, and in some a resumed attempt (node0 starts again on the same clock after 5 s, every
    rank from step 11: its first step of the attempt and its host's window reopened)."""
    nodes_n = rng.randint(1, 3)
    layout = [(f"node{k}", k * 3 + r) for k in range(nodes_n) for r in range(rng.randint(1, 3))]
    if len(layout) == 1:
        layout.append(("node0", 1))  # a rank that is not the clock's
    place = records.JobPlace(
        id="j", node_rank=0, nnodes=nodes_n, hub="10.0.0.1:29401", found_by="torchrun flags"
    )
    log: list[records.Record] = [
        records.RunStart(t=0.5, host="node0", run_id="r0", name="job", run_dir="/r0", command=["torchrun"], cwd="/",
                         tm_version="0", python="3.11", platform="linux", job=place)
    ]  # fmt: skip
    behind = {"node0": 0.0}
    for k in range(1, nodes_n):
        behind[f"node{k}"] = rng.choice((0.0, 3.3, 1000.1234567))
        if rng.random() < 0.8:
            log.append(records.ClockMap(t=0.6, host="node0", node_rank=k, node_host=f"node{k}",
                                        offset_s=behind[f"node{k}"], basis="round_trip", uncertainty_s=1e-4))  # fmt: skip
        log.append(records.NodeEvent(t=0.6, host="node0", node_rank=k, node_host=f"node{k}", event="joined"))
    resume_at = rng.choice((None, None, 16))  # the step the first attempt ends before
    per_rank: list[list[records.Record]] = []
    second: list[list[records.Record]] = []
    for host, rank in layout:
        agent = {"source": "agent", "host": host, "pid": 10 + rank, "rank": rank}
        t = 1.0 + rng.random() * 0.01 - behind[host]
        own: list[records.Record] = []
        first = rng.choice((1, 1, 5))  # a rank heard from late
        steps = list(range(first, 31)) if not resume_at else [*range(first, resume_at), *range(11, 31)]
        for i, step in enumerate(steps):
            if i and step < steps[i - 1]:  # the next attempt goes on from its checkpoint
                per_rank.append(own)
                own = []
                t += 5.0
            if rng.random() < 0.9:
                wait = rng.choice((0.001, 0.0, -0.0005))  # a wait that ends before it starts holds no time
                own.append(records.Phase(phase="data_wait", start_t=t, end_t=t + wait, step=step - 1 or None,
                                         probe="dataloader", t=t + wait, **agent))  # fmt: skip
            if rng.random() < 0.9:
                own.append(records.Metric(values={"train_loss": 4.0 / step}, step=step, origin="backward",
                                          t=t + 0.004, **agent))  # fmt: skip
            interval = rng.choice((0.01, 0.01, 0.01, 0.0))
            own.append(records.Step(step=step, step_time_s=interval, optimizers=1, micro_batches=1, tokens=512,
                                    tokens_source="input_ids", dp=len(layout), tokens_global=512 * len(layout),
                                    t=t + 0.008, **agent))  # fmt: skip
            if rng.random() < 0.1:
                own.append(records.Metric(values={"lr": 1e-3 / step}, step=step, origin="emit", t=t + 0.009,
                                          **agent))  # fmt: skip
            if rng.random() < 0.1:
                own.append(records.Metric(values={"coll.wait_s": 0.002}, step=step, origin="collectives",
                                          t=t + 0.0095, **agent))  # fmt: skip
            if rank == 0 and step % 10 == 0:
                own.append(
                    records.Tick(n=step // 10, interval_s=1.0, t=t + 0.0097, source="hub", host=host, pid=1)
                )
            t += 0.01 + rng.random() * 0.002
        (second if resume_at else per_rank).append(own)

    def interleaved(lists: list[list[records.Record]]) -> None:
        at = [0] * len(lists)
        while any(at[i] < len(own) for i, own in enumerate(lists)):
            for i, own in enumerate(lists):
                take = rng.randint(1, 12)
                log.extend(own[at[i] : at[i] + take])
                at[i] += take

    interleaved(per_rank)
    if resume_at:
        resumed = max(record.t + behind.get(record.host, 0.0) for record in log) + 4.0
        log.append(records.RunStart(t=resumed, host="node0", run_id="r0", name="job", run_dir="/r0",
                                    command=["torchrun"], cwd="/", tm_version="0", python="3.11", platform="linux",
                                    job=place))  # fmt: skip
        interleaved(second)
    log.append(
        records.RunEnd(t=log[-1].t + 1, host="node0", status=0, reason="exited", exit_code=0, elapsed_s=1.0)
    )
    for seq, record in enumerate(log, start=1):
        record.seq = seq
        record.wall = WALL0 + record.t + behind.get(record.host, 0.0)
    return log


def test_another_ranks_blocks_of_random_runs_feed_as_their_rows():
    # other_rank.take (and the rows it builds for the rest) against the rows fed one by one, over runs of every shape
    for seed in range(60):
        rng = random.Random(seed)
        rows = random_ranks_run(rng)
        blocked = blockify(rows, at_most=rng.choice((3, 10, 40, 1000)))
        assert any(type(item) is records.Block and item.rank for item in blocked), seed
        assert_same_engine(blocked, rows)
