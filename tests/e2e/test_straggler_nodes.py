"""The straggler across nodes: two "nodes" (network, UTS and time namespaces, ``netns.py``) of two ranks each,
``tm -- torchrun`` of the straggler's DDP loop, and of its FSDP2 loop (``fully_shard``); rank 3, on node 1 (its
monotonic clock an hour off), slowed 200 ms a step in its DataLoader (DDP) or in its forward (FSDP2). The job hub's
run names it, with its cause (data wait, compute), within 50 steps, and its straggler alert says so, naming its host.
Root only, as test_multinode.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from netns import Nodes, require_namespaces
from test_multinode import Job
from test_straggler_e2e import straggler_over_time
from tm_runs import log_records
from torch_required import require_torch

pytestmark = [pytest.mark.heavy, pytest.mark.xdist_group("heavy"), pytest.mark.ranks]

SCRIPTS = Path(__file__).parents[1] / "agent_scripts"
SLOW = 3  # node 1's second rank


@pytest.fixture
def two_nodes():
    require_namespaces()
    require_torch()
    nodes = Nodes(2)
    yield nodes
    nodes.close()


class TwoByTwo(Job):
    per_node = 2


@pytest.mark.parametrize(
    ("script", "where", "cause"),
    [("ddp_straggler.py", "data", "data wait"), ("fsdp2_loop.py", "forward", "compute")],
    ids=["ddp-dataloader", "fsdp2-forward"],
)
def test_the_job_hub_names_the_rank_on_the_second_node_and_its_cause(
    two_nodes, tmp_path, monkeypatch, script, where, cause
):
    monkeypatch.setattr("test_multinode.SCRIPT", SCRIPTS / script)
    job = TwoByTwo(tmp_path, two_nodes, STEPS="60", SLOW_RANK=str(SLOW), SLOW_WHERE=where)
    job.start()
    try:
        codes = job.wait(240)
    finally:
        job.close()
    assert codes == [0, 0], [job.output(k)[-3000:] for k in range(2)]
    named_at, named, last = straggler_over_time(job.run_dir(0))
    assert named == SLOW and named_at is not None and named_at <= 50, (named_at, named)
    assert last.metrics["straggler_rank"].value == SLOW
    assert f"cause: {cause}" in last.explain["straggler_rank"].note
    assert last.metrics["straggler_wait_s"].label == cause
    waits = {r.rank: r.collective_wait_s for r in last.ranks}
    assert sorted(waits) == [0, 1, 2, 3] and min(waits, key=waits.get) == SLOW
    fired = [
        a
        for a in log_records(job.run_dir(0))
        if a["kind"] == "alert" and a["rule"] == "straggler" and a["state"] == "fired"
    ]
    assert fired and fired[0]["subject"] == f"rank {SLOW}", fired
    assert fired[0]["message"].startswith(f"rank {SLOW} on node1 makes the other ranks wait"), fired[0][
        "message"
    ]
    assert fired[0]["message"].endswith(f"cause: {cause}")
