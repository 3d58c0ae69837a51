"""A synthetic week-long run directory: 8 GPUs sampled at 1 Hz and a million steps over 7 days, as tm leaves it.

usage: python tests/scripts/week_run.py RUN_DIR

Its log holds what a real run's log holds around its engine's last checkpoint: the run's start and facts, then (after
the checkpoint) its last two minutes of steps on 8 ranks, losses, GPU samples and ticks, and its end. The week before
is in the checkpoint (``engine.ckpt``), as a week-long run leaves it: the engine checkpoints every few minutes and a
reader replays only the log after the last one. The week's history is built by the History the engine keeps, point by
point, once per cadence (one point per step, one per second) and shared by the series of that cadence: the same bytes
as a real week, in seconds instead of the hours a million-step log would take to replay on two cores.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.model.history import History, HistoryState
from trainmeter_core.runlog.checkpoint import save_checkpoint

WALL0 = 1_700_000_000.0
WEEK_S = 7 * 24 * 3600
STEP_S = 0.6048  # a million steps in a week
GPUS = 8
TOKENS_PER_STEP = 8 * 4096
FLOP_PER_TOKEN = 6.0e9
TAIL_S = 120
HOST = "node"
COMMAND = ["torchrun", "--nproc_per_node=8", "train.py", "--lr=3e-4"]


def loss_at(step: float) -> float:
    return 2.0 + 1.0 / math.log(step + 2.0)


def facts() -> list[records.Record]:
    out: list[records.Record] = [
        records.Fact(name="convention", value="titan", provenance="declared", origin="--convention"),
        records.Fact(
            name="flop_per_token", value=FLOP_PER_TOKEN, provenance="declared", origin="--flops-per-token"
        ),
        records.Fact(
            name="budget_tokens",
            value=TOKENS_PER_STEP * 1.2e6,
            provenance="declared",
            origin="--budget-tokens",
        ),
    ]
    for i in range(GPUS):
        gpu = {
            "index": i,
            "uuid": f"GPU-{i}",
            "name": "NVIDIA H100 80GB HBM3",
            "display_name": "H100 SXM",
            "dense_bf16_flop_per_s": 989e12,
            "tensor_clock_mhz": 1830.0,
            "memory_bandwidth_bps": 3.35e12,
        }
        out.append(
            records.Fact(
                name="gpu", device=f"{HOST}/gpu{i}", provenance="detected", origin="sampler:nvml", value=gpu
            )
        )
        device = {"type": "cuda", "index": i, "uuid": f"GPU-{i}"}
        out.append(
            records.Fact(name="device", rank=i, provenance="detected", origin="agent:model", value=device)
        )
    return out


def gpu_sample(i: int, k: float) -> records.SampleGpu:
    phase = math.sin(k / 300 + i)
    return records.SampleGpu(
        index=i, uuid=f"GPU-{i}", util_gpu=0.97, sm_active=0.8 + 0.05 * phase, tensor_active=0.5 + 0.05 * phase,
        dram_active=0.3 + 0.02 * phase, clock_sm_mhz=1830.0, power_w=650.0 + 20 * phase, gpm_window_s=1.0,
    )  # fmt: skip


def week_history(history: History, steps: int, seconds: int) -> History:
    """The engine's history plus the week: every step's and every second's point, for each series of that cadence."""
    per_step, per_second, per_eval = History(), History(), History()
    for s in range(1, steps + 1):
        per_step.add_point("s", float(s), s * TOKENS_PER_STEP, s * TOKENS_PER_STEP * FLOP_PER_TOKEN,
                           WALL0 + s * STEP_S, loss_at(s))  # fmt: skip
        if s % 50 == 0:
            per_eval.add_point("e", float(s), s * TOKENS_PER_STEP, s * TOKENS_PER_STEP * FLOP_PER_TOKEN,
                               WALL0 + s * STEP_S, loss_at(s) + 0.05)  # fmt: skip
    for k in range(seconds):
        s = k / STEP_S
        per_second.add_point("k", s, s * TOKENS_PER_STEP, s * TOKENS_PER_STEP * FLOP_PER_TOKEN, WALL0 + k,
                             0.5 + 0.05 * math.sin(k / 300))  # fmt: skip
    by_step = ["train_loss", "lr", "grad_norm", *(f"tm:rank:{r}:step_time_s" for r in range(GPUS))]
    by_second = [f"tm:{m}" for m in ("tokens_per_s", "step_time_s", "mfu", "ofu", "util_gpu", "sm_active",
                                     "tensor_active", "dram_active", "arithmetic_intensity", "observed_flop",
                                     "goodput")]  # fmt: skip
    by_second += [
        f"tm:gpu:{HOST}/gpu{i}:{c}"
        for i in range(GPUS)
        for c in ("util_gpu", "sm_active", "tensor_active", "dram_active", "power_w", "clock_sm_mhz")
    ]
    step_tiers = per_step.to_state().series["s"]
    second_tiers = per_second.to_state().series["k"]
    eval_tiers = per_eval.to_state().series["e"]
    state = history.to_state()
    series = {name: step_tiers for name in by_step} | {name: second_tiers for name in by_second}
    series["val_loss"] = eval_tiers
    added = (
        {name: steps for name in by_step} | {name: seconds for name in by_second} | {"val_loss": steps // 50}
    )
    return History.from_state(
        HistoryState(
            capacity=state.capacity, merge=state.merge, tiers=state.tiers, series=series, added=added
        )
    )


class Log:
    """Records with the hub's sequence numbers, written as the recorder writes them."""

    def __init__(self, run_dir: Path) -> None:
        self.file = open(run_dir / "events-0001.jsonl", "wb")  # noqa: SIM115 (closed in close())
        self.seq = 0

    def write(self, record: records.Record, t: float) -> records.Record:
        self.seq += 1
        record.seq, record.t, record.wall, record.v = self.seq, t, WALL0 + t, records.SCHEMA_VERSION
        record.host = record.host or HOST
        data = records.to_builtins(record)
        data["seq"] = data.pop("seq")  # the hub writes seq last on every line
        self.file.write(records.to_log_line(data))
        return record

    def close(self) -> None:
        self.file.close()


def build(run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "run_id": run_dir.name, "name": "week", "run_dir": str(run_dir), "command": COMMAND, "cwd": "/work",
        "host": HOST, "start_wall": WALL0, "tm_version": "0.1.0", "python": "3.11.7", "platform": "Linux",
        "agent": True, "env": {}, "plugins": [],
    }  # fmt: skip
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=1))
    log = Log(run_dir)
    engine = Engine()
    start = records.RunStart(run_id=meta["run_id"], name="week", run_dir=str(run_dir), command=COMMAND, cwd="/work",
                         tm_version="0.1.0", python="3.11.7", platform="Linux", source="launcher")  # fmt: skip
    engine.feed(log.write(start, 0.0))
    for fact in facts():
        engine.feed(log.write(fact, 0.5))
    # The week up to its last two minutes, as the engine's checkpoint holds it.
    t = float(WEEK_S - TAIL_S)
    steps = int(t / STEP_S)
    engine.history = week_history(engine.history, steps, int(t))
    state = engine.state
    state.start_t, state.first_step_t, state.last_step_t, state.now_t = 0.0, STEP_S, steps * STEP_S, t
    state.now_wall, state.tick = WALL0 + t, int(t)
    state.steps, state.last_step = steps, steps
    state.tokens_seen, state.steps_with_tokens = steps * TOKENS_PER_STEP, steps
    state.window_tokens = (steps - 1) * TOKENS_PER_STEP
    save_checkpoint(run_dir, engine, log.seq)
    # The last two minutes, in the log after the checkpoint.
    step = steps
    next_step_t = (steps + 1) * STEP_S
    for second in range(int(t) + 1, WEEK_S + 1):
        while next_step_t <= second:
            step += 1
            for rank in range(GPUS):
                tokens = {"tokens_global": TOKENS_PER_STEP} if rank == 0 else {}
                log.write(
                    records.Step(step=step, rank=rank, step_time_s=STEP_S, source="agent", **tokens),
                    next_step_t,
                )
            values = {"train_loss": loss_at(step), "lr": 3e-4, "grad_norm": 0.3}
            if step % 50 == 0:
                values["val_loss"] = loss_at(step) + 0.05
            log.write(records.Metric(values=values, step=step, rank=0, source="agent"), next_step_t)
            next_step_t += STEP_S
        for i in range(GPUS):
            log.write(gpu_sample(i, second), float(second))
        log.write(records.Tick(n=second, interval_s=1.0, source="hub"), float(second))
    end = records.RunEnd(
        status=0, reason="exited", exit_code=0, elapsed_s=float(WEEK_S), steps=step, source="launcher"
    )
    log.write(end, WEEK_S + 0.5)
    log.close()
    summary = {
        "state": "finished",
        "exit_status": 0,
        "start_wall": WALL0,
        "end_wall": WALL0 + WEEK_S,
        "steps": step,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    build(Path(sys.argv[1]))
