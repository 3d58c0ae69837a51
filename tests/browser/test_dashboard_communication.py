"""The dashboard's communication part in a real browser: each rank's exposed collective wait, data wait, compute and
bus bandwidth, the straggler's row marked and named with its cause; a run with no collective probe says so."""

from __future__ import annotations

import json

import msgspec
from collective_world import RANKS, World
from dashboard_page import GOLDEN, SHOTS, Served

from trainmeter_core.model import records


def straggler_run(run_dir) -> None:
    """A finished run of 4 ranks in an all_reduce; rank 2 computes 200 ms longer from step 60 on."""
    world = World(seed=12)
    logged: list[records.Record] = [
        records.RunStart(t=world.now_s - 1.0, wall=1.7e9, host="n1", run_id=run_dir.name, name="ddp",
                         run_dir=str(run_dir), command=["torchrun"], cwd="/", tm_version="0", python="3.11",
                         platform="linux"),
    ]  # fmt: skip
    logged += world.steps(60)
    world.slow_compute[2] = 0.2
    logged += world.steps(60)
    logged.append(records.Tick(t=world.now_s, host="n1", n=1, interval_s=1.0))
    logged.append(
        records.RunEnd(t=world.now_s + 0.1, host="n1", status=0, reason="exited", exit_code=0, elapsed_s=30.0)
    )
    run_dir.mkdir()
    lines = []
    for seq, record in enumerate(logged, 1):
        record.seq, record.v, record.source = seq, records.SCHEMA_VERSION, record.source or "agent"
        record.wall = record.wall or 1.7e9 + record.t
        lines.append(records.to_log_line(msgspec.to_builtins(record)))
    (run_dir / "events-0001.jsonl").write_bytes(b"".join(lines))
    (run_dir / "meta.json").write_text(json.dumps({"run_id": run_dir.name, "name": "ddp", "host": "n1"}))


def test_the_communication_part_shows_each_rank_and_names_the_straggler(page, tmp_path, capsys):
    run_dir = tmp_path / "20260101T000000Z-n1-ddp"
    straggler_run(run_dir)
    served = Served(run_dir, capsys)
    p = page.page
    try:
        p.goto(served.url)
        p.wait_for_selector("#communication table.ranks tbody tr")
        rows = p.locator("#communication tbody tr")
        assert rows.count() == RANKS
        texts = [rows.nth(i).inner_text() for i in range(RANKS)]
        assert texts[2].startswith("2\tn1 (straggler)\t")
        assert p.locator("#communication tbody tr.straggler").count() == 1
        sub = p.text_content("#communication-ranks .sub")
        assert sub.startswith("the straggler is rank 2 on n1: the others wait ") and sub.endswith(
            "cause: compute"
        )
        heads = p.locator("#communication thead th").all_inner_texts()
        assert heads[:6] == ["rank", "host", "step time", "exposed collective wait", "data wait", "compute"]
        assert heads[6:] == ["bus bandwidth all_reduce ×4"]
        # Every rank's bandwidth is a number in B/s (25 MB per step over its all_reduce's time)
        assert all(text.split("\t")[6].endswith("B/s") for text in texts)
        # The others wait about the 200 ms rank 2 is late; rank 2 waits only the all_reduce itself (20 ms)
        assert texts[0].split("\t")[3].endswith("ms") and texts[2].split("\t")[3] == "20 ms"
        color = p.evaluate("() => getComputedStyle(document.querySelector('tr.straggler td')).color")
        assert color != p.evaluate(
            "() => getComputedStyle(document.querySelector('tr:not(.straggler) td')).color"
        )
        assert not page.exceptions, page.exceptions
        SHOTS.mkdir(parents=True, exist_ok=True)
        p.locator("#communication").screenshot(path=str(SHOTS / "communication.png"))
    finally:
        served.stop()


def test_a_run_without_a_collective_probe_says_so(page, capsys):
    served = Served(GOLDEN / "cpu-measured", capsys)
    p = page.page
    try:
        p.goto(served.url)
        p.wait_for_function("() => document.querySelector('#run-state')?.textContent === 'finished · exit 0'")
        expected = "no collective probe reported: no rank sent a collectives metric record"
        assert p.text_content("#communication-ranks .sub") == expected
        assert p.text_content("#communication-ranks .body") == expected
        assert not page.exceptions, page.exceptions
    finally:
        served.stop()
