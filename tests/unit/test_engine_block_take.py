"""The engine's one-pass take of a block's steady rows (``model/engine/block_take.py``) leaves the state, history
included, byte for byte as its rows fed one by one leave it, over random runs of every shape it meets: steps without
a loss, non-finite losses, losses of another step, data waits that end before they start, checkpoints and evals
between steps, metrics emitted (the loss among them, from then on the loop's own), declared and absurd token counts,
steps without any (a model fed no token ids), clocks that go backwards, a hang the alert opened, a resumed attempt on
the same clock, the collective probe's row after each step, a second rank's blocks between rank 0's, blocks of every
length. And it does take the steady rows: most of rank 0's steps in blocks go in by it."""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec
import pytest
from blocks import WALL0, blockify, training_run

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine, block_take
from trainmeter_core.model.history import History, NoHistory

AGENT = {"source": "agent", "host": "h", "pid": 7, "rank": 0}
NO_TOKENS = "no integer id tensor seen in the model's inputs: pass --tokens-per-step"


def _start(t: float, attempt: int = 1) -> records.RunStart:
    return records.RunStart(
        t=t, run_id="r1", name="train", run_dir="/runs/r1", command=["python", "train.py"], cwd="/w",
        tm_version="0.1.0", python="3.11", platform="linux", source="launcher", host="h", pid=1, attempt=attempt,
        resume_reason="--resume" if attempt > 1 else None,
    )  # fmt: skip


def random_run(rng: random.Random, steps: int) -> list[records.Record]:
    """One rank-0 loop's records in hub order, numbered, with a random mix of what a run can send between steps; in
    some runs the collective probe's row after each step, and in some a second rank's steps, ten at a time."""
    out: list[records.Record] = [_start(0.5)]
    collectives = rng.random() < 0.3
    # The share of steps whose model saw no token ids (a float-input loop's: all; a loop that changes inputs: some)
    tokenless = rng.choice([0.0, 0.0, 0.0, 1.0, 0.2])
    second_rank = rng.random() < 0.3
    rank1: list[records.Record] = []  # rank 1's records since it last joined the log
    if rng.random() < 0.7:
        out.append(records.Fact(t=0.6, name="model.params", value=1_000_000, provenance="detected",
                                origin="agent:model", **AGENT))  # fmt: skip
    if rng.random() < 0.3:
        provenance = rng.choice(["declared", "detected"])
        out.append(records.Fact(t=0.6, name="tokens_per_step", value=rng.choice([1000, 1024]),
                                provenance=provenance, origin="cli", **AGENT))  # fmt: skip
    emits_loss_at = rng.randrange(steps) if rng.random() < 0.2 else None
    resume_at = rng.randrange(steps // 2, steps) if rng.random() < 0.2 else None
    hang_at = rng.randrange(steps) if rng.random() < 0.3 else None
    tick_every = rng.choice([5, 25, 60])
    t = 1.0
    step = 0
    for i in range(steps):
        step += 1
        if i == resume_at:
            # The loop dies and is restarted on the same host and clock, resuming a few steps back.
            out.append(_start(t + 2.0, attempt=2))
            t += 3.0
            step = max(1, step - rng.randrange(1, 6))
        for _ in range(rng.choice([0, 1, 1, 1, 1, 2])):
            length = rng.choice([0.001, 0.0, 0.0004, -0.0002])
            out.append(records.Phase(phase="data_wait", start_t=t, end_t=t + length, step=step - 1,
                                     probe="dataloader", t=max(t, t + length), **AGENT))  # fmt: skip
            t += 0.0005
        roll = rng.random()
        if roll < 0.05:
            out.append(records.Phase(phase=rng.choice(["checkpoint", "eval"]), start_t=t, end_t=t + 0.002,
                                     step=step - 1, probe="torch.save", t=t + 0.002, **AGENT))  # fmt: skip
            t += 0.002
        if rng.random() < 0.85:
            loss = rng.choice(
                [5.0 / step, 5.0 / step, 5.0 / step, float("nan"), float("inf"), 0.0, -0.0, 1e300]
            )
            loss_step = step if rng.random() < 0.95 else step - 1
            out.append(records.Metric(values={"train_loss": loss}, step=loss_step, origin="backward",
                                      t=t + 0.006, **AGENT))  # fmt: skip
        step_time = rng.choice([0.01, 0.01, 0.012, 0.0, -0.01])
        tokens = rng.choice([1024, 1024, 1024, 0, 10**15])
        if rng.random() < tokenless:
            counts = {"absent": {"tokens": NO_TOKENS}}
        else:
            counts = {"tokens": tokens, "tokens_source": "input_ids", "tokens_global": tokens}
        out.append(records.Step(step=step, step_time_s=step_time, optimizers=1,
                                agent_us=3.0 if step % 16 == 0 else None, micro_batches=1, dp=1, t=t + 0.008,
                                **counts, **AGENT))  # fmt: skip
        if collectives:
            values = {
                "collective_wait_s": rng.choice([0.0, 0.001, 0.003]),
                "coll.all_reduce.2.bytes": 4096.0,
                "coll.all_reduce.2.time_s": 0.0005,
                "coll.all_reduce.2.count": 1.0,
            }
            out.append(records.Metric(values=values, origin="collectives", step=step, t=t + 0.0085, **AGENT))
            if rng.random() < 0.3:
                # A group's own row (its sequence numbers and arrival), which stays in the log alone
                group = {"seq_first": float(step), "arrival_s": 0.0002}
                out.append(
                    records.Metric(values=group, origin="collectives:0", step=step, t=t + 0.0086, **AGENT)
                )
        if second_rank:
            other = {**AGENT, "rank": 1, "pid": 8}
            rank1.append(
                records.Phase(
                    phase="data_wait",
                    start_t=t,
                    end_t=t + 0.0007,
                    step=step - 1,
                    probe="dataloader",
                    t=t + 0.0007,
                    **other,
                )
            )
            rank1.append(
                records.Metric(
                    values={"train_loss": 4.0 / step}, step=step, origin="backward", t=t + 0.0061, **other
                )
            )
            rank1.append(
                records.Step(
                    step=step,
                    step_time_s=0.0101,
                    optimizers=1,
                    micro_batches=1,
                    tokens=1024,
                    tokens_source="input_ids",
                    dp=2,
                    tokens_global=2048,
                    t=t + 0.0081,
                    **other,
                )
            )
            if step % 10 == 0:
                out.extend(rank1)
                rank1.clear()
        if step % 10 == 0 or (emits_loss_at is not None and i >= emits_loss_at and rng.random() < 0.5):
            values = {"lr": 1e-3 / step}
            if emits_loss_at is not None and i >= emits_loss_at:
                values["train_loss"] = 4.0 / step
            out.append(records.Metric(values=values, step=step, origin="emit", t=t + 0.009, **AGENT))
        if i == hang_at:
            out.append(records.Alert(rule="hung", state="fired", severity="critical", message="stalled",
                                     t=t + 0.0091, source="engine", host="h", pid=1))  # fmt: skip
            t += 5.0
        if (i + 1) % tick_every == 0:
            out.append(records.Tick(n=(i + 1) // tick_every, interval_s=1.0, t=t + 0.0095, source="hub",
                                    host="h", pid=1))  # fmt: skip
        t += rng.choice([0.01, 0.01, 0.011, -0.003])
    out.append(records.RunEnd(t=t + 0.5, status=0, reason="exited", exit_code=0, elapsed_s=t, source="launcher",
                              host="h", pid=1))  # fmt: skip
    for seq, record in enumerate(out, start=1):
        record.seq = seq
        record.wall = WALL0 + record.t
    return out


def _fed(log: list, history: Callable[[], History]) -> tuple[Engine, list[bytes]]:
    """The engine fed ``log``, and the snapshots it made; after each record (a block: its last row) the state is
    through that record's sequence number."""
    engine = Engine(history=history())
    made = []
    for record in log:
        made.extend(records.encode(snapshot) for snapshot in engine.feed(record))
        assert engine.state.through_seq == record.seq, records.kind_of(record)
    return engine, made


def counted_take_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``block_take.take_run`` counted: the steps of each run of letters it takes, in a list that grows as it does."""
    taken: list[int] = []
    take_run = block_take.take_run

    def counting(state, derived, history, keeps, block, start, stop, s, p, m):
        taken.append(block.order.count("s", start, stop))
        take_run(state, derived, history, keeps, block, start, stop, s, p, m)

    monkeypatch.setattr(block_take, "take_run", counting)
    return taken


def small_history() -> History:
    """A history that spills 32 points to its next tier once it holds 64, and so its last tier too in a run of a few
    hundred steps."""
    return History(capacity=64, merge=2, tiers=3)


@pytest.mark.parametrize("history", [History, NoHistory, small_history])
@pytest.mark.parametrize("seed", range(40))
def test_random_runs_blocks_leave_the_state_their_rows_leave(seed, history, monkeypatch):
    rng = random.Random(seed)
    rows = random_run(rng, rng.choice([30, 120, 400]))
    blocked = blockify(rows, at_most=rng.choice([2, 3, 7, 64, 1000]))
    taken = counted_take_runs(monkeypatch)
    by_block, snapshots_by_block = _fed(blocked, history)
    by_row, snapshots_by_row = _fed(rows, history)  # rows alone: block_take never sees one
    assert snapshots_by_block == snapshots_by_row
    assert by_block.state.through_seq == by_row.state.through_seq == rows[-1].seq
    if history is NoHistory:
        assert records.encode(by_block.state) == records.encode(by_row.state)
    else:
        assert by_block.state_bytes() == by_row.state_bytes()
    steps_in_blocks = sum(
        item.order.count("s") for item in blocked if type(item) is records.Block and not item.rank
    )  # rank 0's: another rank's go to the handlers
    if steps_in_blocks >= 100 and "train_loss" not in by_row.state.emit_series:
        # The steady steps went in by block_take (a block of 2 rows holds at most one step, with its loss).
        assert sum(taken) >= 0.5 * steps_in_blocks, (sum(taken), steps_in_blocks)


def test_a_steady_runs_steps_go_in_by_block_take_from_its_second_step_on(monkeypatch):
    rows = training_run(300)  # ticks every 25 steps, a learning rate emitted every 10
    blocked = blockify(rows)
    taken = counted_take_runs(monkeypatch)
    engine, _ = _fed(blocked, History)
    # The first step (the clock's first of its attempt) by its handler, every other by block_take.
    assert sum(taken) == 299
    # Every step counted, every loss kept: the last one committed by the run's end.
    assert engine.state.steps == 300 and engine.state.tokens_seen == 300 * 1024
    assert engine.state.series["train_loss"].value == 5.0 / 300 and not engine.state.pending_backward


def test_the_collective_probes_row_after_each_step_stays_inside_the_run(monkeypatch):
    # A data-parallel loop's rank 0: the collective probe's row follows each step (and a group's row each tenth). They
    # go in with the steps; before, each ended the run, and every step was a run of its own, set up and stored alone.
    rows = []
    for record in training_run(300):
        rows.append(msgspec.structs.replace(record))
        if type(record) is records.Step:
            values = {
                "collective_wait_s": 0.001,
                "coll.all_reduce.2.bytes": 4096.0,
                "coll.all_reduce.2.count": 1.0,
            }
            rows.append(records.Metric(values=values, origin="collectives", step=record.step, t=record.t + 1e-4,
                                       **AGENT))  # fmt: skip
            if record.step % 10 == 0:
                rows.append(records.Metric(values={"arrival_s": 2e-4}, origin="collectives:0", step=record.step,
                                           t=record.t + 2e-4, **AGENT))  # fmt: skip
    for seq, record in enumerate(rows, start=1):
        record.seq, record.wall = seq, WALL0 + record.t
    blocked = blockify(rows)
    taken = counted_take_runs(monkeypatch)
    by_block, snapshots_by_block = _fed(blocked, History)
    monkeypatch.undo()
    by_row, snapshots_by_row = _fed(rows, History)
    assert snapshots_by_block == snapshots_by_row and by_block.state_bytes() == by_row.state_bytes()
    assert sum(taken) == 299
    # Runs end only at the learning rate the loop emits every 10 steps (and at a block's end): 30 or so, not 299
    assert len(taken) <= 40, len(taken)
    rank = by_block.state.ranks[0]
    assert rank.collective_steps == 300 and rank.collectives["all_reduce.2"].steps == 300
