"""The dashboard's job part in a real browser: a job's run shows each node, the straggler and the lost node; a
single-node run has no job part.
"""

from __future__ import annotations

import json

import msgspec
from dashboard_page import (
    GOLDEN,
    SHOTS,
    Served,
)

from trainmeter_core.model import records

# --------------------------------------------------------------------------------------------------------------------
# The job part (docs/multinode.md): a job's run, as its job hub wrote it (its clock and node records before a node's
# own), replayed by tm view; one row per node, the straggler named, a lost node marked. A single-node run has none.

AHEAD_S = {"node0": 0.0, "node1": 1000.0, "node2": 2000.0}
JOB = records.JobPlace(
    id="torchrun-exp7", node_rank=0, nnodes=3, hub="10.0.0.1:29401", found_by="torchrun flags"
)


def job_run(run_dir) -> None:
    """A finished job of three nodes: node 2 reports every step 0.25 s late, then falls silent and is lost."""
    logged: list[records.Record] = [
        records.RunStart(
            t=100.0,
            wall=1.7e9,
            host="node0",
            run_id=run_dir.name,
            name="job",
            run_dir=str(run_dir),
            command=["torchrun"],
            cwd="/",
            tm_version="0",
            python="3.11",
            platform="linux",
            job=JOB,
        )
    ]
    for k, host in enumerate(AHEAD_S):
        if k:
            logged.append(
                records.ClockMap(
                    t=100.5,
                    host="node0",
                    node_rank=k,
                    node_host=host,
                    offset_s=-AHEAD_S[host],
                    basis="round_trip",
                    uncertainty_s=2e-4,
                    rtt_s=4e-4,
                )
            )
            logged.append(
                records.NodeEvent(t=100.5, host="node0", node_rank=k, node_host=host, event="joined")
            )
        logged.append(
            records.Fact(
                t=101.0 + AHEAD_S[host],
                host=host,
                rank=k,
                name="device",
                value={"type": "cpu", "index": None, "uuid": None},
                provenance="detected",
                origin="agent:model",
            )
        )
    for step in range(1, 21):
        for k, host in enumerate(AHEAD_S):
            late = {"node0": 0.0, "node1": 0.01, "node2": 0.25}[host]
            logged.append(
                records.Step(
                    t=110.0 + step + late + AHEAD_S[host],
                    wall=1.7e9 + step,
                    host=host,
                    rank=k,
                    step=step,
                    step_time_s=1.0,
                    tokens=1024,
                )
            )
    logged.append(
        records.NodeEvent(
            t=137.0,
            host="node0",
            node_rank=2,
            node_host="node2",
            event="lost",
            last_kind="step",
            last_t=130.25,
            silent_s=6.75,
            through=44,
        )
    )
    logged.append(records.Tick(t=140.0, wall=1.7e9 + 40, host="node0", n=1, interval_s=1.0))
    logged.append(
        records.RunEnd(t=141.0, wall=1.7e9 + 41, host="node0", status=0, reason="exited", elapsed_s=41.0)
    )
    run_dir.mkdir()
    lines = []
    for seq, record in enumerate(logged, 1):
        record.seq, record.v, record.source = seq, records.SCHEMA_VERSION, record.source or "launcher"
        lines.append(records.to_log_line(msgspec.to_builtins(record)))
    (run_dir / "events-0001.jsonl").write_bytes(b"".join(lines))
    (run_dir / "meta.json").write_text(json.dumps({"run_id": run_dir.name, "name": "job", "host": "node0"}))


def test_a_jobs_run_shows_each_node_the_straggler_and_the_lost_node(page, tmp_path, capsys):
    run_dir = tmp_path / "20260101T000000Z-node0-job"
    job_run(run_dir)
    served = Served(run_dir, capsys)
    p = page.page
    try:
        p.goto(served.url)
        p.wait_for_selector("#job table.nodes tbody tr")
        assert p.is_visible("#job")
        rows = p.locator("#job tbody tr")
        assert rows.count() == 3
        texts = [rows.nth(i).inner_text() for i in range(3)]
        assert texts[0].startswith("0\tnode0\t") and "node2 (straggler)" in texts[2]
        # node 2 was lost at t 137 (hub clock), its last step at 130.25: silent 6.75 s when the hub said so, and 10.75 s
        # at the final snapshot (run.end at 141).
        assert "lost: silent for 10.8 s, last sent a step record" in texts[2]
        assert p.locator("#job tbody tr.lost").count() == 1
        assert "the straggler is node2" in p.text_content("#job-nodes .sub")
        assert "Job torchrun-exp7: 3 of 3 nodes seen" in p.text_content("#job-sub")
        color = p.evaluate("() => getComputedStyle(document.querySelector('tr.lost .node-state')).color")
        bad = p.evaluate("() => getComputedStyle(document.documentElement).getPropertyValue('--bad').trim()")
        assert color != p.evaluate(
            "() => getComputedStyle(document.querySelector('tr:not(.lost) .node-state')).color"
        )
        assert bad
        assert not page.exceptions, page.exceptions
        SHOTS.mkdir(parents=True, exist_ok=True)
        p.locator("#job").screenshot(path=str(SHOTS / "job-nodes.png"))
    finally:
        served.stop()


def test_a_single_node_run_has_no_job_part(page, capsys):
    served = Served(GOLDEN / "cpu-measured", capsys)
    p = page.page
    try:
        p.goto(served.url)
        p.wait_for_function("() => document.querySelector('#run-state')?.textContent === 'finished · exit 0'")
        assert not p.is_visible("#job")
    finally:
        served.stop()
