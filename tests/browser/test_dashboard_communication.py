"""The dashboard's communication part in a real browser: each rank's exposed collective wait, data wait, compute and
bus bandwidth, the straggler's row marked and named with its cause; a run with no collective probe says so."""

from __future__ import annotations

from collective_world import RANKS, straggler_run
from dashboard_page import GOLDEN, SHOTS, Served


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
