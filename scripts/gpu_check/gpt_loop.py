"""Part 2 of gpu-check: a short GPT training loop that counts itself, to compare with what tm says of it.

It knows its own shape (hence its titan FLOPs per token, 6(N - E) + 12 L d T), times itself between two points where
it has waited for the device anyway (``loss.item()``, as nanoGPT does each logged iteration) and writes every loss as
``float.hex``. It uses no tracker and no ``emit``: tm reads the loss from ``backward()``.

  python gpt_loop.py OUT.json --device cuda --steps 300     # GPT-2 124M shape, bf16 autocast, 16 x 1024 tokens
  python gpt_loop.py OUT.json --device cpu --steps 80       # a tiny float32 GPT
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

#: name -> (layers, heads, width, sequence length, vocabulary, batch)
SHAPES = {
    "gpt2-124m": (12, 12, 768, 1024, 50304, 16),
    "tiny": (2, 2, 64, 64, 256, 4),
}
#: Steps before the loop's own timing window opens: allocator, kernels picked, clocks up.
WARMUP_STEPS = 10


@dataclass
class GPTConfig:
    """The shape, under nanoGPT's names (which tm's agent reads, as it would from nanoGPT itself)."""

    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int


class Block(nn.Module):
    def __init__(self, heads: int, width: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers: int, heads: int, width: int, seq_len: int, vocab: int) -> None:
        super().__init__()
        self.config = GPTConfig(layers, heads, width, seq_len, vocab)
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(heads, width) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2: the token table stays in N - E
        for name, param in self.named_parameters():
            if name.endswith("weight") and param.dim() == 2:
                residual = name.endswith(
                    ("proj.weight", "down.weight")
                )  # GPT-2's scaled init of residual outputs
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * layers) if residual else 0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--device", choices=["cuda", "cpu"], required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--shape", choices=sorted(SHAPES), help="default: gpt2-124m on cuda, tiny on cpu")
    args = parser.parse_args()
    shape = args.shape or ("gpt2-124m" if args.device == "cuda" else "tiny")
    layers, heads, width, seq_len, vocab, batch = SHAPES[shape]
    if args.steps <= WARMUP_STEPS + 1:
        raise SystemExit(
            f"--steps must be more than {WARMUP_STEPS + 1}: the first {WARMUP_STEPS} are warm-up"
        )
    torch.manual_seed(0)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT(layers, heads, width, seq_len, vocab).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    generator = torch.Generator(device=device).manual_seed(1)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    unique = {id(p): p for p in model.parameters()}
    n_params = sum(p.numel() for p in unique.values())
    embedding_params = model.wpe.weight.numel()
    flop_per_token = 6 * (n_params - embedding_params) + 12 * layers * width * seq_len

    losses: list[str] = []
    marks: dict[int, float] = {}
    for step in range(1, args.steps + 1):
        x = torch.randint(vocab, (batch, seq_len), device=device, generator=generator)
        y = torch.randint(vocab, (batch, seq_len), device=device, generator=generator)
        with autocast:
            loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item().hex())  # waits for the device: the loop's own clock reads after it
        if step in (WARMUP_STEPS, args.steps):
            marks[step] = time.monotonic()
    window_steps = args.steps - WARMUP_STEPS
    window_s = marks[args.steps] - marks[WARMUP_STEPS]
    tokens_per_s = window_steps * batch * seq_len / window_s
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": "bfloat16 autocast" if device.type == "cuda" else "float32",
        "shape": shape,
        "params": n_params,
        "embedding_params": embedding_params,
        "layers": layers,
        "d_model": width,
        "seq_len": seq_len,
        "batch": batch,
        "tokens_per_step": batch * seq_len,
        "flop_per_token_titan": flop_per_token,
        "window_first_step": WARMUP_STEPS,
        "window_last_step": args.steps,
        "window_t0": marks[WARMUP_STEPS],
        "window_t1": marks[args.steps],
        "tokens_per_s": tokens_per_s,
        "losses": losses,
    }
    with open(args.out, "w") as out:
        json.dump(result, out)
    print(
        f"gpt loop: {args.steps} steps of {batch} x {seq_len} tokens ({shape}, {result['dtype']}) on "
        f"{result['device']}: {tokens_per_s:,.0f} tokens/s over steps {WARMUP_STEPS}-{args.steps}, "
        f"titan {flop_per_token:,} FLOP/token, last loss {float.fromhex(losses[-1]):.4f}"
    )


if __name__ == "__main__":
    main()
