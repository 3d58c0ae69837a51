"""``tm tail`` of a finished run whose log holds blocks: ``--kind step`` prints each step once, in order, as the same
JSON line it printed when every step was its own record; ``--kind block`` prints the blocks as they are."""

from __future__ import annotations

import json
import os

from blocks import blockify, log_line, training_run
from tm_runs import run_tm


def test_tm_tail_of_a_finished_block_log_prints_its_steps_as_the_log_of_rows_does(tmp_path):
    rows = training_run(120, nan_at=3)
    blocked = blockify(rows, at_most=30)
    for name, log in (("blocks", blocked), ("rows", rows)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "events-0001.jsonl").write_bytes(b"".join(log_line(r) for r in log))
        (tmp_path / name / "meta.json").write_text(json.dumps({"name": name}))
    env = {**os.environ, "TM_RUNS_DIR": str(tmp_path)}
    printed = {}
    for name in ("blocks", "rows"):
        result = run_tm(["tail", str(tmp_path / name), "--kind", "step", "--kind", "metric"], env)
        assert result.returncode == 0 and result.stderr == ""
        printed[name] = result.stdout.splitlines()
    assert printed["blocks"] == printed["rows"]
    steps = [json.loads(line) for line in printed["blocks"] if json.loads(line)["kind"] == "step"]
    assert [s["step"] for s in steps] == list(range(1, 121))
    assert [s["seq"] for s in steps] == [r.seq for r in rows if r.kind == "step"]
    whole = run_tm(["tail", str(tmp_path / "blocks"), "--kind", "block"], env)
    kinds = {json.loads(line)["kind"] for line in whole.stdout.splitlines()}
    assert whole.returncode == 0 and kinds == {"block"}
    assert len(whole.stdout.splitlines()) == sum(1 for b in blocked if b.kind == "block")
