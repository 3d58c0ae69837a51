"""Where a profiled step's GPU time went: tm's classes and split, HTA's breakdown checked against HTA's own numbers on
real traces, and the streaming reader that gets there in bounded memory."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest
from tm_runs import REPO

from trainmeter_core.importers.jsonstream import TraceError, TraceReader
from trainmeter_core.importers.kineto import KinetoImporter, worker_identity
from trainmeter_core.model.profiles.builder import ProfileBuilder
from trainmeter_core.model.profiles.kernels import (
    ATTENTION,
    COMMUNICATION,
    GEMM,
    HTA_COMMUNICATION,
    HTA_COMPUTATION,
    HTA_MEMORY,
    HTA_OTHER,
    MEMORY,
    OTHER_COMPUTE,
    classify,
    hta_type,
)
from trainmeter_core.model.profiles.kineto import Event

TRACES = REPO / "tests" / "fixtures" / "traces"
REFERENCE = json.loads((TRACES / "hta-reference.json").read_text())


def read(path: Path, run=None) -> list:
    return list(KinetoImporter().read(path, run or {}))


# --------------------------------------------------------------------------------------------------------------------
# HTA's numbers on the real traces (acceptance: idle, compute, non-compute within 0.5 points; kernel time by type
# within 1 % or 5 µs, whichever is larger)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_the_hta_breakdown_of_a_real_trace_is_htas_own_within_the_tolerances(name):
    expected = REFERENCE[name]
    trace = read(TRACES / name)[-1]
    hta = trace.hta
    assert trace.rank == expected["rank"]
    for part in ("idle", "compute", "non_compute"):
        assert abs(getattr(hta, f"{part}_pct") - expected[f"{part}_pct"]) <= 0.5, part
    assert set(expected["kernel_time_us_by_type"]) <= {k for k, v in hta.kernel_type_s.items() if v > 0}
    for kind, us in expected["kernel_time_us_by_type"].items():
        assert abs(hta.kernel_type_s[kind] * 1e6 - us) <= max(0.01 * us, 5.0), kind


def test_htas_rules_drop_the_last_profiler_step_where_a_plain_union_would_not():
    # a100-nccl-rank0 holds ProfilerStep#4, #5 and #6: HTA keeps the GPU work launched before #6 started, and
    # measures its percentages over the span of that work, so the plain union over the whole trace reads otherwise.
    trace = read(TRACES / "a100-nccl-rank0.pt.trace.json.gz")[-1]
    assert trace.hta.last_step_dropped and trace.profiler_steps == [4, 5, 6]
    plain_idle = trace.split_s["idle"] / trace.window_s
    assert abs(plain_idle * 100 - REFERENCE["a100-nccl-rank0.pt.trace.json.gz"]["idle_pct"]) > 1.0
    # tm's own split adds up to its window, part for part.
    assert abs(sum(trace.split_s.values()) - trace.window_s) < 1e-9


def test_two_ranks_of_one_job_give_one_breakdown_each_with_their_rank():
    ranks = [read(TRACES / f"sampled-rank{r}.pt.trace.json.gz")[-1] for r in (0, 1)]
    assert [t.rank for t in ranks] == [0, 1] and [t.world_size for t in ranks] == [128, 128]
    assert ranks[0].trace_id != ranks[1].trace_id


# --------------------------------------------------------------------------------------------------------------------
# Classes


@pytest.mark.parametrize(
    ("name", "category", "expected"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "kernel", GEMM),
        ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(Params)", "kernel", GEMM),
        ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_TNT", "kernel", GEMM),
        (
            "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>(Flash_fwd_params)",
            "kernel",
            ATTENTION,
        ),
        ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "kernel", ATTENTION),
        (
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "kernel",
            COMMUNICATION,
        ),
        ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", MEMORY),
        ("Memset (Device)", "gpu_memset", MEMORY),
        ("void at::native::vectorized_elementwise_kernel<4, GeluFunctor>(int)", "kernel", OTHER_COMPUTE),
    ],
)
def test_a_kernel_is_filed_under_its_class_by_name_and_category(name, category, expected):
    assert classify(name, category) == expected


def test_htas_types_come_from_the_name_alone_as_hta_050_writes_them():
    assert hta_type("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)") == HTA_COMMUNICATION
    assert hta_type("ncclDevFunc_without_the_word") == HTA_COMPUTATION  # ^nccl.*Kernel needs "Kernel"
    assert hta_type("Memcpy HtoD (Pageable -> Device)") == HTA_MEMORY
    assert hta_type("dma_copy") == HTA_MEMORY
    assert hta_type("cudaStreamSync helper") == HTA_OTHER  # .*Sync
    assert hta_type("void foo_Memcpy_like_kernel()") == HTA_OTHER  # .*Memcpy, not at the start


# --------------------------------------------------------------------------------------------------------------------
# Windows, the split, launch waits and FLOPs, on a hand-made trace


def small_trace() -> ProfileBuilder:
    """Two profiler steps on the CPU, 0-10 µs and 10-20 µs; the kernels each launched (correlation ids 1-4):

    step 1: GEMM 2-6 (launched at 1), NCCL 5-9 on another stream (launched at 3)
    step 2: memcpy 12-13 (launched at 11), other compute 15-24 (launched at 14), past the CPU's end of the step
    The CPU sits in the runtime 9-12 (a launch of its own), while the GPU idles 9-12.
    """
    b = ProfileBuilder(time_unit_s=1e-6)
    b.add_step(1, 0.0, 10.0)
    b.add_step(2, 10.0, 20.0)
    for corr, start in ((1, 1.0), (2, 3.0), (3, 11.0), (4, 14.0)):
        b.add_runtime(start, start + 0.5, corr)
    b.add_runtime(9.0, 12.0, None)
    b.add_kernel(2.0, 6.0, "sm80_xmma_gemm_f16f16", stream=7, correlation=1)
    b.add_kernel(5.0, 9.0, "ncclKernel_AllReduce_RING", stream=20, correlation=2)
    b.add_kernel(12.0, 13.0, "Memcpy DtoD", category="gpu_memcpy", stream=7, correlation=3, moved_b=4096)
    b.add_kernel(15.0, 24.0, "elementwise_kernel", stream=7, correlation=4)
    b.add_flop(1.5, 8e6)
    b.add_flop(14.5, 2e6)
    return b


def test_a_steps_window_ends_when_the_cpu_left_it_and_its_gpu_work_finished():
    step1, step2, trace = small_trace().records(
        importer="t", file="t.json", profiler="t", trace_id="t", wall_offset_s=1000.0
    )
    # Step 1's kernels end at 9 µs, before the CPU leaves the step at 10: its window is 0-10. Step 2's last kernel
    # (launched at 14) ends at 24, after the CPU's 20: its window is 10-24. The windows tile 0-24.
    assert (step1.window_s, step2.window_s) == pytest.approx((10e-6, 14e-6))
    assert (step1.window_start_wall, step2.window_end_wall) == pytest.approx((1000.0, 1000.0 + 24e-6))
    assert (step1.profiler_step, step2.profiler_step) == (1, 2)
    assert trace.window_s == pytest.approx(24e-6) and trace.profiler_steps == [1, 2]


def test_the_split_gives_compute_first_then_exposed_communication_then_memory_then_idle():
    step1, step2, trace = small_trace().records(
        importer="t", file="t.json", profiler="t", trace_id="t", wall_offset_s=0.0
    )
    us = 1e-6
    # Step 1, 0-10: GEMM 2-6 (4), NCCL 5-9 of which 6-9 is exposed (3), idle 0-2 and 9-10 (3); overlap 5-6 (1).
    assert step1.split_s == pytest.approx(
        {
            "gemm": 4 * us,
            "attention": 0.0,
            "other_compute": 0.0,
            "communication": 3 * us,
            "memory": 0.0,
            "idle": 3 * us,
        }
    )
    assert step1.kernel_s["communication"] == pytest.approx(4 * us)
    assert step1.overlap_s["communication_compute"] == pytest.approx(1 * us)
    # Step 2, 10-24: memcpy 12-13 (1), other compute 15-24 (9), idle 10-12 and 13-15 (4).
    assert step2.split_s["memory"] == pytest.approx(1 * us) and step2.split_s[
        "other_compute"
    ] == pytest.approx(9 * us)
    assert step2.split_s["idle"] == pytest.approx(4 * us) and step2.busy_s == pytest.approx(10 * us)
    # Launch waits: the GPU idles 9-12 while the CPU is in the runtime 9-12, of which 9-10 lies in step 1 and
    # 10-12 in step 2 (the other runtime calls fall while a kernel runs, or in idle time: 0.5 µs at 1-1.5 and at
    # 11-11.5, 14-14.5 are inside 9-12 or idle 13-15: 14-14.5 counts too). Step 2: 10-12 and 14-14.5 = 2.5 µs.
    assert step1.launch_wait_s == pytest.approx(1.5 * us)  # 1-1.5 (before the GEMM) and 9-10
    assert step2.launch_wait_s == pytest.approx(2.5 * us)
    # FLOPs by the op's CPU start: 8e6 in step 1, 2e6 in step 2, 1e7 in all.
    assert (step1.flop, step2.flop, trace.flop) == (8e6, 2e6, 1e7)
    assert sum(trace.split_s.values()) == pytest.approx(trace.window_s)


def test_a_trace_without_flops_or_gpu_work_says_so_instead_of_a_zero():
    b = ProfileBuilder()
    b.add_step(7, 0.0, 5.0)
    step, trace = b.records(
        importer="t", file="t", profiler="t", trace_id="t", wall_offset_s=None, wall_absent="no base"
    )
    assert step.split_s == {} and "no GPU activity" in step.absent["split_s"]
    assert trace.flop is None and "with_flops=True" in trace.absent["flop"]
    assert step.window_start_wall is None and step.absent["step"] == "no base"


def test_a_window_mostly_waiting_on_kernel_launches_carries_a_launch_bound_hint():
    b = ProfileBuilder()
    b.add_step(1, 0.0, 100.0)
    for i in range(
        10
    ):  # ten 2 µs kernels, each after an 8 µs launch call: 80 % of the window is a launch wait
        b.add_runtime(i * 10.0, i * 10.0 + 8.0, i)
        b.add_kernel(i * 10.0 + 8.0, i * 10.0 + 10.0, "elementwise_kernel", stream=7, correlation=i)
    (_, trace) = b.records(importer="t", file="t", profiler="t", trace_id="t", wall_offset_s=0.0)
    assert trace.launch_wait_s == pytest.approx(80e-6)
    assert trace.hints and trace.hints[0].startswith("launch-bound: the GPU waited 0.08 ms of 0.1 ms (80%)")


def test_top_kernels_are_ranked_by_total_time_with_their_count():
    (_, _, trace) = small_trace().records(
        importer="t", file="t", profiler="t", trace_id="t", wall_offset_s=0.0
    )
    top = [(k.name, k.category, k.count, round(k.total_s * 1e6, 6)) for k in trace.top_kernels]
    assert top[0] == ("elementwise_kernel", "other_compute", 1, 9.0)
    assert ("Memcpy DtoD", "memory", 1, 1.0) in top
    assert next(k for k in trace.top_kernels if k.name == "Memcpy DtoD").moved_b == 4096


# --------------------------------------------------------------------------------------------------------------------
# The reader


def events_json(n: int) -> bytes:
    # A kernel name with "}, " inside it, as C++ lambdas in real kernel names have.
    name = "void k<{lambda()#1}, at::detail::Array<char*, 2> >(int)"
    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": name,
            "pid": 0,
            "ts": 10.0 * i,
            "dur": 5.0,
            "args": {"stream": 7},
        }
        for i in range(n)
    ]
    return json.dumps(
        {"schemaVersion": 1, "traceEvents": events, "baseTimeNanoseconds": 10**18}, indent=1
    ).encode()


def read_all(data: bytes, chunk_b: int) -> tuple[dict, list]:
    meta, events = {}, []
    for item in TraceReader(io.BytesIO(data), Event, chunk_b=chunk_b):
        if item[0] == "key":
            meta[item[1]] = item[2]
        else:
            events.extend(item[1])
    return meta, events


@pytest.mark.parametrize("chunk_b", [7, 64, 1000, 1 << 22])
def test_the_reader_gives_the_same_events_whatever_its_chunk_size(chunk_b):
    data = events_json(50)
    meta, events = read_all(data, chunk_b)
    assert meta == {"schemaVersion": 1, "baseTimeNanoseconds": 10**18}
    assert [e.ts for e in events] == [10.0 * i for i in range(50)]
    assert all(e.name.startswith("void k<{lambda()#1}, at::") for e in events)


def test_an_event_with_a_field_of_the_wrong_type_is_skipped_and_counted_not_fatal():
    data = events_json(5).replace(b'"ts": 20.0', b'"ts": "twenty"')
    reader = TraceReader(io.BytesIO(data), Event, chunk_b=64)
    events = [e for item in reader if item[0] == "events" for e in item[1]]
    assert [e.ts for e in events] == [0.0, 10.0, 30.0, 40.0] and reader.skipped == 1


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda d: d[: len(d) // 2], "cut short"),
        (lambda d: d.replace(b'"ph"', b'"ph', 1), "invalid JSON"),
        (lambda d: b"", "empty"),
        (lambda d: b"<html>", "not a Chrome trace"),
        (lambda d: d + b"{}", "more after the end"),
    ],
)
def test_a_damaged_trace_is_refused_with_one_line(damage, says):
    with pytest.raises(TraceError) as refused:
        read_all(damage(events_json(20)), 64)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def damaged_events(n: int, at_ts: float) -> tuple[bytes, str]:
    """``events_json(n)`` with a byte no JSON holds in the event of time ``at_ts``, and the line refusing it names."""
    data = events_json(n)
    damaged = data.find(b'"ts": %.1f' % at_ts)
    start = data.rfind(b"\n  {", 0, damaged) + 3  # the event's own brace (its name holds one too)
    said = f"invalid JSON in traceEvents at byte {start:,}: the event that starts there breaks at byte {damaged:,}"
    return data[:damaged] + b"\xa0" + data[damaged + 1 :], said


def test_damage_deep_in_a_chunk_is_found_in_a_few_decodes_and_named_at_its_events_start():
    # A byte no JSON holds inside event 1,500 of 2,000, all in one chunk. Stepping back one event a try, the reader
    # decoded the 1,500 events before it again for each of them (5 decodes an event: 7,500 here, 22 s for a real
    # 10 MB trace damaged at its 868th KB); each try now ends before the byte the last one failed at.
    data, said = damaged_events(2000, 15000.0)
    reader = TraceReader(io.BytesIO(data), Event, chunk_b=1 << 22)
    with pytest.raises(TraceError) as refused:
        for _ in reader:
            pass
    assert str(refused.value) == said
    assert reader.decodes <= 20, reader.decodes


def test_damage_in_a_trace_larger_than_the_largest_value_is_named_where_it_is_without_reading_on():
    # Past the damage no more of the file can mend it: the refusal names it at once, whatever the file's size, where
    # the reader read on to its largest value (here 4 KiB) and then said no event ends within it ("not a trace").
    data, said = damaged_events(2000, 9000.0)
    reader = TraceReader(io.BytesIO(data), Event, chunk_b=1024, max_value_b=4096)
    events = []
    with pytest.raises(TraceError) as refused:
        for item in reader:
            if item[0] == "events":
                events.extend(item[1])
    assert str(refused.value) == said
    assert [e.ts for e in events] == [10.0 * i for i in range(900)]  # every event before the damaged one
    damaged = data.find(b"\xa0")
    assert reader.bytes_read < damaged + 3 * 1024, (reader.bytes_read, damaged)


@pytest.mark.parametrize("chunk_b", [64, 1 << 22])
def test_a_key_after_the_events_holding_objects_in_a_list_is_read_whole_with_every_event(chunk_b):
    # The buffer's last "}, {" then lies in that list, after the events end: the try cut there fails with trailing
    # characters at the byte after the events' "]", and the next try ends before that byte, at the last event.
    trace = json.loads(events_json(40))
    trace["deviceProperties"] = [{"id": i, "name": "A100"} for i in range(3)]
    meta, events = read_all(json.dumps(trace, indent=1).encode(), chunk_b)
    assert [e.ts for e in events] == [10.0 * i for i in range(40)]
    assert meta["deviceProperties"][2] == {"id": 2, "name": "A100"}


def test_a_gzip_cut_short_is_refused_and_a_whole_one_read(tmp_path):
    whole = tmp_path / "a.pt.trace.json.gz"
    whole.write_bytes(gzip.compress(events_json(30)))
    assert len(read(whole)[-1].top_kernels) == 1
    cut = tmp_path / "b.pt.trace.json.gz"
    cut.write_bytes(whole.read_bytes()[:-40])
    with pytest.raises(ValueError, match="cut short"):
        read(cut)


def test_the_handlers_file_name_tells_the_host_and_the_process():
    assert worker_identity(Path("gpu-node-3_4242.1712345678901.pt.trace.json.gz")) == ("gpu-node-3", 4242)
    assert worker_identity(Path("trace.json")) == ("", None)


def test_a_trace_with_a_wall_clock_base_puts_its_windows_on_the_run_clock():
    trace = read(TRACES / "a100-nccl-rank0.pt.trace.json.gz")[-1]
    # baseTimeNanoseconds 1711964646000000000 plus the first step's 4458676416788.066 µs: 2024-05-23 00:13:43 UTC.
    first_step = read(TRACES / "a100-nccl-rank0.pt.trace.json.gz")[0]
    assert first_step.step_start_wall == pytest.approx(1711964646.0 + 4458676.416788066)
    assert trace.device.endswith("/gpu0")
