"""Ranks under torchrun: the launcher parent is no trainer, each rank reports its own steps, device and dp.

Two ranks run DDP over gloo on the CPU (``torchrun --standalone``, so no rendezvous port is shared with another test).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from deadline import wait_for
from test_agent import SCRIPTS, kinds


@pytest.mark.xdist_group("heavy")
@pytest.mark.ranks
def test_two_ranks_report_dp_two_and_their_own_steps_and_the_torchrun_parent_stays_out(run, torch):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*command, str(SCRIPTS / "ddp_loop.py")],
        env=run.env(STEPS="5"),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=run.run_dir,
    )
    assert done.returncode == 0, done.stderr
    wait_for(lambda: run.hub.kinds.get("bye", 0) >= 2, what="both ranks' bye")
    ranks = {n: json.loads((run.run_dir / f"rank{n}.json").read_text()) for n in (0, 1)}
    records = run.records()
    hellos = kinds(records, "hello")
    # Only the two trainers said hello: the torchrun parent (and its own children's helpers) stayed dormant.
    assert sorted(h["pid"] for h in hellos) == sorted(r["pid"] for r in ranks.values())
    assert sorted((h["rank"], h["local_rank"], h["world_size"]) for h in hellos) == [(0, 0, 2), (1, 1, 2)]
    for rank, line in ranks.items():
        mine = [r for r in records if r["pid"] == line["pid"]]
        assert all(r.get("rank") == rank for r in mine)
        steps = kinds(mine, "step")
        assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]  # one record per step, no duplicates
        assert all(
            s["step_time_s"] > 0 for s in steps[1:]
        )  # every rank's step times, for straggler detection
        # 2 sequences x 16 tokens on this rank; DDP's process group holds 2 ranks: 64 tokens per step in all.
        assert {(s["tokens"], s["dp"], s["tokens_global"]) for s in steps} == {(32, 2, 64)}
        facts = {f["name"]: f for f in kinds(mine, "fact")}
        assert facts["dp"]["value"] == 2 and "DistributedDataParallel" in facts["dp"]["note"]
        assert facts["world_size"]["value"] == 2
        # what a measured peak must match: float32 parameters, no autocast, OMP_NUM_THREADS=1 (tm_env)
        assert facts["device"]["value"] == {
            "type": "cpu",
            "index": None,
            "uuid": None,
            "dtype": "float32",
            "threads": 1,
        }
        # FLOPs are counted on rank 0 only.
        assert ("counted_flop_per_token" in facts) == (rank == 0)
