"""What sampling costs: 8 fake H100s and the host at 1 Hz (target: at most 1% of one core), the cost of one sample
per GPU, and the host sampler's cost on a stable and on a growing process tree.

The GPU figures go through the real NVML backend over the fake pynvml, so they measure tm's own code, not a driver's
(a real nvmlDeviceGetPcieThroughput alone can take 20 ms). Prints figures; never fails on a time.
usage: python bench/bench_sources.py [--samples N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainmeter_sources.gpu import fake_pynvml  # noqa: E402
from trainmeter_sources.gpu.sampler import GpuSession  # noqa: E402
from trainmeter_sources.host_sampler import TreeSampler  # noqa: E402
from trainmeter_sources.node import NodeReader  # noqa: E402
from trainmeter_sources.profilers import find_profiler  # noqa: E402


def cpu_s() -> float:
    """CPU time of this process (user + system), which is what sampling costs the node."""
    return time.process_time()


def bench_gpus(samples: int) -> float:
    fake_pynvml.install(fake_pynvml.FakeMachine("8xH100"))
    for gpu in fake_pynvml.installed_machine().gpus:
        gpu.set(tensor_active=0.4, sm_active=0.8, dram_active=0.3, gpu_busy=0.97, power_w=600)
    session = GpuSession.open({"TM_FAKE_GPUS": "8xH100"})
    start_cpu = time.process_time()
    session.facts()
    facts_s = time.process_time() - start_cpu
    session.sample(time.monotonic())  # the first sample opens GPM windows
    start_cpu, start_wall = cpu_s(), time.perf_counter()
    for _ in range(samples):
        session.sample(time.monotonic())
    used_s, wall_s = cpu_s() - start_cpu, time.perf_counter() - start_wall
    per_sample_s = used_s / samples
    print(f"gpu facts (8 GPUs, specs loaded at open):        {facts_s * 1e3:8.3f} ms CPU, once per run")
    print(f"gpu sample, 8 fake H100s:                        {per_sample_s * 1e3:8.3f} ms CPU per interval")
    print(f"  per GPU:                                       {per_sample_s / 8 * 1e6:8.1f} us CPU")
    print(f"  wall per interval:                             {wall_s / samples * 1e3:8.3f} ms")
    session.close()
    return per_sample_s


def busy_tree(children: int) -> subprocess.Popen:
    # A root with sleeping children, like a trainer with its DataLoader workers.
    code = f"import subprocess,time; ps=[subprocess.Popen(['sleep','600']) for _ in range({children})]; time.sleep(600)"
    root = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    tree = TreeSampler.for_root(root.pid)
    while time.monotonic() < deadline:
        record = tree.sample(time.monotonic())
        if record is not None and record.procs == children + 1:
            break
        time.sleep(0.05)
    return root


def bench_host(samples: int, children: int) -> float:
    root = busy_tree(children)
    try:
        tree = TreeSampler.for_root(root.pid)
        node = NodeReader()
        paths = {"run": [os.getcwd()], "shm": ["/dev/shm"]}
        tree.sample(time.monotonic())
        node.read(time.monotonic(), paths)
        walks_before = tree.tree.walks
        start_cpu = cpu_s()
        for _ in range(samples):
            now = time.monotonic()
            tree.sample(now)
            node.read(now, paths, cgroup_pid=root.pid)
            find_profiler(tree.tree.pids, root.pid)
        per_sample_s = (cpu_s() - start_cpu) / samples
        walks = tree.tree.walks - walks_before
        print(
            f"host sample, tree of {children + 1:3d} + node + profiler check: {per_sample_s * 1e3:8.3f} ms CPU "
            f"per interval ({walks} tree walks in {samples} samples: a walk only when a pid was handed out)"
        )
        return per_sample_s
    finally:
        root.kill()
        root.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    gpu_s = bench_gpus(args.samples)
    host_s = bench_host(args.samples, children=8)
    bench_host(args.samples // 4, children=64)
    total_s = gpu_s + host_s
    print(
        f"8 GPUs + host at 1 Hz:                          {total_s * 100:8.3f} % of one core "
        "(target <= 1%; sampling's CPU per second of run)"
    )


if __name__ == "__main__":
    main()
