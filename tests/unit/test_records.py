"""The record contract: every kind through the wire and the log, unknowns kept, malformed bytes refused.

Pure tests of trainmeter_core.model.records: no sockets, no files. What the hub does with these verdicts is in test_hub.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import pytest

from trainmeter_core.model import records

HEADER = {"t": 12.5, "wall": 1_700_000_000.25, "source": "agent", "host": "node1", "pid": 4242, "rank": 0}


def _one_of_each_kind() -> list[records.Record]:
    """One instance of every kind, every required field set, nested Structs included where a kind has them."""
    return [
        records.RunStart(
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
            job=records.JobPlace(
                id="j7", node_rank=0, nnodes=3, hub="10.0.0.1:29401", found_by="torchrun flags"
            ),
            plugins=[records.PluginInfo(name="p", group="trainmeter.sinks", provides=["sink"])],
        ),
        records.RunEnd(
            status=130, reason="signaled", signal=2, signal_name="SIGINT", elapsed_s=61.5, steps=100
        ),
        records.Hello(
            protocol=1,
            agent_version="0.1.0",
            python="3.11.9",
            executable="/usr/bin/python3",
            argv=["train.py"],
            ppid=1,
        ),
        records.Bye(sent=10, reason="exit"),
        records.Fact(name="budget_tokens", value=1_000_000, provenance="declared", origin="--budget-tokens"),
        records.Step(
            step=7, step_time_s=0.25, tokens=4096, tokens_source="input_ids", tokens_global=8192, dp=2
        ),
        records.Metric(values={"loss": 2.5, "lr": 0.0003}, step=7),
        records.Block(
            rows=3,
            order="sp",
            step=[8],
            step_t=[11.0],
            step_time_s=[0.25],
            optimizers=[1],
            agent_us=[None],
            micro_batches=[1],
            tokens=[4096],
            tokens_source="input_ids",
            dp=2,
            loss=[2.5],
            loss_t=[10.9],
            phase=["data_wait"],
            phase_start_t=[11.0],
            phase_end_t=[11.1],
            phase_step=[8],
            phase_probe=["dataloader"],
        ),
        records.Phase(phase="checkpoint", start_t=10.0, end_t=12.0, paths=["/ckpt/7.pt"]),
        records.Notice(topic="probe", message="the dataloader probe went quiet"),
        records.Tick(n=3, interval_s=1.0),
        records.NodeEvent(
            node_rank=2, node_host="node3", event="behind", through=120, behind=35, node_run="r3"
        ),
        records.ClockMap(
            node_rank=2,
            node_host="node3",
            offset_s=-2500.125,
            basis="round_trip",
            uncertainty_s=1e-4,
            samples=3,
        ),
        records.SampleGpu(
            index=0, util_gpu=0.5, throttle=["sw_power_cap"], processes=[records.GpuProcess(pid=4243)]
        ),
        records.SampleHost(
            root_pid=4243, procs=3, top=[records.ProcessStat(pid=4243, name="python", cpu_cores=1.5)]
        ),
        records.SampleNode(
            cpu_count=2,
            disks=[records.DiskStat(device="sda", busy=0.25)],
            net=[records.NetStat(interface="eth0", rx_bps=1e6)],
            filesystems=[records.FsStat(role="run", path="/runs", avail_b=10**9)],
        ),
        records.Snapshot(
            tick=3,
            metrics={"mfu": records.MetricValue(value=0.4, unit="fraction", label="datasheet")},
            explain={
                "mfu": records.Explain(
                    formula="a/b", inputs={"a": records.ExplainInput(value=1.0, unit="flops")}
                )
            },
            series={"loss": records.SeriesPoint(canonical="loss", raw_key="train/loss", value=2.5)},
            ranks=[records.RankStat(rank=0, host="node1", steps=7, node=0)],
            nodes=[
                records.NodeStat(node_rank=1, host="node2", state="lost", ranks=[1], silent_s=12.5, gaps=1)
            ],
            facts={
                "budget_tokens": records.Fact(name="budget_tokens", provenance="declared", origin="tm.toml")
            },
        ),
        records.HistoryDelta(
            incarnation="3f9a0c1d",
            n=4,
            through_seq=120,
            series=["train_loss"],
            points=[(0, 7.0, 7168.0, 4.3e10, 1.7e9, 2.5)],
        ),
        records.HistoryRequest(reason="start"),
        records.HistorySync(incarnation="3f9a0c1d", n=4, checkpoint="engine.ckpt", through_seq=120),
        records.Alert(rule="stall", state="fired", message="no step for 60 s", numbers={"idle_s": 60.0}),
        records.Component(name="engine", event="crashed", process="components", exit_code=1),
        records.BusStats(received=10, published=9, malformed=1, unknown=0, dropped={"agent@node1:1": 2}),
        records.ProfileImport(
            importer="torch",
            file="trace.json",
            profiler="torch.profiler",
            top_kernels=[records.KernelStat(name="gemm", category="gemm", count=3, total_s=0.5)],
        ),
    ]


def _with_header(record: records.Record) -> records.Record:
    for name, value in HEADER.items():
        setattr(record, name, value)
    if not isinstance(record, records.BusStats):  # bus.stats reuses the name for its per-producer map
        record.dropped = 3
    record.absent = {"host_id": "not reported by this sampler"}
    return record


ALL = [_with_header(r) for r in _one_of_each_kind()]
IDS = [records.kind_of(r) for r in ALL]


def _wire(data: dict[str, Any]) -> bytes:
    """A hand-made wire payload (what a buggy or newer producer could send)."""
    return msgspec.msgpack.encode(data)


# --------------------------------------------------------------------------------------------------------------------
# The schema


def test_every_kind_is_built_by_this_test():
    assert sorted(IDS) == sorted(records.KINDS)


def test_every_kind_defined_in_a_family_module_is_in_the_union_and_named_by_the_face():
    # A new kind goes into its family's module and into AnyRecord; forgetting the second would leave it undecodable.
    defined = {
        cls
        for module in (
            records.header,
            records.lifetime,
            records.loop,
            records.block,
            records.samples,
            records.derived,
            records.profiles,
            records.bus,
        )
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, records.Record) and cls is not records.Record
    }
    assert defined == set(records.AnyRecord.__args__) == set(records.KINDS.values())
    assert all(getattr(records, cls.__name__) is cls for cls in defined)


def test_no_module_of_the_records_package_postpones_its_annotations():
    # The decoders built at import would evaluate every annotation from a string: 3-8 ms more for every tm process.
    package = Path(records.__file__).parent
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
        # New with blocks (issue 42), sent only by an agent of the same tm as the hub.
        "block": {"rows", "order"},
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
        for kind, cls in records.KINDS.items()
    }
    assert required == expected
    assert records.SCHEMA_VERSION == 2


def test_a_record_without_v_was_written_under_schema_1():
    # Schema 1 left v out as its default; writers now stamp the current version, so every line says its schema.
    assert records.from_log_line(b'{"kind":"tick","n":1,"interval_s":1.0}\n').v == 1
    assert (
        records.from_log_line(b'{"kind":"tick","v":2,"n":1,"interval_s":1.0}\n').v == records.SCHEMA_VERSION
    )


def test_every_kind_carries_the_common_header():
    header = {"v", "seq", "t", "wall", "source", "host", "pid", "rank", "dropped", "absent", "kind"}
    for kind, fields in records.FIELDS.items():
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

    with_any = {kind for kind, cls in records.KINDS.items() if has_any(msgspec.inspect.type_info(cls), set())}
    assert with_any == records.codec._ANY_VALUED_KINDS == {"fact", "snapshot"}


# --------------------------------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("record", ALL, ids=IDS)
def test_every_kind_survives_the_wire(record):
    payload = records.encode(record)
    checked = records.check(payload)
    assert checked.kind == records.kind_of(record)
    assert checked.unknown is False
    assert records.decode(payload) == record
    # What the hub published decodes to the same Struct by its one typed decode of the union.
    assert records.decode_published(payload) == record


@pytest.mark.parametrize("record", ALL, ids=IDS)
def test_every_record_names_its_kind_and_says_it_as_the_wire_does(record):
    # A subscriber of every kind tells records apart by record.kind (docs/bus.md): the tag the wire and the log
    # carry, read from the record, not a field of its own.
    decoded = records.decode(records.encode(record))
    assert (
        decoded.kind
        == msgspec.msgpack.decode(records.encode(record))["kind"]
        == type(record).__struct_config__.tag
    )
    assert records.KINDS[decoded.kind] is type(record)
    assert "kind" not in type(record).__struct_fields__
    assert (
        records.from_log_line(records.to_log_line(records.check(records.encode(record)).data)).kind
        == decoded.kind
    )


def test_the_kind_is_written_once_as_the_tag_and_is_no_field():
    step = records.Step(step=7, step_time_s=0.25, t=1.5, wall=2.5, source="agent", host="n1", pid=9, v=2)
    assert step.kind == "step"
    assert msgspec.msgpack.decode(records.encode(step)) == {
        "kind": "step", "v": 2, "t": 1.5, "wall": 2.5, "source": "agent", "host": "n1", "pid": 9, "step": 7,
        "step_time_s": 0.25,
    }  # fmt: skip
    assert "kind" not in msgspec.structs.asdict(step)
    # A record of a kind newer than this tm answers alike.
    assert records.Unknown(kind="gpu.power_cap", data={}).kind == "gpu.power_cap"


@pytest.mark.parametrize("record", ALL, ids=IDS)
def test_every_kind_survives_the_log(record):
    data = records.check(records.encode(record)).data
    data["seq"] = 41  # what the hub adds
    line = records.to_log_line(data)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    back = records.from_log_line(line)
    assert back.seq == 41
    back.seq = None
    assert back == record


def test_a_batch_splits_into_the_exact_bytes_of_each_record():
    raws = records.split_batch(records.encode_many(ALL))
    assert [bytes(raw) for raw in raws] == [records.encode(r) for r in ALL]


def test_a_batch_checked_at_once_is_what_checking_each_of_its_records_gives():
    newer_field = {**records.to_builtins(records.Step(step=3)), "moe_aux_loss": 0.125}
    logged = [*[records.to_builtins(r) for r in ALL], newer_field]
    payload = msgspec.msgpack.encode(logged)
    at_once = records.check_batch(payload)
    assert at_once == [records.check(bytes(raw)) for raw in records.split_batch(payload)]
    assert [c.unknown for c in at_once] == [False] * len(ALL) + [True]
    # One record the one-by-one check refuses, or a kind this version does not know: the batch is left to it.
    for odd in ({"kind": "step", "step": "x"}, {"kind": "gpu.power_cap", "watts": 300.5}, 5):
        assert records.check_batch(msgspec.msgpack.encode([logged[0], odd, logged[1]])) is None
    # A map naming two kinds (MessagePack allows a key twice): left to the one-by-one check, which takes the last.
    twice = b"\x92" + records.encode(records.Step(step=1)) + b"\x82\xa4kind\xa4step\xa4kind\xadgpu.power_cap"
    assert records.check_batch(twice) is None
    assert records.check(b"\x82\xa4kind\xa4step\xa4kind\xadgpu.power_cap").kind == "gpu.power_cap"
    assert records.check_batch(b"\x80") is None


def test_absent_field_is_left_out_and_named_with_its_reason():
    gpu = records.SampleGpu(index=1, absent={"power_w": "NVML: not supported on this board"})
    data = records.check(records.encode(gpu)).data
    line = records.to_log_line(data)
    # Unknown is never a zero: the field is not in the line at all, its reason is.
    assert b'power_w":' not in line.replace(b'"power_w":"NVML', b"")
    assert msgspec.json.decode(line)["absent"] == {"power_w": "NVML: not supported on this board"}
    back = records.from_log_line(line)
    assert back.power_w is None and back.absent == {"power_w": "NVML: not supported on this board"}


def test_a_snapshot_always_says_its_state_in_json_the_running_one_too():
    # docs/api.md's example has a state: a live snapshot (state "running", the field's default) must carry it too.
    for state in ("starting", "running", "finished", "lost"):
        snapshot = records.Snapshot(tick=1, state=state)
        assert msgspec.json.decode(msgspec.json.encode(snapshot))["state"] == state
        assert records.to_builtins(snapshot)["state"] == state
    assert records.to_builtins(records.Snapshot(tick=1))["state"] == "running"


def test_nonfinite_metric_values_and_alert_numbers_survive_the_log():
    metric = records.Metric(values={"loss": math.nan, "grad_norm": math.inf, "neg": -math.inf, "lr": 0.5})
    alert = records.Alert(
        rule="loss", state="fired", message="loss is NaN", numbers={"loss": math.nan, "x": -math.inf}
    )
    m_line = records.to_log_line(records.check(records.encode(metric)).data)
    a_line = records.to_log_line(records.check(records.encode(alert)).data)
    assert msgspec.json.decode(m_line)["values"] == {
        "loss": "NaN",
        "grad_norm": "Infinity",
        "neg": "-Infinity",
        "lr": 0.5,
    }
    assert msgspec.json.decode(a_line)["numbers"] == {"loss": "NaN", "x": "-Infinity"}
    m_back, a_back = records.from_log_line(m_line), records.from_log_line(a_line)
    assert math.isnan(m_back.values["loss"])
    assert (
        m_back.values["grad_norm"] == math.inf
        and m_back.values["neg"] == -math.inf
        and m_back.values["lr"] == 0.5
    )
    assert math.isnan(a_back.numbers["loss"]) and a_back.numbers["x"] == -math.inf


FIRST_DECODES = {
    "check": lambda codec, r: codec.check(records.encode(r)).kind,
    "check_batch": lambda codec, r: codec.check_batch(records.encode_many([r]))[0].kind,
    "decode": lambda codec, r: codec.decode(records.encode(r)),
    "decode_published": lambda codec, r: codec.decode_published(records.encode(r)),
    "from_log_line": lambda codec, r: codec.from_log_line(records.to_log_line(records.to_builtins(r))),
}


@pytest.mark.parametrize("first", sorted(FIRST_DECODES))
def test_the_first_decode_of_any_sort_builds_every_decoder_and_later_ones_read_them_directly(first):
    # The agent only builds and sends records: importing them must not build the decoders (about 1.3 ms).
    codec = records.UnionCodec(records.AnyRecord)
    decoders = ("_json_typed", "_typed_msgpack", "_typed_union_list", "_typed_union_msgpack")
    assert not any(
        isinstance(getattr(codec, name), (msgspec.json.Decoder, msgspec.msgpack.Decoder, dict))
        for name in decoders
    )
    step = _with_header(records.Step(step=3, tokens=8))
    assert FIRST_DECODES[first](codec, step) in ("step", step)
    assert isinstance(codec._json_typed, msgspec.json.Decoder)
    assert isinstance(codec._typed_union_list, msgspec.msgpack.Decoder)
    assert isinstance(codec._typed_union_msgpack, msgspec.msgpack.Decoder)
    assert set(codec._typed_msgpack) == set(records.KINDS)
    for how in FIRST_DECODES.values():  # and every way decodes alike once they are built
        assert how(codec, step) in ("step", step)


# --------------------------------------------------------------------------------------------------------------------
# Forward compatibility


def test_unknown_kind_is_kept_verbatim_and_flagged_unknown():
    newer = {"kind": "gpu.power_cap", "v": 2, "watts": 300.5, "nested": {"a": [1, "b", None]}}
    checked = records.check(_wire(newer))
    assert (checked.kind, checked.unknown) == ("gpu.power_cap", True)
    assert msgspec.json.decode(records.to_log_line(dict(checked.data))) == newer
    decoded = records.decode(_wire(newer))
    assert isinstance(decoded, records.Unknown) and decoded.data == newer
    assert records.decode_published(_wire(newer)) == decoded
    from_log = records.from_log_line(records.to_log_line({**newer, "seq": 9}))
    assert isinstance(from_log, records.Unknown)
    assert (from_log.kind, from_log.seq, from_log.data["watts"]) == ("gpu.power_cap", 9, 300.5)
    assert records.kind_of(from_log) == "gpu.power_cap"


def test_unknown_field_of_a_known_kind_is_kept_in_the_log_and_flagged_unknown():
    data = {**records.to_builtins(records.Step(step=3)), "moe_aux_loss": 0.125}
    checked = records.check(_wire(data))
    assert (checked.kind, checked.unknown) == ("step", True)
    line = records.to_log_line(checked.data)
    assert msgspec.json.decode(line)["moe_aux_loss"] == 0.125
    assert records.from_log_line(line) == records.Step(step=3)  # this version reads what it knows
    assert records.decode_published(_wire(data)) == records.Step(step=3)


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
    "truncated record": records.encode(records.Step(step=1, source="agent"))[:-3],
    "trailing bytes": records.encode(records.Step(step=1)) + b"\x00",
}


@pytest.mark.parametrize("payload", WRONG_PAYLOADS.values(), ids=WRONG_PAYLOADS.keys())
def test_wrong_payload_is_malformed(payload):
    with pytest.raises(records.MalformedRecord):
        records.check(payload)
    with pytest.raises(records.MalformedRecord):
        records.decode(payload)
    with pytest.raises(records.MalformedRecord):
        records.decode_published(payload)


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
    with pytest.raises(records.MalformedRecord):
        records.check(payload)


def test_loggable_values_in_untyped_fields_stay_valid():
    # The control for the cases above: numbers as map keys and nested data are what JSON can carry.
    assert records.check(_wire({**FACT, "value": {"a": [1, 2.5, None]}})).unknown is False
    assert records.check(_wire({"kind": "zz", "x": {1: "one"}})).unknown is True


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
    with pytest.raises(records.MalformedRecord):
        records.from_log_line(line)


def test_producer_key_names_source_host_and_pid():
    assert records.producer_key("agent", "node1", 42) == "agent@node1:42"
