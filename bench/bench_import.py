"""Importing a large torch.profiler trace: MB/s of uncompressed JSON and the importer's peak memory (printed, not a test).

Writes a synthetic Kineto trace of about ``--mb`` MB (default 500) in the layout PyTorch writes (one event over a few
indented lines, CPU ops, CUDA runtime calls with their flow events, kernels on a compute and an NCCL stream, copies,
ProfilerStep annotations, FLOPs on the matmuls), then imports it with tm's built-in importer in a fresh process and
prints the rate and that process's peak RSS. The targets (issue 13): at least 50 MB/s, at most 200 MB.

    python bench/bench_import.py [--mb 500] [--keep PATH] [--ijson]

``--ijson`` also times ijson's C backend (yajl2_c) on the same file, building the same events, for the comparison
in docs/performance.md (install ijson first; tm does not depend on it).
"""

# ruff: noqa: UP031 - the event templates read like the JSON they write, which %-formatting keeps visible
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAD = """{
  "schemaVersion": 1,
  "deviceProperties": [
    {
      "id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912,
      "computeMajor": 9, "computeMinor": 0, "numSms": 132
    }
  ],
  "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},
  "traceEvents": [
"""
TAIL = """  {
    "name": "Record Window End", "ph": "i", "s": "g",
    "pid": "", "tid": "", "ts": %.3f
  }
  ],
  "traceName": "synthetic.pt.trace.json",
  "displayTimeUnit": "ms",
  "baseTimeNanoseconds": 1767225600000000000
}
"""
OPS = [
    (
        "aten::addmm",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
        180.0,
        True,
    ),
    (
        "aten::_scaled_dot_product_flash_attention",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, false, false, false, false, true, false, false>(Flash_fwd_params)",
        95.0,
        True,
    ),
    (
        "aten::gelu",
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)",
        22.0,
        False,
    ),
    (
        "aten::native_layer_norm",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",
        14.0,
        False,
    ),
    (
        "aten::add",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)",
        9.0,
        False,
    ),
]


def write_trace(path: Path, target_b: int, seed: int = 7) -> dict:
    """A synthetic trace of about ``target_b`` bytes; returns what it holds."""
    rng = random.Random(seed)
    cpu_t = 1_000_000.0  # µs after the base
    gpu_t = cpu_t + 500.0
    corr = 1000
    ext = 1
    step = 0
    counts = {"events": 0, "kernels": 0, "steps": 0}
    with open(path, "w", encoding="utf-8", buffering=8 << 20) as f:
        f.write(HEAD)
        written = len(HEAD)
        while written < target_b:
            step += 1
            step_start = cpu_t
            parts = []
            for layer in range(24):
                for op, kernel, gpu_us, flops in OPS:
                    dur_cpu = 12.0 + rng.random() * 6
                    corr += 1
                    ext += 1
                    launch = cpu_t + 4.0
                    args_flops = f', "flops": {rng.randrange(10**9, 10**11)}' if flops else ""
                    parts.append(
                        '  {\n    "ph": "X", "cat": "cpu_op", "name": "%s", "pid": 4242, "tid": 4242,\n'
                        '    "ts": %.3f, "dur": %.3f,\n    "args": {\n      "External id": %d,"Record function id": 0, '
                        '"Sequence number": %d, "Fwd thread id": 0, "Ev Idx": %d, "Input Dims": [[16, 1024, 768], [768, 3072]], '
                        '"Input type": ["c10::BFloat16", "c10::BFloat16"]%s\n    }\n  },\n'
                        % (op, cpu_t, dur_cpu, ext, ext, ext, args_flops)
                    )
                    parts.append(
                        '  {\n    "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4242,\n'
                        '    "ts": %.3f, "dur": %.3f,\n    "args": {\n      "External id": %d, "cbid": 211, "correlation": %d\n    }\n  },\n'
                        % (launch, 5.0, ext, corr)
                    )
                    parts.append(
                        '  {\n    "ph": "s", "id": %d, "pid": 4242, "tid": 4242, "ts": %.3f,\n    "cat": "ac2g", "name": "ac2g"\n  },\n'
                        % (corr, launch)
                    )
                    gpu_t = max(gpu_t, launch + 6.0)
                    dur = gpu_us * (0.9 + rng.random() * 0.2)
                    parts.append(
                        '  {\n    "ph": "X", "cat": "kernel", "name": "%s", "pid": 0, "tid": 7,\n'
                        '    "ts": %.3f, "dur": %.3f,\n    "args": {\n      "External id": %d, "queued": 0, "device": 0, "context": 1,'
                        ' "stream": 7, "correlation": %d, "registers per thread": 128, "shared memory": 65536, "blocks per SM": 1.939394,'
                        ' "warps per SM": 15.515152, "grid": [256, 1, 1], "block": [256, 1, 1], "est. achieved occupancy %%": 0\n    }\n  },\n'
                        % (kernel, gpu_t, dur, ext, corr)
                    )
                    parts.append(
                        '  {\n    "ph": "f", "id": %d, "pid": 0, "tid": 7, "ts": %.3f,\n    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  },\n'
                        % (corr, gpu_t)
                    )
                    gpu_t += dur + 2.0
                    cpu_t += dur_cpu + 1.0
                    counts["kernels"] += 1
                    counts["events"] += 5
                if layer % 6 == 5:  # a gradient bucket: NCCL on its own stream, and a copy
                    corr += 1
                    parts.append(
                        '  {\n    "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4242,\n'
                        '    "ts": %.3f, "dur": 6.000,\n    "args": {\n      "External id": %d, "cbid": 211, "correlation": %d\n    }\n  },\n'
                        % (cpu_t, ext, corr)
                    )
                    parts.append(
                        '  {\n    "ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "pid": 0, "tid": 20,\n'
                        '    "ts": %.3f, "dur": %.3f,\n    "args": {\n      "External id": %d, "device": 0, "stream": 20, "correlation": %d\n    }\n  },\n'
                        % (gpu_t - 300.0, 600.0, ext, corr)
                    )
                    corr += 1
                    parts.append(
                        '  {\n    "ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "pid": 0, "tid": 7,\n'
                        '    "ts": %.3f, "dur": 3.500,\n    "args": {\n      "External id": %d, "device": 0, "context": 1, "stream": 7, '
                        '"correlation": %d, "bytes": 4194304, "memory bandwidth (GB/s)": 1198.3\n    }\n  },\n'
                        % (gpu_t, ext, corr)
                    )
                    gpu_t += 5.5
                    counts["kernels"] += 2
                    counts["events"] += 3
            cpu_t = max(cpu_t, gpu_t - 200.0) + 30.0  # the optimizer waits for the GPU now and then
            parts.append(
                '  {\n    "ph": "X", "cat": "user_annotation", "name": "ProfilerStep#%d", "pid": 4242, "tid": 4242,\n'
                '    "ts": %.3f, "dur": %.3f,\n    "args": {\n      "External id": %d\n    }\n  },\n'
                % (step, step_start, cpu_t - step_start, ext)
            )
            counts["steps"] += 1
            counts["events"] += 1
            text = "".join(parts)
            f.write(text)
            written += len(text)
        f.write(TAIL % cpu_t)
    counts["bytes"] = path.stat().st_size
    return counts


IMPORT = """
import resource, sys, time
from pathlib import Path
from trainmeter_core.importers.kineto import KinetoImporter
t0 = time.perf_counter()
c0 = time.process_time()
records = list(KinetoImporter().read(Path(sys.argv[1]), {}))
dt = time.perf_counter() - t0
cpu = time.process_time() - c0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
trace = records[-1]
print(f"{dt} {cpu} {peak} {len(records)} {trace.busy_s} {trace.window_s}")
"""

IJSON = """
import resource, sys, time
import ijson
from trainmeter_core.model.profiles.kineto import Event, KinetoTrace
import msgspec
t0 = time.perf_counter()
c0 = time.process_time()
trace = KinetoTrace()
batch = []
with open(sys.argv[1], "rb") as f:
    for item in ijson.items(f, "traceEvents.item", use_float=True):
        batch.append(msgspec.convert(item, Event))
        if len(batch) == 10000:
            trace.feed(batch)
            batch = []
trace.feed(batch)
dt = time.perf_counter() - t0
cpu = time.process_time() - c0
print(f"{dt} {cpu} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024} {ijson.backend}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=500.0)
    parser.add_argument("--keep", help="write the trace here and keep it")
    parser.add_argument("--ijson", action="store_true", help="also time ijson's C backend")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep) if args.keep else Path(tmp) / "synthetic.pt.trace.json"
        t0 = time.perf_counter()
        counts = write_trace(path, int(args.mb * 1e6))
        mb = counts["bytes"] / 1e6
        print(
            f"wrote {mb:.0f} MB: {counts['events']:,} events, {counts['kernels']:,} GPU activities, "
            f"{counts['steps']} profiler steps ({time.perf_counter() - t0:.1f} s)"
        )
        env = dict(os.environ, OMP_NUM_THREADS="1")
        out = subprocess.run(
            [sys.executable, "-c", IMPORT, str(path)], capture_output=True, text=True, env=env
        )
        if out.returncode:
            sys.exit(out.stderr)
        dt, cpu, peak, n, busy, window = out.stdout.split()
        load = os.getloadavg()[0]
        print(
            f"tm import (kineto importer): {float(dt):.1f} s wall, {float(cpu):.1f} s CPU: "
            f"{mb / float(dt):.0f} MB/s of uncompressed JSON by the clock, {mb / float(cpu):.0f} MB/s per CPU second; "
            f"peak RSS {float(peak):.0f} MB; {n} records (GPU busy {float(busy):.2f} s of {float(window):.2f} s); "
            f"load average {load:.1f} on {os.cpu_count()} CPUs"
        )
        print("targets: >= 50 MB/s, <= 200 MB peak RSS")
        if args.ijson:
            out = subprocess.run(
                [sys.executable, "-c", IJSON, str(path)], capture_output=True, text=True, env=env
            )
            if out.returncode:
                sys.exit(out.stderr)
            dt, cpu, peak, backend = out.stdout.split()
            print(
                f"ijson ({backend}) items + msgspec.convert + the same events: {float(dt):.1f} s wall, "
                f"{float(cpu):.1f} s CPU: {mb / float(dt):.0f} MB/s by the clock, {mb / float(cpu):.0f} MB/s per CPU "
                f"second; peak RSS {float(peak):.0f} MB"
            )


if __name__ == "__main__":
    main()
