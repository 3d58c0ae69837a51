"""``tm peak``: measure the dense matmul peak of a device on this machine and store it, for MFU with no datasheet.

The one command exempt from "tm never creates a CUDA context": it runs by hand, outside any run, and refuses a GPU that
NVML shows busy. The figure it stores is labelled ``measured`` wherever MFU uses it.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

from trainmeter_core.commands.usage import ArgumentParser
from trainmeter_core.errors import TmError, UsageError

DTYPES = ("bfloat16", "float16", "float32", "float64")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--dtype", choices=DTYPES, help="default: float32 on the CPU, bfloat16 on a GPU")
    parser.add_argument(
        "--threads", type=int, help="CPU threads (default: what the training uses, torch's default)"
    )
    parser.add_argument(
        "--size", type=int, help="matrix size n of the n×n×n product (default 1024 CPU, 8192 GPU)"
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to measure (default 5)")
    parser.add_argument("--dry-run", action="store_true", help="measure and print, store nothing")
    parser.add_argument(
        "--replace",
        action="store_true",
        help="store this measurement even where it disagrees with the stored one by more than its spread",
    )


def gpu_busy(index: int) -> str | None:
    """Why NVML says the GPU is busy, or None. Without NVML the check cannot be made, and that is said."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
    except Exception:
        return None
    if procs:
        return f"{len(procs)} process(es) are using it (pid {', '.join(str(p.pid) for p in procs[:5])})"
    if util > 5:
        return f"it is {util}% busy"
    return None


def measure(
    device: str, dtype_name: str, threads: int | None, size: int, seconds: float
) -> tuple[float, float, str]:
    """The best FLOP/s of repeated n×n×n matmuls (2·n³ FLOP each) over ``seconds``, its spread (how far the best
    stands above the median repetition), and a description that says when."""
    import torch

    dtype = getattr(torch, dtype_name)
    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    a = torch.randn(size, size, device=dev).to(dtype)
    b = torch.randn(size, size, device=dev).to(dtype)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for _ in range(3):  # warm up
        a @ b
    sync()
    rates: list[float] = []
    deadline = time.perf_counter() + seconds
    reps = 1
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync()
        took = time.perf_counter() - start
        rates.append(2 * size**3 * reps / took)
        if took < 0.05:
            reps *= 2
    best = max(rates)
    spread = best - statistics.median(rates)
    described = (
        f"tm peak: best of repeated {size}x{size}x{size} {dtype_name} matmuls on {device}"
        f"{f', {torch.get_num_threads()} thread(s)' if dev.type == 'cpu' else ''}, torch {torch.__version__}, "
        f"measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    return best, spread, described


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="tm peak", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    if os.environ.get("TM_ACTIVE") == "1":
        raise UsageError("tm peak runs only outside a run: it would compete with the training for the device")
    try:
        import torch
    except ImportError:
        raise UsageError("tm peak needs PyTorch in this Python: pip install torch") from None
    device = args.device
    is_gpu = device.startswith("cuda")
    if not is_gpu and device != "cpu":
        raise UsageError(f"--device {device!r}: give cpu or cuda[:N]")
    dtype = args.dtype or ("bfloat16" if is_gpu else "float32")
    if is_gpu:
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        device = f"cuda:{index}"  # the key a run's rank device is matched by
        if not torch.cuda.is_available():
            raise UsageError(f"--device {device}: PyTorch sees no CUDA GPU here")
        busy = gpu_busy(index)
        if busy:
            raise TmError(
                f"GPU {index} is busy ({busy}): a peak measured now would be wrong; retry when it is idle", 1
            )
    size = args.size or (8192 if is_gpu else 1024)
    flop_per_s, spread, described = measure(device, dtype, args.threads, size, args.seconds)
    host = socket.gethostname()
    print(
        f"{flop_per_s / 1e12:.4g} TFLOP/s dense {dtype} on {device}, spread {spread / 1e12:.3g} ({described})"
    )
    if args.dry_run:
        return 0
    entry = {
        "host": host,
        "device": f"{host}/{device}",
        "device_type": "cuda" if is_gpu else "cpu",
        "dtype": dtype,
        "threads": torch.get_num_threads() if not is_gpu else None,
        "flop_per_s": flop_per_s,
        "spread_flop_per_s": spread,
        "source": described,
        "measured_wall": time.time(),
    }
    return keep_or_store(entry, args.replace)


def keep_or_store(entry: dict, replace: bool) -> int:
    """Store ``entry`` unless a stored peak of the same device, dtype and threads disagrees with it by more than its
    spread and ``replace`` was not given: then the stored one stays, and that is said (exit 1)."""
    from trainmeter_core.run import peakstore

    stored = peakstore.stored_for(entry)
    why = peakstore.disagreement(stored, entry) if stored is not None else None
    threads = f", {entry['threads']} thread(s)" if entry.get("threads") else ""
    what = f"{entry['dtype']} on {entry['device']}{threads}"
    if why and not replace:
        print(
            f"tm peak: {why}: kept the stored peak of {what}; measure again on an idle machine, "
            "or pass --replace to store this one",
            file=sys.stderr,
        )
        return 1
    where = peakstore.store(entry)
    replaced = f" (replacing the stored one: {why})" if why else ""
    print(
        f"stored the peak of {what} in {where}{replaced}: runs on {entry['host']} computing in {entry['dtype']}"
        f"{' with the same threads' if threads else ''} are scored against it where no datasheet gives a peak "
        "(MFU labelled measured), and show it beside the datasheet figure otherwise"
    )
    return 0
