"""Which module is the model when the training step calls the model's parts one by one (issue 41, point 4): the one
whose parameters the optimizer steps, not the first part called (tests/agent_scripts/split_forward.py under tm).
"""

from __future__ import annotations

import json

import pytest
from test_agent import SCRIPTS
from test_agent_trackers import require
from tm_runs import log_records, only_run, run_tm

heavy = pytest.mark.xdist_group("heavy")
SPLIT = str(SCRIPTS / "split_forward.py")

# Embedding(50, 16) + Linear(16, 50): N = 50 x 16 (800, the table) + 16 x 50 + 50 (850, the head's weight and bias)
# = 1,650; E = 800, the table used only as a lookup; hf = 6(N - E) = 6 x 850 = 5,100 FLOP per token.
PARAMS, EMBEDDING_PARAMS, HF_FLOP_PER_TOKEN = 1650, 800, 5100.0


def split_run(tm_env, tmp_path, mode: str) -> tuple[dict, dict, str]:
    """The snapshot, the last fact of each name in the log, and what tm printed, of one split_forward.py run."""
    result = run_tm(["--no-web", SPLIT, mode], tm_env, timeout=240, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(run_tm(["view", "--json"], tm_env).stdout)
    logged = log_records(only_run(tmp_path / "runs"))
    facts = {r["name"]: r for r in logged if r["kind"] == "fact"}
    return snapshot, facts, result.stdout + result.stderr


@heavy
@pytest.mark.parametrize("mode", ["lightning", "loop", "parts"])
def test_a_step_that_calls_the_embedding_and_the_head_gives_the_models_hf_flops_per_token(
    tm_env, tmp_path, torch, mode
):
    if mode == "lightning":
        require("lightning")
    snapshot, facts, printed = split_run(tm_env, tmp_path, mode)
    assert (facts["params"]["value"], facts["embedding_params"]["value"]) == (PARAMS, EMBEDDING_PARAMS)
    hf = snapshot["metrics"]["flop_per_token.hf"]
    assert hf["value"] == HF_FLOP_PER_TOKEN, hf
    assert "FLOPs 0.00" not in printed and "MFU 0.00%" not in printed
    # The embedding, fed the token ids, still counts them: 4 sequences of 8 per step.
    steps = [r for r in log_records(only_run(tmp_path / "runs")) if r["kind"] == "step"]
    assert {(s.get("micro_batches"), s.get("tokens")) for s in steps} == {(1, 32)}
    note = facts["params"]["note"]
    if mode == "parts":
        assert "the Embedding called first and the 2 parameter tensors the optimizer steps outside it" in note
    else:
        model = "LitTwoParts" if mode == "lightning" else "TwoParts"
        assert f"the model is {model}, which holds every parameter the optimizer steps" in note
