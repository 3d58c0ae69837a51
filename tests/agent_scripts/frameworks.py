"""An HF ``transformers`` Trainer run (a tiny randomly initialised GPT-2, no download) or a Lightning run, on the CPU.

Usage: frameworks.py hf|lightning OUTDIR. Both log their loss to TensorBoard and run an eval pass every 3 steps;
one JSON line on stdout says what the model itself counts (N, E, layers, width, tokens per step) and the losses logged.
"""

from __future__ import annotations

import json
import sys

import torch

STEPS = 6


def hf(out: str) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(1)
    samples = []
    for _ in range(64):
        ids = torch.randint(100, (32,), generator=generator)
        mask = torch.ones(32, dtype=torch.long)
        mask[24:] = 0  # 8 padding positions in every sample: 24 real tokens
        samples.append({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)})
    args = TrainingArguments(
        output_dir=out,
        max_steps=STEPS,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=2,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=3,
        save_strategy="no",
        report_to=["tensorboard"],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=samples, eval_dataset=samples[:8])
    trainer.train()
    losses = {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}
    return {
        "params": model.num_parameters(),
        "embedding_params": model.transformer.wpe.weight.numel(),
        "layers": config.n_layer,
        "d_model": config.n_embd,
        "tokens_per_step": 2 * 4 * 24,
        "losses": losses,
    }


def lightning(out: str) -> dict:
    import lightning as L
    from gpt_loop import GPT, GPTConfig
    from lightning.pytorch.loggers import TensorBoardLogger

    class LitGPT(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = GPT(GPTConfig())
            self.losses: dict[int, float] = {}

        def training_step(self, batch, batch_idx):
            x, y = batch
            _, loss = self.model(x, y)
            self.log("train_loss", loss)
            self.losses[self.global_step + 1] = loss.item()
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", self.model(x, y)[1])

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-3)

    torch.manual_seed(0)
    cfg = GPTConfig()
    generator = torch.Generator().manual_seed(1)
    data = torch.randint(cfg.vocab_size, (64, cfg.block_size + 1), generator=generator)
    dataset = torch.utils.data.TensorDataset(data[:, :-1], data[:, 1:])
    loader = torch.utils.data.DataLoader(dataset, batch_size=4)
    module = LitGPT()
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        logger=TensorBoardLogger(out, name="lightning"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        val_check_interval=3,
        limit_val_batches=2,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, loader, loader)
    unique = {id(p): p for p in module.model.parameters()}
    return {
        "params": sum(p.numel() for p in unique.values()),
        "embedding_params": module.model.wpe.weight.numel(),
        "layers": cfg.n_layer,
        "d_model": cfg.n_embd,
        "tokens_per_step": 4 * cfg.block_size,
        "losses": module.losses,
    }


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps({"hf": hf, "lightning": lightning}[sys.argv[1]](sys.argv[2])))
