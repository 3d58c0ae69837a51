"""Part 1 of gpu-check: a bf16 matmul loop whose FLOP count is known exactly, 2 n^3 per n x n by n x n product.

python matmul_loop.py OUT.json SECONDS N [cpu]
"""

from __future__ import annotations

import json
import sys
import time

import torch


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
    t0 = time.monotonic()
    products = 0
    while time.monotonic() - t0 < seconds:
        for _ in range(batch):
            a @ b
        sync()
        products += batch
    t1 = time.monotonic()
    name = "cpu" if cpu else torch.cuda.get_device_name()
    with open(out_path, "w") as out:
        json.dump(
            {"t0": t0, "t1": t1, "products": products, "n": n, "flop": products * 2 * n**3, "device": name},
            out,
        )
    print(f"matmul loop: {products} products of {n}x{n} bf16 in {t1 - t0:.1f} s on {name}")


if __name__ == "__main__":
    main()
