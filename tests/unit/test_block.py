"""A block (trainmeter_core/model/records/block.py) stands for the records its columns hold: expanded, they are the
records the agent would have built itself, each dated on the wall clock by its own ``t``; a block whose columns do not
agree with its ``order`` and ``rows`` is refused with one line. (What tests/unit/test_window.py asserted of the
agent's window, which the block replaced.)"""

from __future__ import annotations

import math
import random

import msgspec
import pytest
from steady_blocks import malformed_block, steady_block

from trainmeter_core.model import records

HEADER = {"v": records.SCHEMA_VERSION, "source": "agent", "host": "n1", "pid": 42, "t": 100.0, "wall": 5000.0}


def one_step(loss: float | None, **header) -> records.Block:
    return records.Block(
        rows=2 if loss is not None else 1,
        order="s",
        step=[7],
        step_t=[99.5],
        step_time_s=[0.25],
        optimizers=[1],
        agent_us=[12.5],
        micro_batches=[2],
        tokens=[16],
        tokens_source="input_ids",
        dp=4,
        loss=[loss],
        loss_t=[None if loss is None else 99.25],
        **{**HEADER, **header},
    )


def test_a_steady_step_is_its_loss_then_its_step_each_dated_on_the_wall_clock_by_its_own_t():
    loss, step = records.block.expand(one_step(2.5))
    # wall = t + (block wall - block t): 99.25 + (5000 - 100) = 4999.25, and 99.5 + 4900 = 4999.5
    assert loss == records.Metric(
        values={"train_loss": 2.5},
        step=7,
        origin="backward",
        t=99.25,
        wall=4999.25,
        v=records.SCHEMA_VERSION,
        source="agent",
        host="n1",
        pid=42,
    )
    assert step == records.Step(
        step=7,
        t=99.5,
        wall=4999.5,
        step_time_s=0.25,
        optimizers=1,
        agent_us=12.5,
        micro_batches=2,
        tokens=16,
        tokens_source="input_ids",
        dp=4,
        tokens_global=64,  # 16 tokens on each of 4 data-parallel ranks
        v=records.SCHEMA_VERSION,
        source="agent",
        host="n1",
        pid=42,
    )


def test_a_step_without_a_loss_is_one_record_and_the_rank_and_drop_count_ride_on_every_record():
    block = records.Block(
        rows=3,
        order="mps",
        step=[3],
        step_t=[99.0],
        step_time_s=[0.1],
        optimizers=[1],
        agent_us=[5.0],
        micro_batches=[1],
        tokens=[8],
        tokens_source="input_ids",
        dp=1,
        loss=[None],
        loss_t=[None],
        phase=["data_wait"],
        phase_start_t=[98.9],
        phase_end_t=[98.95],
        phase_step=[2],
        phase_probe=["dataloader"],
        metric_t=[98.0],
        metric_values=[{"lr": 0.001}],
        metric_step=[2],
        metric_origin=["emit"],
        rank=3,
        dropped=11,
        **HEADER,
    )
    records.block.validate(block)
    built = records.block.expand(block)
    assert [records.kind_of(r) for r in built] == ["metric", "phase", "step"]
    assert all(r.rank == 3 and r.dropped == 11 for r in built)
    assert built[1].start_t == 98.9 and built[1].t == built[1].end_t == 98.95
    assert built[0].values == {"lr": 0.001} and built[0].origin == "emit" and built[0].step == 2


def test_steps_without_tokens_have_no_column_and_each_record_says_why_in_its_own_absent():
    why = "no integer id tensor seen in the model's inputs: pass --tokens-per-step"
    block = msgspec.structs.replace(
        one_step(2.5), rows=3, order="ss", tokens=[], tokens_source=None, tokens_absent=why,
        step=[7, 8], step_t=[99.5, 99.75], step_time_s=[0.25, 0.25], optimizers=[1, 1], agent_us=[None, None],
        micro_batches=[2, 2], loss=[2.5, None], loss_t=[99.25, None],
    )  # fmt: skip
    records.block.validate(block)
    loss, step, after = records.block.expand(block)
    assert step == records.Step(
        step=7, t=99.5, wall=4999.5, step_time_s=0.25, optimizers=1, micro_batches=2, dp=4,
        absent={"tokens": why}, v=records.SCHEMA_VERSION, source="agent", host="n1", pid=42,
    )  # fmt: skip
    assert after.step == 8 and after.tokens is None and after.absent == {"tokens": why}
    assert after.absent is not step.absent  # each record's own: a reader that changes one changes no other
    assert loss.values == {"train_loss": 2.5} and loss.absent == {}
    # On the wire and in the log: the reason once, no tokens column
    line = records.to_log_line({**records.to_builtins(block), "seq": 3})
    assert line.count(b"no integer id") == 1 and b'"tokens":' not in line
    assert records.block.expand(records.from_log_line(line)) == records.block.expand(
        msgspec.structs.replace(block, seq=3)
    )


def test_a_numbered_blocks_rows_end_at_its_seq_and_its_counts_are_its_rows():
    block = steady_block(1, 4)  # 4 steps: a data wait, a loss, a step each
    block.seq = 112
    rows = records.block.expand(block)
    # seq 112 is the last of 12 rows: they are 101 .. 112
    assert [r.seq for r in rows] == list(range(101, 113))
    assert records.block.counts(block) == {"step": 4, "phase": 4, "metric": 4}
    assert [r.seq for r in records.block.expand(block, kinds={"step"}, after_seq=106)] == [109, 112]


@pytest.mark.parametrize("seed", range(60))
def test_a_malformed_block_is_refused_with_one_line(seed):
    why, payload = malformed_block(random.Random(seed))
    with pytest.raises(records.MalformedRecord) as refused:
        checked = records.check(payload)
        records.block.validate(checked.record)
        if checked.record.rows < 1:  # the hub refuses a block of no rows (it would take no number of its own)
            raise records.MalformedRecord("block: no rows")
    assert "\n" not in str(refused.value), why


def test_a_blocks_nonfinite_loss_is_written_as_text_and_read_back():
    data = records.check(records.encode(one_step(math.nan))).data  # as the hub writes it: seq appended last
    data["seq"] = 2
    line = records.to_log_line(data)
    assert b'"loss":["NaN"]' in line and line.endswith(b'"seq":2}\n')
    back = records.from_log_line(line)
    assert math.isnan(back.loss[0]) and back.step == [7]


@pytest.mark.parametrize(
    "column",
    ["step", "step_t", "step_time_s", "optimizers", "agent_us", "micro_batches", "tokens", "loss", "loss_t",
     "phase", "phase_start_t", "phase_end_t", "phase_step", "phase_probe",
     "metric_t", "metric_values", "metric_step", "metric_origin"],
)  # fmt: skip
def test_a_column_one_entry_short_is_named_in_the_refusal(column):
    # validate compares every length at once; the refusal still names the column that disagrees
    block = steady_block(1, 4)
    block.order += "m"
    block.rows += 1
    block.metric_t, block.metric_values = [block.t], [{"lr": 0.1}]
    block.metric_step, block.metric_origin = [4], ["emit"]
    records.block.validate(block)
    setattr(block, column, getattr(block, column)[:-1])
    with pytest.raises(records.MalformedRecord, match=rf"block: {column} has \d+ entries for \d+ rows"):
        records.block.validate(block)
