"""The dashboard's Profile part in a real browser: a trace of the run's own process imported into a finished run."""

from __future__ import annotations

import json
import shutil

from dashboard_page import (
    GOLDEN,
    SHOTS,
    Served,
)

# --------------------------------------------------------------------------------------------------------------------
# The Profile part: a trace of the run's own process imported into a finished run shows where each profiled step's GPU
# time went, the run's steps it maps to, the top kernels, what the window achieved, and the profiled steps shaded on
# the step-time chart (artifacts/web/profile.png).

PROFILED_RUN = GOLDEN / "cpu-measured"
PROFILE_BASE_NS = 1_795_984_000_000_000_000


def steps_of(run_dir):
    out = {}
    for line in (run_dir / "events-0001.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "step":
            out[record["step"]] = record
    return out


def write_trace(run_dir, folder):
    """A Kineto trace of the run's own process (pid and host in the handler's file name): profiler steps #10-#12
    around the run's steps 4-6, each with a GEMM, a flash-attention kernel, an NCCL all-reduce partly hidden by
    compute, a copy and an elementwise kernel, each launched by a runtime call; the GEMM's op counts 2 GFLOP."""
    steps = steps_of(run_dir)
    pid = steps[4]["pid"]
    base_us = PROFILE_BASE_NS / 1000
    events = []
    corr = 100
    for number, run_step in ((10, 4), (11, 5), (12, 6)):
        start = (steps[run_step - 1]["wall"] + 0.001) * 1e6 - base_us  # µs after the base
        end = (steps[run_step]["wall"] + 0.001) * 1e6 - base_us
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{number}",
                "pid": pid,
                "tid": pid,
                "ts": start,
                "dur": end - start,
                "args": {},
            }
        )
        gpu = start + 500.0
        for name, cat, dur, stream in (
            ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "kernel", 20000.0, 7),
            (
                "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(Flash_fwd_params)",
                "kernel",
                12000.0,
                7,
            ),
            (
                "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                "kernel",
                15000.0,
                20,
            ),
            ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 2000.0, 7),
            (
                "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>(int)",
                "kernel",
                6000.0,
                7,
            ),
        ):
            corr += 1
            launch = gpu - 400.0
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": pid,
                    "tid": pid,
                    "ts": launch,
                    "dur": 10.0,
                    "args": {"correlation": corr},
                }
            )
            if cat == "kernel" and "gemm" in name:
                events.append(
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": "aten::mm",
                        "pid": pid,
                        "tid": pid,
                        "ts": launch - 5.0,
                        "dur": 20.0,
                        "args": {"flops": 2_000_000_000},
                    }
                )
            ts = gpu - 8000.0 if stream == 20 else gpu  # NCCL starts under the GEMM: partly hidden
            events.append(
                {
                    "ph": "X",
                    "cat": cat,
                    "name": name,
                    "pid": 0,
                    "tid": stream,
                    "ts": ts,
                    "dur": dur,
                    "args": {"device": 0, "stream": stream, "correlation": corr, "bytes": 1 << 20},
                }
            )
            if stream == 7:
                gpu += dur + 300.0
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
        "traceEvents": events,
        "baseTimeNanoseconds": PROFILE_BASE_NS,
    }
    folder.mkdir()
    path = folder / f"{steps[4]['host']}_{pid}.1795984653000.pt.trace.json"
    path.write_text(json.dumps(trace))
    return path


def test_the_profile_part_shows_the_split_the_steps_the_kernels_and_marks_the_step_time_chart(
    page,
    tmp_path,
    capsys,
):
    import contextlib
    import io

    from trainmeter_core.commands.cli import main

    run_dir = tmp_path / PROFILED_RUN.name
    shutil.copytree(PROFILED_RUN, run_dir)
    write_trace(run_dir, tmp_path / "traces")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert (
            main(["import", str(run_dir), str(tmp_path / "traces")]) == 0
        )  # the run's own process: no --force
    assert out.getvalue().startswith("process ProfilerStep#10-12 = step 4-6: ")
    served = Served(run_dir, capsys)
    p = page.page
    try:
        p.goto(served.url)
        p.wait_for_selector("#profile-split .profile-rank")
        head = p.text_content("#profile-split .profile-rank-head")
        assert head.startswith("the process · steps 4–6 · ") and head.endswith("torch.profiler")
        legend = p.text_content("#profile-split .legend")
        # The copy runs while the all-reduce does: the exclusive split gives that time to communication.
        for part in ("GEMM", "attention", "communication (exposed)", "other compute", "idle"):
            assert part in legend, legend
        assert "memory copies" not in legend
        rows = p.eval_on_selector_all(
            "#profile-steps tr",
            "rows => rows.slice(1).map(r => [...r.cells].slice(1, 3).map(c => c.textContent))",
        )
        assert rows == [["#10", "4"], ["#11", "5"], ["#12", "6"]]
        kernels = p.eval_on_selector_all(
            "#profile-kernels td.kernel-name", "cells => cells.map(c => c.textContent)"
        )
        assert kernels[0].startswith("sm90_xmma_gemm") and any("flash_fwd_kernel" in k for k in kernels)
        # 2 GFLOP per profiled step over each window against the run's measured CPU peak: a number, not n/a.
        mfu = p.text_content("#profile-achieved [data-explain='profile_mfu']")
        assert mfu.endswith("%") and mfu != "n/a"
        # The step-time chart shades the profiled steps 4, 5 and 6 (each from half a step before to half after).
        marks = p.get_attribute("#chart-rank-step-time", "data-nan")
        assert marks == "3.5,4.5,5.5", marks
        p.mouse.move(0, 0)
        SHOTS.mkdir(parents=True, exist_ok=True)
        p.locator("#profile").screenshot(path=str(SHOTS / "profile.png"))
        p.locator("#chart-rank-step-time").screenshot(path=str(SHOTS / "profile-step-time.png"))
        assert page.errors == []
    finally:
        served.stop()
