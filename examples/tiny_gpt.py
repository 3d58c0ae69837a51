"""A tiny character-level GPT trained on the CPU: the main job of the README, and a fixture of the test suite.

It is plain PyTorch with one optional trainmeter line (``emit``); under ``tm`` the agent sees its steps by itself.
The text is generated, so it needs no download. usage: python examples/tiny_gpt.py [--steps N] [--seed S] [--lr LR]
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainmeter_agent import emit


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = nn.MultiheadAttention(cfg.n_embd, cfg.n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        mask = torch.triu(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        logits = self.lm_head(self.ln_f(x))
        loss = (
            None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        )
        return logits, loss


def make_text(n_chars: int, seed: int) -> torch.Tensor:
    """Sentences from a small grammar: enough structure for the loss to fall visibly."""
    g = torch.Generator().manual_seed(seed)
    words = ["the", "cat", "dog", "sat", "ran", "on", "a", "mat", "log", "and", "then", "slept", "quickly"]
    out: list[str] = []
    while sum(map(len, out)) < n_chars:
        n = int(torch.randint(3, 9, (1,), generator=g))
        out.append(" ".join(words[int(i)] for i in torch.randint(0, len(words), (n,), generator=g)) + ". ")
    text = "".join(out)[:n_chars]
    alphabet = sorted(set(text))
    return torch.tensor([alphabet.index(c) for c in text], dtype=torch.long)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--lr", type=float, default=3e-3, help="the peak learning rate (cosine decay to 0)")
    parser.add_argument(
        "--sleep", type=float, default=0.0, help="seconds to pause per step (to watch it live)"
    )
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    data = make_text(200_000, args.seed)
    cfg = GPTConfig()
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]
    model = GPT(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    def batch(source: torch.Tensor):
        ix = torch.randint(len(source) - cfg.block_size - 1, (args.batch,))
        x = torch.stack([source[i : i + cfg.block_size] for i in ix])
        y = torch.stack([source[i + 1 : i + 1 + cfg.block_size] for i in ix])
        return x, y

    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"tiny GPT: {n_params:,} parameters, {cfg.n_layer} layers, width {cfg.n_embd}, context {cfg.block_size}"
    )
    start = time.monotonic()
    for step in range(1, args.steps + 1):
        lr = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = batch(train)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        emit(train_loss=loss.item(), lr=lr)
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            with torch.no_grad():
                val_loss = model(*batch(val))[1].item()
            model.train()
            emit(val_loss=val_loss)
            print(
                f"step {step:4d}  train loss {loss.item():.3f}  val loss {val_loss:.3f}  lr {lr:.2e}",
                flush=True,
            )
        if args.sleep:
            time.sleep(args.sleep)
    print(f"trained {args.steps} steps in {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    main()
