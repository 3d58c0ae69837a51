"""The hang's culprit across nodes: three "nodes" (network, UTS and time namespaces, ``netns.py``), one rank each,
``tm -- torchrun`` of the collective probe's DDP loop; rank 2, on node 2 (its monotonic clock two hours off), sleeps
before the all_reduce of step 20. The job hub's hung alert names it, with the stacks of the ranks of all three nodes.
Root only, as test_multinode.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import test_multinode
from test_multinode import Job, job_nodes  # noqa: F401 - job_nodes is the fixture this test uses

pytestmark = [pytest.mark.heavy, pytest.mark.xdist_group("heavy"), pytest.mark.ranks]

SCRIPT = Path(__file__).parents[1] / "agent_scripts" / "ddp_collectives.py"


def test_the_job_hubs_hung_alert_names_the_rank_on_another_node_that_never_entered_the_all_reduce(
    job_nodes,  # noqa: F811 - the fixture imported above
    tmp_path,
    monkeypatch,
):
    monkeypatch.setattr(test_multinode, "SCRIPT", SCRIPT)
    (tmp_path / "tm.toml").write_text("[alerts.hung]\ncollective_floor_s = 6\nclear_after_s = 1\n")
    job = Job(
        tmp_path,
        job_nodes,
        STEPS="24",
        SLEEP_RANK="2",
        SLEEP_STEP="20",
        SLEEP_S="20",
        TM_COLLECTIVE_STALL_S="2",
        PAUSE_S="0.05",
    )
    job.start()
    try:
        codes = job.wait(240)
    finally:
        job.close()
    assert codes == [0, 0, 0], [job.output(k)[-3000:] for k in range(3)]
    hub = job.log(0)
    fired = [r for r in hub if r["kind"] == "alert" and r["rule"] == "hung" and r["state"] == "fired"]
    assert len(fired) == 1, [r["message"] for r in fired]
    (alert,) = fired
    assert alert["subject"] == "rank 2"
    assert alert["message"].startswith("ranks 0, 1 wait in all_reduce #")
    assert "rank 2, alive, never entered it" in alert["message"]
    stacks = alert["attachments"]
    assert sorted(stacks) == ["rank 0 stacks", "rank 1 stacks", "rank 2 stacks"]
    assert "time.sleep(sleep_s)" in stacks["rank 2 stacks"]
