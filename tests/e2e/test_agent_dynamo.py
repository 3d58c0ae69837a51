"""Dynamo meets the model probe's forward (``ModelForward``, set on the model): torch.compile of the model, a compiled
function that calls the model, and torch.export.export of the model, strict or not, all work under tm as without it,
give the same losses, and the steps go on being counted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_agent import SCRIPTS, heavy, kinds, plain_env

SCRIPT = str(SCRIPTS / "dynamo_modes.py")
HOOKS = {"next": "function", "backward": "function", "forward": "ModelForward", "step": ["method"]}


@heavy
@pytest.mark.parametrize("mode", ["compile", "function", "export", "export-strict"])
def test_dynamo_traces_the_model_probe_and_the_loop_goes_on_as_without_tm(run, torch, mode):
    """torch.export's non-strict tracing reads ``model.forward.__code__`` (ModelForward hands on its function's
    attributes as a bound method does), and dynamo's guard on a forward set on a module reads its ``__dict__``."""
    plain = subprocess.run(
        [sys.executable, SCRIPT, mode], env=plain_env(), capture_output=True, text=True, timeout=300
    )
    assert plain.returncode == 0, plain.stderr
    without_tm = json.loads(plain.stdout)
    done = run.python([SCRIPT, mode], run.env(), byes=1)
    seen = json.loads(done.stdout)
    assert seen["losses"] == without_tm["losses"]
    assert seen["before"] == HOOKS
    if mode.startswith("export"):
        assert seen["exported"] is True
        assert seen["after"] == HOOKS  # nothing compiled: every probe stays where it was
    records = run.records()
    assert [s["step"] for s in kinds(records, "step")] == list(range(1, 9))
    assert [r["value"] for r in kinds(records, "fact") if r["name"] == "probe.model"] == ["attached"]
