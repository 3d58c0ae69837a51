"""The hub's typed intake of a GPU sample (``bus/sample_intake.py``, ``Recorder.put_record``): one typed decode, and
the log line made from the typed record is the line the general check's mapping makes, byte for byte, on every GPU
sample of the real H200 runs; a sample with a field this version does not know, or one that breaks the schema, is left
to the general check, which keeps the field or refuses the sample."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import msgspec.inspect
import pytest
from tm_runs import sent_gpu_samples

from trainmeter_core.bus.sample_intake import KnownSampleGpu, typed_sample
from trainmeter_core.model import records
from trainmeter_core.runlog.recorder import record_line

REAL = Path(__file__).parents[1] / "fixtures" / "real"


def real_samples() -> list[dict]:
    """Every GPU sample of the real runs, as the mapping a producer sent (no ``seq``: the hub numbers it)."""
    return [sample for run in sorted(REAL.iterdir()) if run.is_dir() for sample in sent_gpu_samples(run)]


def general_line(payload: bytes, seq: int) -> bytes:
    """The line the hub's general way writes: the checked mapping, numbered (``Hub._accept``, ``Recorder.put``)."""
    data = records.check(payload).data
    data["seq"] = seq
    return records.to_log_line(data)


def test_every_real_gpu_sample_takes_one_typed_decode_and_its_line_is_the_general_ways_byte_for_byte():
    samples = real_samples()
    assert len(samples) == 125  # both H200 runs: 98 and 27
    for seq, data in enumerate(samples, start=1000):
        payload = msgspec.msgpack.encode(data)  # the producer's bytes: its fields in the Struct's order
        sample = typed_sample(payload)
        assert sample is not None, data
        assert record_line(sample, seq) == general_line(payload, seq)
        assert records.from_log_line(record_line(sample, seq)) == records.from_log_line(
            general_line(payload, seq)
        )


def test_a_sample_a_producer_encodes_and_one_with_a_number_that_is_not_finite_read_the_same_both_ways():
    sample = records.SampleGpu(
        index=3,
        host="n1",
        source="gpu",
        pid=9,
        v=records.SCHEMA_VERSION,
        t=12.5,
        wall=1.8e9,
        power_w=math.nan,
    )
    sample.processes = [records.GpuProcess(pid=77, used_memory_b=10)]
    payload = records.encode(sample)
    typed = typed_sample(payload)
    assert typed is not None
    line = record_line(typed, 7)
    assert line == general_line(payload, 7)
    assert line.endswith(b',"seq":7}\n') and b'"power_w":null' in line


@pytest.mark.parametrize(
    ("change", "kept"),
    [
        (lambda d: d.update(newer_field=1.5), True),  # a newer writer's field: kept by the general check
        (lambda d: d["processes"][0].update(newer=2), True),  # ... inside a process of its list
        (lambda d: d.update(power_w="high"), False),  # the schema broken: refused by the general check
        (lambda d: d.update(index=None), False),
    ],
)
def test_a_sample_the_typed_decode_cannot_take_is_left_to_the_general_check(change, kept):
    data = next(sample for sample in real_samples() if sample.get("processes"))
    change(data)
    payload = msgspec.msgpack.encode(data)
    assert typed_sample(payload) is None
    if kept:
        # the general check's mapping keeps it in the line (which a typed record would have dropped)
        assert general_line(payload, 5).count(b"newer") == 1
    else:
        with pytest.raises(records.MalformedRecord):
            records.check(payload)


def test_anything_but_a_sample_is_not_taken():
    step = records.Step(step=1, host="n1", source="agent", pid=1, v=records.SCHEMA_VERSION)
    assert typed_sample(records.encode(step)) is None
    assert typed_sample(b"\x81\xa4kind\xaasample.gpu") is None  # its tag alone: no index
    assert typed_sample(b"not msgpack at all") is None


def test_every_struct_inside_a_sample_refuses_a_newer_writers_field_in_the_typed_way():
    # A field of a struct type that the typed way's copy left as it is would drop a newer writer's field in it, where
    # the general check's mapping keeps it: only the processes' list holds structs, and its entries refuse one.
    def structs_in(info) -> list:
        if isinstance(info, msgspec.inspect.StructType):
            return [info.cls]
        inner = [
            getattr(info, name) for name in ("item_type", "key_type", "value_type") if hasattr(info, name)
        ]
        inner += list(getattr(info, "types", ()))
        return [cls for part in inner for cls in structs_in(part)]

    sample = msgspec.inspect.type_info(records.SampleGpu)
    nested = {field.name: structs_in(field.type) for field in sample.fields}
    assert {name for name, found in nested.items() if found} == {"processes"}
    known = msgspec.inspect.type_info(KnownSampleGpu)
    (processes,) = [field for field in known.fields if field.name == "processes"]
    (entry,) = structs_in(processes.type)
    assert entry.__struct_config__.forbid_unknown_fields
    assert [f.name for f in known.fields] == [f.name for f in sample.fields]  # the same order: the same line
