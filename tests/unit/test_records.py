"""The record contract: every kind through the wire and the log, unknowns kept, malformed bytes refused.

Pure tests of trainmeter_core.model.records: no sockets, no files. What the hub does with these verdicts is in test_hub.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import pytest

from trainmeter_core.model import records as rec

HEADER = {"t": 12.5, "wall": 1_700_000_000.25, "source": "agent", "host": "node1", "pid": 4242, "rank": 0}


def _one_of_each_kind() -> list[rec.Record]:
    """One instance of every kind, every required field set, nested Structs included where a kind has them."""
    return [
        rec.RunStart(
            run_id="r1",
            name="gpt",
            run_dir="/runs/r1",
            command=["python", "train.py", "--lr", "3e-4"],
            cwd="/home/u",
            child_pid=4243,
            tm_version="0.1.0",
            python="3.11.9",
            platform="Linux-x86_64",
            env={"CUDA_VISIBLE_DEVICES": "0"},
            job=rec.JobPlace(id="j7", node_rank=0, nnodes=3, hub="10.0.0.1:29401", found_by="torchrun flags"),
            plugins=[rec.PluginInfo(name="p", group="trainmeter.sinks", provides=["sink"])],
        ),
        rec.RunEnd(status=130, reason="signaled", signal=2, signal_name="SIGINT", elapsed_s=61.5, steps=100),
        rec.Hello(
            protocol=1,
            agent_version="0.1.0",
            python="3.11.9",
            executable="/usr/bin/python3",
            argv=["train.py"],
            ppid=1,
        ),
        rec.Bye(sent=10, reason="exit"),
        rec.Fact(name="budget_tokens", value=1_000_000, provenance="declared", origin="--budget-tokens"),
        rec.Step(step=7, step_time_s=0.25, tokens=4096, tokens_source="input_ids", tokens_global=8192, dp=2),
        rec.Metric(values={"loss": 2.5, "lr": 0.0003}, step=7),
        rec.Phase(phase="checkpoint", start_t=10.0, end_t=12.0, paths=["/ckpt/7.pt"]),
        rec.Notice(topic="probe", message="the dataloader probe went quiet"),
        rec.Tick(n=3, interval_s=1.0),
        rec.NodeEvent(node_rank=2, node_host="node3", event="behind", through=120, behind=35, node_run="r3"),
        rec.ClockMap(
            node_rank=2,
            node_host="node3",
            offset_s=-2500.125,
            basis="round_trip",
            uncertainty_s=1e-4,
            samples=3,
        ),
        rec.SampleGpu(index=0, util_gpu=0.5, throttle=["sw_power_cap"], processes=[rec.GpuProcess(pid=4243)]),
        rec.SampleHost(root_pid=4243, procs=3, top=[rec.ProcessStat(pid=4243, name="python", cpu_cores=1.5)]),
        rec.SampleNode(
            cpu_count=2,
            disks=[rec.DiskStat(device="sda", busy=0.25)],
            net=[rec.NetStat(interface="eth0", rx_bps=1e6)],
            filesystems=[rec.FsStat(role="run", path="/runs", avail_b=10**9)],
        ),
        rec.Snapshot(
            tick=3,
            metrics={"mfu": rec.MetricValue(value=0.4, unit="fraction", label="datasheet")},
            explain={
                "mfu": rec.Explain(formula="a/b", inputs={"a": rec.ExplainInput(value=1.0, unit="flops")})
            },
            series={"loss": rec.SeriesPoint(canonical="loss", raw_key="train/loss", value=2.5)},
            ranks=[rec.RankStat(rank=0, host="node1", steps=7, node=0)],
            nodes=[rec.NodeStat(node_rank=1, host="node2", state="lost", ranks=[1], silent_s=12.5, gaps=1)],
            facts={"budget_tokens": rec.Fact(name="budget_tokens", provenance="declared", origin="tm.toml")},
        ),
        rec.HistoryDelta(
            incarnation="3f9a0c1d",
            n=4,
            through_seq=120,
            series=["train_loss"],
            points=[(0, 7.0, 7168.0, 4.3e10, 1.7e9, 2.5)],
        ),
        rec.HistoryRequest(reason="start"),
        rec.HistorySync(incarnation="3f9a0c1d", n=4, checkpoint="engine.ckpt", through_seq=120),
        rec.Alert(rule="stall", state="fired", message="no step for 60 s", numbers={"idle_s": 60.0}),
        rec.Component(name="engine", event="crashed", process="components", exit_code=1),
        rec.BusStats(received=10, published=9, malformed=1, unknown=0, dropped={"agent@node1:1": 2}),
        rec.ProfileImport(
            importer="torch",
            file="trace.json",
            profiler="torch.profiler",
            top_kernels=[rec.KernelStat(name="gemm", category="gemm", count=3, total_s=0.5)],
        ),
    ]


def _with_header(record: rec.Record) -> rec.Record:
    for name, value in HEADER.items():
        setattr(record, name, value)
    if not isinstance(record, rec.BusStats):  # bus.stats reuses the name for its per-producer map
        record.dropped = 3
    record.absent = {"host_id": "not reported by this sampler"}
    return record


ALL = [_with_header(r) for r in _one_of_each_kind()]
IDS = [rec.kind_of(r) for r in ALL]


def _wire(data: dict[str, Any]) -> bytes:
    """A hand-made wire payload (what a buggy or newer producer could send)."""
    return msgspec.msgpack.encode(data)


# --------------------------------------------------------------------------------------------------------------------
# The schema


def test_every_kind_is_built_by_this_test():
    assert sorted(IDS) == sorted(rec.KINDS)


def test_every_kind_defined_in_a_family_module_is_in_the_union_and_named_by_the_face():
    # A new kind goes into its family's module and into AnyRecord; forgetting the second would leave it undecodable.
    defined = {
        cls
        for module in (rec.header, rec.lifetime, rec.loop, rec.samples, rec.derived, rec.profiles, rec.bus)
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, rec.Record) and cls is not rec.Record
    }
    assert defined == set(rec.AnyRecord.__args__) == set(rec.KINDS.values())
    assert all(getattr(rec, cls.__name__) is cls for cls in defined)


def test_no_module_of_the_records_package_postpones_its_annotations():
    # The decoders built at import would evaluate every annotation from a string: 3-8 ms more for every tm process.
    package = Path(rec.__file__).parent
    for source in sorted(package.glob("*.py")):
        lines = source.read_text(encoding="utf-8").splitlines()
        assert "from __future__ import annotations" not in lines, source.name


def test_required_fields_of_every_kind_are_pinned():
    # Adding a required field breaks every older producer: this list changes only with SCHEMA_VERSION.
    expected = {
        "run.start": {"run_id", "name", "run_dir", "command", "cwd", "tm_version", "python", "platform"},
        "run.end": {"status", "reason", "elapsed_s"},
        "hello": {"protocol", "agent_version", "python", "executable", "argv", "ppid"},
        "bye": {"sent"},
        "fact": {"name", "provenance", "origin"},
        "step": {"step"},
        "metric": {"values"},
        "phase": {"phase", "start_t", "end_t"},
        "notice": {"topic", "message"},
        "tick": {"n", "interval_s"},
        # Kinds new with multi-node jobs, written by the job hub alone (so no older producer sends them).
        "node": {"node_rank", "node_host", "event"},
        "clock": {"node_rank", "node_host", "offset_s", "basis"},
        "sample.gpu": {"index"},
        "sample.host": {"root_pid", "procs"},
        "sample.node": set(),
        "snapshot": {"tick"},
        "history": {"incarnation", "n"},
        "history.request": set(),
        "history.sync": {"incarnation", "n", "checkpoint"},
        "alert": {"rule", "state", "message"},
        "component": {"name", "event", "process"},
        "bus.stats": {"received", "published", "malformed", "unknown"},
        "profile.import": {"importer", "file", "profiler"},
    }
    required = {
        kind: {f.name for f in msgspec.inspect.type_info(cls).fields if f.required}
        for kind, cls in rec.KINDS.items()
    }
    assert required == expected
    assert rec.SCHEMA_VERSION == 2


def test_a_record_without_v_was_written_under_schema_1():
    # Schema 1 left v out as its default; writers now stamp the current version, so every line says its schema.
    assert rec.from_log_line(b'{"kind":"tick","n":1,"interval_s":1.0}\n').v == 1
    assert rec.from_log_line(b'{"kind":"tick","v":2,"n":1,"interval_s":1.0}\n').v == rec.SCHEMA_VERSION


def test_every_kind_carries_the_common_header():
    header = {"v", "seq", "t", "wall", "source", "host", "pid", "rank", "dropped", "absent", "kind"}
    for kind, fields in rec.FIELDS.items():
        assert header <= fields, kind


def test_kinds_checked_for_loggability_are_those_with_any_typed_fields():
    # check() JSON-encodes only these kinds (and unknowns); a new Any field elsewhere must be added to the list.
    def has_any(t, seen) -> bool:
        if isinstance(t, msgspec.inspect.AnyType):
            return True
        if isinstance(t, msgspec.inspect.StructType):
            if t.cls in seen:
                return False
            seen.add(t.cls)
            return any(has_any(f.type, seen) for f in t.fields)
        if isinstance(t, msgspec.inspect.UnionType):
            return any(has_any(x, seen) for x in t.types)
        for attr in ("item_type", "key_type", "value_type"):
            if hasattr(t, attr) and has_any(getattr(t, attr), seen):
                return True
        return False

    with_any = {kind for kind, cls in rec.KINDS.items() if has_any(msgspec.inspect.type_info(cls), set())}
    assert with_any == rec.codec._ANY_VALUED_KINDS == {"fact", "snapshot"}


# --------------------------------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("record", ALL, ids=IDS)
def test_every_kind_survives_the_wire(record):
    payload = rec.encode(record)
    checked = rec.check(payload)
    assert checked.kind == rec.kind_of(record)
    assert checked.unknown is False
    assert rec.decode(payload) == record
    # What the hub published decodes to the same Struct by its one typed decode of the union.
    assert rec.decode_published(payload) == record


@pytest.mark.parametrize("record", ALL, ids=IDS)
def test_every_kind_survives_the_log(record):
    data = rec.check(rec.encode(record)).data
    data["seq"] = 41  # what the hub adds
    line = rec.to_log_line(data)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    back = rec.from_log_line(line)
    assert back.seq == 41
    back.seq = None
    assert back == record


def test_a_batch_splits_into_the_exact_bytes_of_each_record():
    raws = rec.split_batch(rec.encode_many(ALL))
    assert [bytes(raw) for raw in raws] == [rec.encode(r) for r in ALL]


def test_a_batch_checked_at_once_is_what_checking_each_of_its_records_gives():
    newer_field = {**rec.to_builtins(rec.Step(step=3)), "moe_aux_loss": 0.125}
    records = [*[rec.to_builtins(r) for r in ALL], newer_field]
    payload = msgspec.msgpack.encode(records)
    at_once = rec.check_batch(payload)
    assert at_once == [rec.check(bytes(raw)) for raw in rec.split_batch(payload)]
    assert [c.unknown for c in at_once] == [False] * len(ALL) + [True]
    # One record the one-by-one check refuses, or a kind this version does not know: the batch is left to it.
    for odd in ({"kind": "step", "step": "x"}, {"kind": "gpu.power_cap", "watts": 300.5}, 5):
        assert rec.check_batch(msgspec.msgpack.encode([records[0], odd, records[1]])) is None
    # A map naming two kinds (MessagePack allows a key twice): left to the one-by-one check, which takes the last.
    twice = b"\x92" + rec.encode(rec.Step(step=1)) + b"\x82\xa4kind\xa4step\xa4kind\xadgpu.power_cap"
    assert rec.check_batch(twice) is None
    assert rec.check(b"\x82\xa4kind\xa4step\xa4kind\xadgpu.power_cap").kind == "gpu.power_cap"
    assert rec.check_batch(b"\x80") is None


def test_absent_field_is_left_out_and_named_with_its_reason():
    gpu = rec.SampleGpu(index=1, absent={"power_w": "NVML: not supported on this board"})
    data = rec.check(rec.encode(gpu)).data
    line = rec.to_log_line(data)
    # Unknown is never a zero: the field is not in the line at all, its reason is.
    assert b'power_w":' not in line.replace(b'"power_w":"NVML', b"")
    assert msgspec.json.decode(line)["absent"] == {"power_w": "NVML: not supported on this board"}
    back = rec.from_log_line(line)
    assert back.power_w is None and back.absent == {"power_w": "NVML: not supported on this board"}


def test_nonfinite_metric_values_and_alert_numbers_survive_the_log():
    metric = rec.Metric(values={"loss": math.nan, "grad_norm": math.inf, "neg": -math.inf, "lr": 0.5})
    alert = rec.Alert(
        rule="loss", state="fired", message="loss is NaN", numbers={"loss": math.nan, "x": -math.inf}
    )
    m_line = rec.to_log_line(rec.check(rec.encode(metric)).data)
    a_line = rec.to_log_line(rec.check(rec.encode(alert)).data)
    assert msgspec.json.decode(m_line)["values"] == {
        "loss": "NaN",
        "grad_norm": "Infinity",
        "neg": "-Infinity",
        "lr": 0.5,
    }
    assert msgspec.json.decode(a_line)["numbers"] == {"loss": "NaN", "x": "-Infinity"}
    m_back, a_back = rec.from_log_line(m_line), rec.from_log_line(a_line)
    assert math.isnan(m_back.values["loss"])
    assert (
        m_back.values["grad_norm"] == math.inf
        and m_back.values["neg"] == -math.inf
        and m_back.values["lr"] == 0.5
    )
    assert math.isnan(a_back.numbers["loss"]) and a_back.numbers["x"] == -math.inf


FIRST_DECODES = {
    "check": lambda codec, r: codec.check(rec.encode(r)).kind,
    "check_batch": lambda codec, r: codec.check_batch(rec.encode_many([r]))[0].kind,
    "decode": lambda codec, r: codec.decode(rec.encode(r)),
    "decode_published": lambda codec, r: codec.decode_published(rec.encode(r)),
    "from_log_line": lambda codec, r: codec.from_log_line(rec.to_log_line(rec.to_builtins(r))),
}


@pytest.mark.parametrize("first", sorted(FIRST_DECODES))
def test_the_first_decode_of_any_sort_builds_every_decoder_and_later_ones_read_them_directly(first):
    # The agent only builds and sends records: importing them must not build the decoders (about 1.3 ms).
    codec = rec.UnionCodec(rec.AnyRecord)
    decoders = ("_json_typed", "_typed_msgpack", "_typed_union_list", "_typed_union_msgpack")
    assert not any(
        isinstance(getattr(codec, name), (msgspec.json.Decoder, msgspec.msgpack.Decoder, dict))
        for name in decoders
    )
    step = _with_header(rec.Step(step=3, tokens=8))
    assert FIRST_DECODES[first](codec, step) in ("step", step)
    assert isinstance(codec._json_typed, msgspec.json.Decoder)
    assert isinstance(codec._typed_union_list, msgspec.msgpack.Decoder)
    assert isinstance(codec._typed_union_msgpack, msgspec.msgpack.Decoder)
    assert set(codec._typed_msgpack) == set(rec.KINDS)
    for how in FIRST_DECODES.values():  # and every way decodes alike once they are built
        assert how(codec, step) in ("step", step)


# --------------------------------------------------------------------------------------------------------------------
# Forward compatibility


def test_unknown_kind_is_kept_verbatim_and_flagged_unknown():
    newer = {"kind": "gpu.power_cap", "v": 2, "watts": 300.5, "nested": {"a": [1, "b", None]}}
    checked = rec.check(_wire(newer))
    assert (checked.kind, checked.unknown) == ("gpu.power_cap", True)
    assert msgspec.json.decode(rec.to_log_line(dict(checked.data))) == newer
    decoded = rec.decode(_wire(newer))
    assert isinstance(decoded, rec.Unknown) and decoded.data == newer
    assert rec.decode_published(_wire(newer)) == decoded
    from_log = rec.from_log_line(rec.to_log_line({**newer, "seq": 9}))
    assert isinstance(from_log, rec.Unknown)
    assert (from_log.kind, from_log.seq, from_log.data["watts"]) == ("gpu.power_cap", 9, 300.5)
    assert rec.kind_of(from_log) == "gpu.power_cap"


def test_unknown_field_of_a_known_kind_is_kept_in_the_log_and_flagged_unknown():
    data = {**rec.to_builtins(rec.Step(step=3)), "moe_aux_loss": 0.125}
    checked = rec.check(_wire(data))
    assert (checked.kind, checked.unknown) == ("step", True)
    line = rec.to_log_line(checked.data)
    assert msgspec.json.decode(line)["moe_aux_loss"] == 0.125
    assert rec.from_log_line(line) == rec.Step(step=3)  # this version reads what it knows
    assert rec.decode_published(_wire(data)) == rec.Step(step=3)


# --------------------------------------------------------------------------------------------------------------------
# Malformed

WRONG_PAYLOADS = {
    "step is a string": _wire({"kind": "step", "step": "x"}),
    "metric value is a string": _wire({"kind": "metric", "values": {"loss": "low"}}),
    "alert state outside its literal": _wire(
        {"kind": "alert", "rule": "r", "state": "maybe", "message": "m"}
    ),
    "required field missing": _wire({"kind": "tick", "interval_s": 1.0}),
    "header of the wrong type": _wire({"kind": "step", "step": 1, "pid": "123"}),
    "kind is not a string": _wire({"kind": 5, "step": 1}),
    "no kind": _wire({"step": 1}),
    "an array": _wire([{"kind": "step", "step": 1}]),
    "a number": _wire(5),
    "not MessagePack": b"\xc1",
    "empty": b"",
    "truncated record": rec.encode(rec.Step(step=1, source="agent"))[:-3],
    "trailing bytes": rec.encode(rec.Step(step=1)) + b"\x00",
}


@pytest.mark.parametrize("payload", WRONG_PAYLOADS.values(), ids=WRONG_PAYLOADS.keys())
def test_wrong_payload_is_malformed(payload):
    with pytest.raises(rec.MalformedRecord):
        rec.check(payload)
    with pytest.raises(rec.MalformedRecord):
        rec.decode(payload)
    with pytest.raises(rec.MalformedRecord):
        rec.decode_published(payload)


FACT = {"kind": "fact", "name": "n", "provenance": "emitted", "origin": "o"}
UNLOGGABLE = {
    "extension type in an unknown field": _wire(
        {"kind": "step", "step": 1, "extra": msgspec.msgpack.Ext(1, b"0")}
    ),
    "extension type as a fact value": _wire({**FACT, "value": msgspec.msgpack.Ext(1, b"0")}),
    "nil map key in an unknown kind": _wire({"kind": "zz", "x": {None: 1}}),
    "array map key in a fact value": _wire({**FACT, "value": {(1,): 1}}),
    "nested 100,000 deep": b"\x82\xa4kind\xa2zz\xa1x" + b"\x91" * 100_000 + b"\x01",
}


@pytest.mark.parametrize("payload", UNLOGGABLE.values(), ids=UNLOGGABLE.keys())
def test_payload_the_log_cannot_hold_is_malformed_not_a_crash(payload):
    # Each of these once passed check() and then stopped the recorder (TypeError) or the hub (RecursionError).
    with pytest.raises(rec.MalformedRecord):
        rec.check(payload)


def test_loggable_values_in_untyped_fields_stay_valid():
    # The control for the cases above: numbers as map keys and nested data are what JSON can carry.
    assert rec.check(_wire({**FACT, "value": {"a": [1, 2.5, None]}})).unknown is False
    assert rec.check(_wire({"kind": "zz", "x": {1: "one"}})).unknown is True


BAD_LINES = {
    "step is a string": b'{"kind":"step","step":"x"}\n',
    "an array": b'[{"kind":"step","step":1}]\n',
    "not JSON": b'{"kind":"step",\n',
    "not UTF-8": b'{"kind":"step","step":1,"source":"\xff\xfe"}\n',
    "no kind": b'{"step":1}\n',
    "nested 100,000 deep": b'{"kind":"zz","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
}


@pytest.mark.parametrize("line", BAD_LINES.values(), ids=BAD_LINES.keys())
def test_wrong_log_line_is_malformed(line):
    with pytest.raises(rec.MalformedRecord):
        rec.from_log_line(line)


def test_producer_key_names_source_host_and_pid():
    assert rec.producer_key("agent", "node1", 42) == "agent@node1:42"
