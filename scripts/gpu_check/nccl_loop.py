"""Part 3 of gpu-check: a one-process NCCL world on the GPU, run by ``torchrun --nproc-per-node 1`` under tm.

Each of STEPS steps trains a small model (backward, optimizer step) and all-reduces two tensors from Python, whose
sizes it knows: a float32 gradient-sized buffer and a bfloat16 one. It writes what it ran, per step, as JSON, for
``nccl_rows.py`` to set beside the collective probe's rows. ``--backend gloo --device cpu`` runs the same loop on a
machine without a GPU (how this script is tried there; gpu-check itself skips part 3 where CUDA is absent).

Usage: nccl_loop.py OUT_JSON [--steps 30] [--backend nccl] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

#: The two tensors all-reduced each step: (elements, dtype, bytes of one element).
TENSORS = ((1 << 20, torch.float32, 4), (3000, torch.bfloat16, 2))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_json")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--backend", default="nccl")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = (
        torch.device(args.device, int(os.environ.get("LOCAL_RANK", "0"))) if args.device == "cuda" else "cpu"
    )
    if args.device == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend)
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    buffers = [torch.ones(n, dtype=dtype, device=device) for n, dtype, _ in TENSORS]
    for _ in range(args.steps):
        loss = model(torch.randn(64, 256, device=device)).square().mean()
        opt.zero_grad()
        loss.backward()
        for buffer in buffers:
            dist.all_reduce(buffer)
        opt.step()
    if args.device == "cuda":
        torch.cuda.synchronize()
    ran = {
        "steps": args.steps,
        "backend": dist.get_backend(),
        "world_size": dist.get_world_size(),
        "all_reduce_per_step": len(TENSORS),
        "all_reduce_bytes_per_step": sum(n * size for n, _, size in TENSORS),
    }
    dist.destroy_process_group()
    with open(args.out_json, "w") as out:
        json.dump(ran, out)


if __name__ == "__main__":
    main()
