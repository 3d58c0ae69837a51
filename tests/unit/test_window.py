"""The agent's window on the wire (trainmeter_core/model/agent_batch.py): the arrays the agent's hooks queue become, in the
hub, the records the agent would have built itself; anything else in a window is refused item by item."""

from __future__ import annotations

import msgspec
import pytest

from trainmeter_core.model import agent_batch, records

HEADER = {
    "v": records.SCHEMA_VERSION,
    "source": "agent",
    "host": "n1",
    "pid": 42,
    "now_t": 100.0,
    "now_wall": 5000.0,
}


def _records(items: list, **header) -> list:
    head, raws = agent_batch.split_window(agent_batch.encode_window({**HEADER, **header}, items))
    out = []
    for raw in raws:
        out.extend(
            [records.decode(bytes(raw))] if agent_batch.is_record(raw) else agent_batch.expand(raw, head)
        )
    return out


def test_a_steady_step_is_its_loss_then_its_step_each_dated_on_the_wall_clock_by_its_own_t():
    steady = (agent_batch.STEADY_STEP, 7, 99.5, 0.25, 1, 12.5, 2, 16, "input_ids", 4, 2.5, 99.25, "backward")
    loss, step = _records([steady])
    # wall = now_wall - (now_t - t): 5000 - (100 - 99.25) = 4999.25 and 5000 - (100 - 99.5) = 4999.5
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
    steady = (agent_batch.STEADY_STEP, 3, 99.0, 0.1, 1, 5.0, 1, 8, "input_ids", 1, None, None, "backward")
    phase = (agent_batch.BARE_PHASE, "data_wait", 98.9, 98.95, 2, "dataloader")
    metric = (agent_batch.BARE_METRIC, 98.0, {"lr": 0.001}, 2, "emit")
    built = _records([metric, phase, steady], rank=3, dropped=11)
    assert [records.kind_of(r) for r in built] == ["metric", "phase", "step"]
    assert all(r.rank == 3 and r.dropped == 11 for r in built)
    assert built[1].start_t == 98.9 and built[1].t == built[1].end_t == 98.95
    assert built[0].values == {"lr": 0.001} and built[0].origin == "emit" and built[0].step == 2


def test_a_whole_record_in_a_window_stays_as_the_agent_stamped_it():
    fact = records.Fact(
        name="dp", value=1, provenance="detected", origin="agent:model", source="agent", pid=42, t=1.0
    )
    (kept,) = _records([fact])
    assert kept == fact


@pytest.mark.parametrize(
    "item",
    [
        (9, 1, 2.0),  # no such item
        (
            agent_batch.STEADY_STEP,
            "seven",
            99.5,
            0.25,
            1,
            12.5,
            2,
            16,
            "input_ids",
            4,
            None,
            None,
            "backward",
        ),
        (agent_batch.STEADY_STEP, 7, 99.5),  # too short
        (agent_batch.BARE_PHASE, "nap", 1.0, 2.0, None, "x"),  # not a phase name
        (agent_batch.BARE_METRIC, 1.0, {"loss": "low"}, None, "emit"),
        (),
    ],
)
def test_an_array_that_is_not_one_of_the_three_items_is_malformed(item):
    head, (raw,) = agent_batch.split_window(agent_batch.encode_window(HEADER, [item]))
    assert not agent_batch.is_record(raw)
    with pytest.raises(records.MalformedRecord):
        agent_batch.expand(raw, head)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x01",
        msgspec.msgpack.encode([HEADER]),  # no items
        msgspec.msgpack.encode([{"v": 2}, []]),  # a header without its fields
        msgspec.msgpack.encode({"header": HEADER, "items": []}),
        agent_batch.encode_window(HEADER, [(1, 2)])[:-1],  # cut short
    ],
)
def test_a_window_that_cannot_be_read_is_malformed(payload):
    with pytest.raises(records.MalformedRecord):
        agent_batch.split_window(payload)
