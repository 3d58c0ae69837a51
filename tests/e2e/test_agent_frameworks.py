"""Frameworks the agent must see without a line of the user's code changed: an HF ``transformers`` Trainer (a tiny
randomly initialised GPT-2, no download) and a Lightning run (tests/agent_scripts/frameworks.py), on the CPU.

Each must give its steps, its tokens, the model's shape, its eval passes and the loss it logs (through TensorBoard).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from deadline import wait_for
from test_agent import SCRIPTS, kinds
from test_agent_trackers import require

heavy = pytest.mark.xdist_group("heavy")


def framework(run, name: str) -> tuple[dict, list[dict]]:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "frameworks.py"), name, str(run.run_dir / "out")],
        env=run.env(),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=run.run_dir,
    )
    assert done.returncode == 0, done.stderr
    wait_for(lambda: run.hub.kinds.get("bye", 0) >= 1, what="the agent's bye")
    return json.loads(done.stdout.splitlines()[-1]), run.records()


def shape_matches(records: list[dict], expected: dict) -> None:
    facts = {f["name"]: f["value"] for f in kinds(records, "fact")}
    for name in ("params", "embedding_params", "layers", "d_model"):
        assert facts[name] == expected[name], name


@heavy
def test_an_hf_trainer_run_is_seen_with_real_tokens_shape_eval_and_loss(run, torch):
    for package in ("transformers", "accelerate", "tensorboard"):
        require(package)
    expected, records = framework(run, "hf")
    shape_matches(records, expected)
    steps = kinds(records, "step")
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    # 2 accumulated micro-batches of 4 samples, each 24 real tokens of 32 (the mask's zeros are padding): 192.
    assert {(s["micro_batches"], s["tokens"], s["tokens_source"]) for s in steps} == {
        (2, 192, "attention_mask")
    }
    assert expected["tokens_per_step"] == 192
    evals = [p for p in kinds(records, "phase") if p["phase"] == "eval"]
    assert [(p["step"], p["probe"]) for p in evals] == [
        (3, "transformers.Trainer.evaluate"),
        (6, "transformers.Trainer.evaluate"),
    ]
    logged = [
        (m["step"], m["values"]["train/loss"])
        for m in kinds(records, "metric")
        if "train/loss" in m["values"]
    ]
    # The float the Trainer logged to TensorBoard is the one it keeps in its log history.
    assert logged == [(int(k), v) for k, v in expected["losses"].items()]


@heavy
def test_a_lightning_run_is_seen_with_its_steps_tokens_shape_eval_and_loss(run, torch):
    for package in ("lightning", "tensorboard"):
        require(package)
    expected, records = framework(run, "lightning")
    shape_matches(records, expected)
    steps = kinds(records, "step")
    # Lightning steps its optimizer with a closure (forward and backward inside optimizer.step): still one per step.
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert {(s["micro_batches"], s["tokens"], s["tokens_source"]) for s in steps} == {(1, 64, "input_ids")}
    evals = [p for p in kinds(records, "phase") if p["phase"] == "eval"]
    assert [(p["step"], p["probe"]) for p in evals] == [
        (3, "lightning evaluation loop"),
        (6, "lightning evaluation loop"),
    ]
    metrics = kinds(records, "metric")
    logged = [
        m["values"]["train_loss"]
        for m in metrics
        if m.get("origin") != "backward" and "train_loss" in m["values"]
    ]
    assert logged == list(expected["losses"].values())
    # Lightning calls backward on the loss it logs: the agent read the same values from it, one per step.
    from_backward = [(m["step"], m["values"]["train_loss"]) for m in metrics if m.get("origin") == "backward"]
    assert from_backward == list(enumerate(logged, start=1))
