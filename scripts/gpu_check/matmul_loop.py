"""Part 1 of gpu-check: a bf16 matmul loop whose FLOP count is known exactly, 2 n^3 per n x n by n x n product. It
also reads NVML's total energy counter of every GPU itself when the measured loop starts and ends, for the report to
set beside the energy tm recorded over the same interval.

python matmul_loop.py OUT.json SECONDS N [cpu]
"""

from __future__ import annotations

import json
import sys
import time

import torch


def energy_reads() -> dict[str, float | str]:
    """NVML's total energy counter of each GPU by index, in J (nvml.h: millijoules since the driver loaded), or why
    there is none; read through tm's own NVML backend, which answers from the fake GPUs under TM_FAKE_GPUS."""
    try:
        from trainmeter_sources.gpu.nvml import Nvml, NvmlUnavailable, list_devices
    except ImportError as exc:
        return {"absent": f"tm's NVML backend is not importable here: {exc}"}
    try:
        nvml = Nvml.open()
    except NvmlUnavailable as exc:
        return {"absent": exc.detail}
    devices, reason = list_devices(nvml)
    if reason is not None:
        return {"absent": reason}
    reads: dict[str, float | str] = {}
    for device in devices:
        value, why = nvml.call("nvmlDeviceGetTotalEnergyConsumption", device.handle)
        reads[str(device.index)] = value / 1000 if why is None else why
    return reads


def main() -> None:
    out_path, seconds, n = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    cpu = len(sys.argv) > 4 and sys.argv[4] == "1"
    device = "cpu" if cpu else "cuda"
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    batch = 2 if cpu else 50  # products between two waits: the waits leave the GPU idle for a moment only
    warm_end = time.monotonic() + min(5.0, seconds / 4)  # clocks ramp up and cuBLAS picks its kernel
    while time.monotonic() < warm_end:
        for _ in range(batch):
            a @ b
        sync()
    energy_t0 = energy_reads()
    t0 = time.monotonic()
    products = 0
    while time.monotonic() - t0 < seconds:
        for _ in range(batch):
            a @ b
        sync()
        products += batch
    t1 = time.monotonic()
    energy_t1 = energy_reads()
    name = "cpu" if cpu else torch.cuda.get_device_name()
    with open(out_path, "w") as out:
        json.dump(
            {
                "t0": t0,
                "t1": t1,
                "products": products,
                "n": n,
                "flop": products * 2 * n**3,
                "device": name,
                "energy_j_t0": energy_t0,
                "energy_j_t1": energy_t1,
            },
            out,
        )
    print(f"matmul loop: {products} products of {n}x{n} bf16 in {t1 - t0:.1f} s on {name}")


if __name__ == "__main__":
    main()
