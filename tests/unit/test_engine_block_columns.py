"""A steady loop's runs taken column by column (``model/engine/block_columns.py``) leave the state, history included,
byte for byte as their rows fed one by one leave it: over random steady runs (data waits of zero length among them,
losses of 0.0, -0.0 and 1e300, every way of counting tokens, a data-parallel degree and the collective probe's row
after each step, a group's row now and then, runs long enough that the resume marks are cut inside one block, blocks
of every length), and over the same runs with one thing in them that the columns do not take (a NaN loss, a step
without its loss or its interval, an absurd token count, a data wait that ends before it starts or before the step
before it), which send that run back to the letter-by-letter pass. And it does take them: most steps of a clean run
go in by it."""

from __future__ import annotations

import random

import pytest
from blocks import WALL0, blockify

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine, block_columns
from trainmeter_core.model.history import History, NoHistory

AGENT = {"source": "agent", "host": "h", "pid": 7, "rank": 0}
NO_TOKENS = "no integer id tensor seen in the model's inputs: pass --tokens-per-step"
#: What one step of a run may carry that the columns do not take.
FLAWS = ("nan loss", "no loss", "no interval", "absurd tokens", "wait backwards", "wait before its step")


def steady_run(rng: random.Random, steps: int, flaw: str | None) -> list[records.Record]:
    """A rank-0 loop's records in hub order, numbered: its start, some facts, then per step its data wait, the loss
    read at backward() and the step; a tick every so often; ``flaw`` in a few steps."""
    out: list[records.Record] = [
        records.RunStart(t=0.5, run_id="r1", name="train", run_dir="/runs/r1", command=["python", "train.py"],
                         cwd="/w", tm_version="0.1.0", python="3.11", platform="linux", source="launcher", host="h",
                         pid=1)
    ]  # fmt: skip
    if rng.random() < 0.7:
        out.append(records.Fact(t=0.6, name="model.params", value=1_000_000, provenance="detected",
                                origin="agent:model", **AGENT))  # fmt: skip
    if rng.random() < 0.4:
        out.append(records.Fact(t=0.6, name="tokens_per_step", value=rng.choice([1000, 1024]),
                                provenance=rng.choice(["declared", "detected"]), origin="cli", **AGENT))  # fmt: skip
    tokenless = rng.random() < 0.3
    collectives = rng.random() < 0.4  # a data-parallel loop: the collective probe's row after each step
    dp = rng.choice([1, 1, 2])
    tick_every = rng.choice([25, 700])
    flawed = set(rng.sample(range(steps), 3)) if flaw else set()
    t = 1.0
    for step in range(1, steps + 1):
        i = step - 1
        length = rng.choice([0.0, 0.0003, 0.001])
        start = t
        if i in flawed and flaw == "wait backwards":
            length = -0.0002
        if i in flawed and flaw == "wait before its step":
            start = t - 0.02  # it began (and ended) before the step before it
        out.append(records.Phase(phase="data_wait", start_t=start, end_t=start + length, step=step - 1,
                                 probe="dataloader", t=max(start, start + length), **AGENT))  # fmt: skip
        t += 0.0005
        loss = rng.choices([5.0 / step, rng.random(), 0.0, -0.0, 1e300], weights=[25, 60, 5, 5, 5])[0]
        if i in flawed and flaw == "nan loss":
            loss = float("nan")
        if not (i in flawed and flaw == "no loss"):
            out.append(records.Metric(values={"train_loss": loss}, step=step, origin="backward", t=t + 0.006,
                                      **AGENT))  # fmt: skip
        interval = rng.choice([0.01, 0.012, 0.0099])
        if i in flawed and flaw == "no interval":
            interval = 0.0
        tokens = rng.choice([1000, 1024]) if not (i in flawed and flaw == "absurd tokens") else 10**15
        if tokenless:
            counts = {"absent": {"tokens": NO_TOKENS}}
        else:
            counts = {"tokens": tokens, "tokens_source": "input_ids", "tokens_global": tokens * dp}
        out.append(records.Step(step=step, step_time_s=interval, optimizers=1, micro_batches=1, dp=dp, t=t + 0.008,
                                agent_us=3.0 if step % 16 == 0 else None, **counts, **AGENT))  # fmt: skip
        if collectives:
            values = {
                "collective_wait_s": rng.choice([0.0, 0.001, 0.003]),
                "coll.all_reduce.2.bytes": 4096.0,
                "coll.all_reduce.2.time_s": rng.choice([0.0005, 0.0007]),
                "coll.all_reduce.2.count": 1.0,
            }
            out.append(records.Metric(values=values, origin="collectives", step=step, t=t + 0.0085, **AGENT))
            if step % 10 == 0:  # a group's own row, which stays in the log alone
                out.append(records.Metric(values={"seq_first": float(step), "arrival_s": 0.0002},
                                          origin="collectives:0", step=step, t=t + 0.0086, **AGENT))  # fmt: skip
        if step % tick_every == 0:
            out.append(records.Tick(n=step // tick_every, interval_s=1.0, t=t + 0.0095, source="hub", host="h",
                                    pid=1))  # fmt: skip
        t += 0.01
    out.append(records.RunEnd(t=t + 0.5, status=0, reason="exited", exit_code=0, elapsed_s=t, source="launcher",
                              host="h", pid=1))  # fmt: skip
    for seq, record in enumerate(out, start=1):
        record.seq = seq
        record.wall = WALL0 + record.t
    return out


def _state(engine: Engine) -> bytes:
    return records.encode(engine.state) if not engine.history.keeps else engine.state_bytes()


def _fed_side_by_side(rows: list, blocked: list, history) -> None:
    """Feed one engine the blocks and another the rows, and after each block (or record) compare the two: their
    states, history included, through the same sequence number, and the snapshots each made on the way."""
    by_block, by_row = Engine(history=history()), Engine(history=history())
    remaining = iter(rows)
    for item in blocked:
        made_by_block = [records.encode(snapshot) for snapshot in by_block.feed(item)]
        made_by_row = []
        while by_row.state.through_seq != item.seq:
            made_by_row.extend(records.encode(snapshot) for snapshot in by_row.feed(next(remaining)))
        assert by_block.state.through_seq == item.seq, records.kind_of(item)
        assert made_by_block == made_by_row, item.seq
        assert _state(by_block) == _state(by_row), item.seq


def small_history() -> History:
    """A history that spills its raw points to the next tier every 64, and its last tier too in a long run."""
    return History(capacity=64, merge=2, tiers=3)


@pytest.mark.parametrize("history", [History, NoHistory, small_history])
@pytest.mark.parametrize("flaw", [None, *FLAWS])
@pytest.mark.parametrize("seed", range(6))
def test_steady_runs_taken_by_columns_leave_the_state_their_rows_leave(seed, flaw, history, monkeypatch):
    rng = random.Random(f"{seed} {flaw}")
    rows = steady_run(rng, rng.choice([30, 400, 1300]), flaw)
    blocked = blockify(rows, at_most=rng.choice([3, 7, 64, 1000, 3000]))
    taken: list[int] = []
    take = block_columns.take_alternating

    def counting(state, derived, history, keeps, block, start, stop, s, p, m):
        done = take(state, derived, history, keeps, block, start, stop, s, p, m)
        if done:
            taken.append(block.order.count("s", start, stop))
        return done

    monkeypatch.setattr(block_columns, "take_alternating", counting)
    monkeypatch.setattr(block_columns, "MIN_STEPS", 2)  # small blocks' short runs by the columns too
    _fed_side_by_side(rows, blocked, history)
    # Blocks whose every step has its loss (an agent's; blockify may cut a loss from its step)
    whole = [item for item in blocked if type(item) is records.Block and None not in item.loss]
    steps_in_blocks = sum(item.order.count("s") for item in whole)
    if flaw is None and steps_in_blocks >= 300 and max(len(item.order) for item in whole) > 9:
        # A clean run's blocks of more than a few rows: their steps go in by the columns, but for the run's first
        # (by its handler).
        assert sum(taken) >= 0.9 * steps_in_blocks, (sum(taken), steps_in_blocks)


def test_a_long_block_cuts_the_resume_marks_inside_it(monkeypatch):
    # 1,300 steps, the first alone and the rest in blocks of 3,000 records (1,000 steps): the marks pass their bound of
    # 512 inside a block; the columns (at their own least run) build only the ones kept, and those are the rows' own
    rng = random.Random(5)
    rows = steady_run(rng, 1300, None)
    blocked = blockify(rows, at_most=3000)
    _fed_side_by_side(rows, blocked, History)
    taken: list[int] = []
    take = block_columns.take_alternating

    def counting(state, derived, history, keeps, block, start, stop, s, p, m):
        done = take(state, derived, history, keeps, block, start, stop, s, p, m)
        taken.extend([block.order.count("s", start, stop)] if done else [])
        return done

    monkeypatch.setattr(block_columns, "take_alternating", counting)
    engine = Engine()
    for item in blocked:
        engine.feed(item)
    assert sum(taken) >= 1200, taken
    marks = engine.state.resume.marks
    assert 256 <= len(marks) < 512 and marks[-1][0] == 1300
