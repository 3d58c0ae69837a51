"""One step per training iteration, and a run under tm is bit-identical to the same run without it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tm_runs import REPO, log_records, only_run, run_tm
from torch_required import require_torch

LOOP = str(REPO / "tests" / "scripts" / "torch_loop.py")
ITERATIONS = 500


def plain(variant: str, out, env) -> None:
    subprocess.run(
        [sys.executable, LOOP, variant, str(ITERATIONS), str(out)], env=env, check=True, timeout=300
    )


@pytest.mark.xdist_group("heavy")
@pytest.mark.parametrize(("variant", "skipped"), [("one", 0), ("two", 0), ("scaler", 50)])
def test_each_iteration_is_one_step_and_numerics_are_unchanged(tm_env, tmp_path, variant, skipped):
    torch = require_torch()
    a, b, t = tmp_path / "plain_a", tmp_path / "plain_b", tmp_path / "under_tm"
    plain(variant, a, tm_env)
    plain(variant, b, tm_env)  # the control: plain against plain
    result = run_tm(["--", sys.executable, LOOP, variant, str(ITERATIONS), str(t)], tm_env, timeout=300)
    assert result.returncode == 0, result.stderr

    runs = [json.loads((p.parent / (p.name + ".json")).read_text()) for p in (a, b, t)]
    assert runs[0] == runs[1], "the control differs: the loop itself is not deterministic"
    assert runs[2]["losses"] == runs[0]["losses"]  # every loss, as float.hex
    assert runs[2]["rng"] == runs[0]["rng"]
    sd_a = torch.load(a.parent / "plain_a.pt")
    sd_t = torch.load(t.parent / "under_tm.pt")
    assert sd_a.keys() == sd_t.keys() and all(torch.equal(sd_a[k], sd_t[k]) for k in sd_a)

    run = only_run(tmp_path / "runs")
    steps = [r for r in log_records(run) if r["kind"] == "step"]
    assert [s["step"] for s in steps] == list(range(1, ITERATIONS + 1))
    assert sum(1 for s in steps if s.get("skipped")) == skipped
    if skipped:
        assert [s["step"] for s in steps if s.get("skipped")] == list(range(10, ITERATIONS + 1, 10))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == ITERATIONS and summary["skipped_steps"] == skipped
    # at the top of summary.json: the counters over the training window (a CPU run has no GPU number, and says why)
    # and what the time goodput does not count went to (at least the start-up before the first step)
    assert summary["training_window"]["util_gpu"]["absent"]
    assert "value" not in summary["training_window"]["util_gpu"]
    assert summary["training_window"]["host_cpu_cores"]["label"] == "training window"
    assert summary["lost_time"]["note"].startswith("lost ")
    assert summary["lost_time"]["seconds"]["startup"] > 0
