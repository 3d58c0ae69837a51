"""The ``counted`` row says what is really missing: with float inputs the agent counts a step's FLOPs but cannot tell
its tokens, so the reason is the tokens, not the counting; a declared ``--tokens-per-step`` then gives the number.
"""

from __future__ import annotations

import json

import pytest
from test_engine import Run, feed
from tm_runs import run_tm

from trainmeter_core.model import records

# An MLP 64 -> 256 -> 10 on a float batch of 512, counted by FlopCounterMode in one training step:
# forward 2·512·64·256 + 2·512·256·10 = 16,777,216 + 2,621,440 = 19,398,656;
# backward: layer 2 input and weight grads 2 × 2,621,440, layer 1 weight grad 16,777,216 (the input needs no grad)
# = 22,020,096; the step: 41,418,752 FLOPs.
MLP_STEP_FLOP = 41_418_752
MLP = """
import torch, torch.nn as nn
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(512, 64), torch.randint(0, 10, (512,))
for _ in range(5):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
TOKENS_UNKNOWN = "the counted step's tokens are unknown: pass --tokens-per-step (FlopCounterMode counted 41,418,752 FLOPs in step 2)"


def counted_run(tokens_per_step=None, ranks=1, dp=None):
    run = Run()
    run.fact("counted_step_flop", MLP_STEP_FLOP, "detected", "agent:flops")
    run.fact("counted_flop_per_token", None, "detected", "agent:flops")
    run.records[-1].note = TOKENS_UNKNOWN
    if tokens_per_step is not None:
        run.fact("tokens_per_step", tokens_per_step)
    if dp is not None:
        run.fact("dp", dp)
    for rank in range(ranks):
        run.step(110.0, 1, rank=rank if ranks > 1 else None)
        run.step(110.5, 2, rank=rank if ranks > 1 else None, step_time_s=0.5)
    run.tick(111.0, 1)
    return run


def counted_metric(run) -> tuple[records.MetricValue, records.Explain]:
    _, snapshots = feed(run.records)
    snapshot = snapshots[-1]
    return snapshot.metrics["flop_per_token.counted"], snapshot.explain["flop_per_token.counted"]


def test_a_count_without_tokens_is_absent_for_its_tokens_not_for_want_of_a_count():
    metric, _ = counted_metric(counted_run())
    assert metric.value is None and metric.absent == TOKENS_UNKNOWN
    assert "no step was counted" not in metric.absent


def test_declared_tokens_per_step_turn_the_count_into_flops_per_token():
    metric, explain = counted_metric(counted_run(tokens_per_step=512))
    # 41,418,752 FLOP / 512 tokens (one process: dp 1) = 80,896 FLOP/token
    assert metric.value == 80_896.0 and metric.convention == "counted" and metric.label == "counted"
    assert explain.inputs["counted_step_flop"].value == MLP_STEP_FLOP
    assert explain.inputs["tokens_per_step"].source == "declared --tokens-per-step"


def test_with_several_ranks_the_count_of_rank_0_needs_the_data_parallel_degree():
    metric, _ = counted_metric(counted_run(tokens_per_step=1024, ranks=2))
    assert metric.absent.endswith("the data-parallel degree is unknown: pass --dp")
    metric, _ = counted_metric(counted_run(tokens_per_step=1024, ranks=2, dp=2))
    # rank 0 ran 1024 / 2 = 512 of the step's tokens: 41,418,752 × 2 / 1024 = 80,896 FLOP/token
    assert metric.value == 80_896.0


def test_no_count_at_all_still_says_so():
    run = Run()
    run.steps(1, 3)
    run.tick(112.0, 1)
    metric, _ = counted_metric(run)
    assert metric.absent == "no step was counted with FlopCounterMode"


@pytest.mark.xdist_group("heavy")
def test_an_mlp_on_float_data_under_tm_names_the_tokens_and_declaring_them_gives_the_count(
    tm_env, tmp_path, torch
):
    script = tmp_path / "mlp_train.py"
    script.write_text(MLP)
    result = run_tm(["--no-web", "-q", str(script)], tm_env)
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(run_tm(["view", "--json"], tm_env).stdout)
    assert snapshot["metrics"]["flop_per_token.counted"]["absent"] == TOKENS_UNKNOWN
    passport = run_tm(["passport"], tm_env).stdout
    assert f"| counted | n/a ({TOKENS_UNKNOWN}) |" in passport

    result = run_tm(["--no-web", "-q", "--tokens-per-step", "512", str(script)], tm_env)
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(run_tm(["view", "--json"], tm_env).stdout)
    assert snapshot["metrics"]["flop_per_token.counted"]["value"] == 80_896.0


@pytest.mark.xdist_group("heavy")
def test_the_agent_sends_the_count_and_the_missing_tokens_as_facts(run, torch):
    # The agent's side alone, on the same MLP, with a real hub and recorder in this process.
    script = run.run_dir / "mlp.py"
    script.write_text(MLP)
    run.python([str(script)], run.env())
    facts = {r["name"]: r for r in run.records() if r["kind"] == "fact"}
    assert (
        facts["counted_step_flop"]["value"] == MLP_STEP_FLOP and facts["counted_step_flop"]["unit"] == "FLOP"
    )
    assert facts["counted_flop_per_token"].get("value") is None
    assert facts["counted_flop_per_token"]["note"] == TOKENS_UNKNOWN


def test_the_model_card_names_the_counted_convention_once():
    from tm_runs import REPO

    from trainmeter_core.model import passport
    from trainmeter_core.runlog import replay

    run_dir = REPO / "tests" / "fixtures" / "golden" / "cpu-measured"
    data = passport.passport_data(replay.final_snapshot(run_dir), {})
    (row,) = [
        line for line in passport.passport_markdown(data).splitlines() if line.startswith("| counted |")
    ]
    # the tiny GPT's counted step: 734,003,200 FLOPs over 1,024 tokens = 716,800 FLOP/token
    assert row == "| counted | 7.168e+05 (counted) |"
