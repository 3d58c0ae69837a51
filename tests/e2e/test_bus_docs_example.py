"""The subscriber of every kind in docs/bus.md, as the page writes it: its code block taken from the page and run
against a real run, whose records it tells apart by ``record.kind`` alone (the public API, nothing internal)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from deadline import wait_for
from tm_runs import REPO, TM

pytestmark = pytest.mark.xdist_group("heavy")

# 20 finite losses, then NaN for 60 steps (6 s): the loss_nan rule sees it on several ticks and fires.
NAN_LOOP = """
import time
from trainmeter_agent import emit

for step in range(1, 81):
    emit(step=step, tokens=1024, train_loss=2.0 / step if step <= 20 else float("nan"))
    time.sleep(0.1)
"""


def docs_block(heading: str) -> str:
    """The first Python block under ``heading`` of docs/bus.md."""
    text = (REPO / "docs" / "bus.md").read_text()
    section = text.split(f"\n{heading}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_every_kind_example_of_docs_bus_md_tells_records_apart_by_their_kind(tm_env, tmp_path):
    example = tmp_path / "every_kind.py"
    example.write_text(docs_block("### Subscribing to every kind"))
    assert "trainmeter_core.api" in example.read_text() and "isinstance" not in example.read_text()
    loop = tmp_path / "nan_loop.py"
    loop.write_text(NAN_LOOP)
    tm = subprocess.Popen(
        [TM, "--no-web", "--", sys.executable, str(loop)],
        env=tm_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        runs = tmp_path / "runs"
        # subscribe(None) follows the latest run: it must have started (its sockets named) first.
        wait_for(lambda: runs.is_dir() and any(runs.glob("*/endpoints.json")), 60, "the run to start")
        done = subprocess.run(
            [sys.executable, str(example)], env=tm_env, capture_output=True, text=True, timeout=120
        )
    finally:
        tm.wait(120)
    assert tm.returncode == 0, tm.stderr.read()
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("alert loss_nan fired: train_loss is nan") for line in lines), lines
    assert "the run ended: exit 0 after 80 steps" in lines
    # The last line: how many records of each kind, by kind.
    seen = dict(part.rsplit(" ", 1) for part in lines[-1].split(", "))
    assert list(seen) == sorted(seen)
    counts = {kind: int(count) for kind, count in seen.items()}
    assert counts["run.end"] == 1 and counts["alert"] >= 1
    assert counts["step"] >= 1 and counts["metric"] >= 1 and counts["tick"] >= 1 and counts["snapshot"] >= 1
