"""A small nanoGPT-style model trained on the CPU, for the agent-in-depth tests; prints one JSON line on stdout.

The line holds every loss as ``float.hex`` (the last micro-batch's of each step in ``losses``, every micro-batch's in
``micro_losses``) and what the model itself says it is (N, E, layers, width, sequence length, tokens per step), so a
test compares the agent's facts with the model's own counts. No tracker and no ``emit`` unless asked: the agent reads
the loss from ``backward()``. Options turn on gradient accumulation, a GradScaler, eval passes, a DataLoader,
checkpoints, torch.compile, the trackers, or a user error. Deterministic: the same options always give the same losses.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    block_size: int = 16
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.1


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2: the token table stays in N - E

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--eval-every", type=int, default=0)
    parser.add_argument("--dataloader", action="store_true")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--worker-context", choices=["fork", "spawn", "forkserver"], default=None)
    parser.add_argument("--compile", action="store_true", help="torch.compile(model, backend='aot_eager')")
    parser.add_argument("--scaler", type=float, help="a CPU GradScaler with this initial scale")
    parser.add_argument("--save", help="a folder: torch.save and safetensors checkpoints at the end")
    parser.add_argument("--state", help="write the final state_dict and RNG state here (torch.save)")
    parser.add_argument("--tensorboard", help="log the loss with torch.utils.tensorboard into this folder")
    parser.add_argument("--tensorboardx", help="log the loss with tensorboardX into this folder")
    parser.add_argument("--wandb", help="log the loss with wandb (offline) into this folder")
    parser.add_argument("--mlflow", help="log the loss with MLflow into this file store folder")
    parser.add_argument("--error", choices=["forward", "stop_iteration", "interrupt"])
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = GPTConfig()
    model = GPT(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    trained = torch.compile(model, backend="aot_eager") if args.compile else model
    generator = torch.Generator().manual_seed(1)
    data = torch.randint(cfg.vocab_size, (4096,), generator=generator)
    loggers = open_loggers(args)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(data) - cfg.block_size - 1, (args.batch,), generator=generator)
        x = torch.stack([data[i : i + cfg.block_size] for i in ix])
        return x, torch.stack([data[i + 1 : i + 1 + cfg.block_size] for i in ix])

    batches = iter(data_loader(cfg, args, data)) if args.dataloader else None
    scaler = torch.amp.GradScaler("cpu", init_scale=args.scaler) if args.scaler else None
    result: dict = {"losses": [], "micro_losses": []}
    for step in range(1, args.steps + 1):
        optimizer.zero_grad(set_to_none=True)
        micro = []
        for _ in range(args.accum):
            x, y = next(batches) if batches is not None else batch()
            _, loss = trained(x, y)
            micro.append(loss.item().hex())
            if scaler is not None:
                scaler.scale(loss / args.accum).backward()
            else:
                (loss / args.accum).backward()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        result["losses"].append(loss.item().hex())
        result["micro_losses"].append(micro)
        for log in loggers:
            log(step, loss)
        if args.eval_every and step % args.eval_every == 0:
            trained.eval()
            with torch.no_grad():
                trained(*batch())
            trained.train()
    if args.error:
        result["error"] = user_error(args.error, trained)
    if args.save:
        save(args.save, model)
    for log in loggers:
        log(None, None)
    unique = {id(p): p for p in model.parameters()}
    result["model"] = {
        "params": sum(p.numel() for p in unique.values()),
        "embedding_params": model.wpe.weight.numel(),
        "layers": cfg.n_layer,
        "d_model": cfg.n_embd,
        "seq_len": cfg.block_size,
        "tokens_per_step": args.batch * cfg.block_size * args.accum,
    }
    if args.state:
        torch.save({"model": model.state_dict(), "rng": torch.get_rng_state()}, args.state)
    print(json.dumps(result))


def data_loader(cfg: GPTConfig, args, data: torch.Tensor):
    starts = torch.arange(0, len(data) - cfg.block_size - 1, cfg.block_size)
    x = torch.stack([data[i : i + cfg.block_size] for i in starts])
    y = torch.stack([data[i + 1 : i + 1 + cfg.block_size] for i in starts])
    dataset = torch.utils.data.TensorDataset(x, y)
    generator = torch.Generator().manual_seed(2)
    while True:
        yield from torch.utils.data.DataLoader(
            dataset,
            batch_size=args.batch,
            shuffle=True,
            generator=generator,
            num_workers=args.workers,
            multiprocessing_context=args.worker_context if args.workers else None,
            persistent_workers=bool(args.workers),
        )


def save(folder: str, model: nn.Module) -> None:
    import io

    torch.save(model.state_dict(), io.BytesIO())  # into memory, as object collectives do: not a checkpoint
    torch.save(model.state_dict(), f"{folder}/model.pt")
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": model.state_dict()}, checkpoint_id=f"{folder}/dcp", no_dist=True)
    try:
        from safetensors.torch import save_file
    except ImportError:
        return
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, f"{folder}/model.safetensors")


def user_error(kind: str, trained) -> dict:
    """Raise the user's own exception through the probes and report what reached the loop."""
    import traceback

    mine = {"forward": ValueError("mine"), "interrupt": KeyboardInterrupt("stop")}.get(kind)
    try:
        if kind == "stop_iteration":
            next(iter(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(0, 1)))))
        else:

            def broken(module, inputs):
                raise mine

            handle = (
                (trained._orig_mod if hasattr(trained, "_orig_mod") else trained)
                .blocks[0]
                .register_forward_pre_hook(broken)
            )
            try:
                trained(torch.zeros(1, 4, dtype=torch.long))
            finally:
                handle.remove()
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt is one of the cases
        last = traceback.extract_tb(exc.__traceback__)[-1]
        return {"type": type(exc).__name__, "same": mine is None or exc is mine, "function": last.name}
    return {"type": None}


def open_loggers(args) -> list:
    """One ``log(step, loss)`` per tracker asked for; ``log(None, None)`` closes it."""
    loggers = []
    if args.tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        loggers.append(writer_logger(SummaryWriter(args.tensorboard)))
    if args.tensorboardx:
        from tensorboardX import SummaryWriter as WriterX

        loggers.append(writer_logger(WriterX(args.tensorboardx)))
    if args.wandb:
        import wandb

        run = wandb.init(mode="offline", dir=args.wandb, project="tm-test")

        def log_wandb(step, loss):
            if step is None:
                run.finish()
            else:
                run.log({"train/loss": loss.item(), "lr": 3e-3}, step=step)

        loggers.append(log_wandb)
    if args.mlflow:
        import os

        import mlflow

        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 keeps the file store behind this switch
        mlflow.set_tracking_uri("file:" + args.mlflow)
        mlflow.start_run()

        def log_mlflow(step, loss):
            if step is None:
                mlflow.end_run()
            else:
                mlflow.log_metric("train_loss", loss.item(), step=step)
                mlflow.log_metrics({"lr": 3e-3}, step=step)

        loggers.append(log_mlflow)
    return loggers


def writer_logger(writer):
    def log(step, loss):
        if step is None:
            writer.close()
        else:
            writer.add_scalar("loss/train", loss.detach(), step)  # a 0-dim CPU tensor: the tap reads it
            writer.add_scalars("opt", {"lr": 3e-3}, step)

    return log


if __name__ == "__main__":
    sys.exit(main())
