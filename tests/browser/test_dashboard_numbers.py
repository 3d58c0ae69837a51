"""A run in a real browser (headless Chromium through Playwright), found by its text: its numbers with their
conventions in both themes at 4.5:1 contrast or better, strings from the training code shown as text, and a
finished run read at a glance. Screenshots go to artifacts/web/ (git-ignored).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dashboard_page import (
    GOLDEN,
    LOOP,
    SHOTS,
    XSS_KEY,
    Served,
    colors,
    contrast,
    find_golden_run,
    loss_points_in_log,
    shown_number,
    tiny_gpt_run,
)
from tm_runs import only_run, run_tm


def test_a_run_renders_its_numbers_with_their_conventions_in_both_themes(page, tm_env, tmp_path, capsys):
    run_dir = find_golden_run() or tiny_gpt_run(tm_env, tmp_path)
    served = Served(run_dir, capsys)
    p = page.page
    try:
        p.goto(served.url)
        p.wait_for_function("() => document.querySelector('#tile-mfu .value')?.textContent.length > 0")
        snapshot = json.loads(p.evaluate("fetch('/api/snapshot').then(r => r.text())"))
        metrics = snapshot["metrics"]
        for key in ("tokens_per_s", "step_time_s", "mfu", "ofu", "goodput", "flop_per_token"):
            # A finished run's MFU tile leads with the training-window average, as its summary line does.
            shown_key = p.get_attribute(f"#tile-{key} .value", "data-metric")
            assert shown_key == ("mfu_avg" if key == "mfu" else key)
            metric = metrics[shown_key]
            shown = p.text_content(f"#tile-{key} .value")
            if metric.get("value") is None and metric.get("low") is None:
                assert shown == "n/a", key
                assert metric["absent"].split("; ")[0] in p.text_content(f"#tile-{key} .line")
                continue
            value = metric["value"] if metric.get("value") is not None else metric["low"]
            if key in ("mfu", "ofu", "goodput"):
                value *= 100  # shown in percent
            # three significant digits: off by at most half a unit of the third, 0.5 % of the value
            assert abs(shown_number(shown.split(" – ")[0]) - value) <= 0.005 * abs(value) + 1e-12, (
                key,
                shown,
            )
        for key in ("mfu", "flop_per_token"):
            convention = metrics[key].get("convention")
            line = p.text_content(f"#tile-{key} .line")
            assert (convention or "range over the conventions") in line
        # The loss chart holds every loss the loop reported (fewer than the 600 points a page asks for).
        expected_points = loss_points_in_log(run_dir)
        assert 0 < expected_points <= 600
        assert p.get_attribute("#chart-loss", "data-points") == str(expected_points)
        # A tooltip names the formula and inputs from the engine's explain.
        p.hover("#tile-mfu .value")
        tooltip = p.text_content("#tooltip")
        assert snapshot["explain"]["mfu_avg"]["formula"] in tooltip
        p.mouse.move(0, 0)  # the screenshots show the page, not the tooltip

        SHOTS.mkdir(parents=True, exist_ok=True)
        light = colors(p)
        p.screenshot(path=str(SHOTS / "light.png"), full_page=True)
        p.click("#theme-toggle")
        p.wait_for_function("() => document.documentElement.dataset.theme === 'dark'")
        dark = colors(p)
        p.screenshot(path=str(SHOTS / "dark.png"), full_page=True)
        assert light["bg"] != dark["bg"]
        for theme in (light, dark):
            assert contrast(theme["text"], theme["bg"]) >= 4.5, theme
            assert contrast(theme["text"], theme["card"]) >= 4.5, theme
            assert contrast(theme["muted"], theme["card"]) >= 4.5, theme

        # One x-axis selector for every chart: each chart's axis label follows it.
        labels = {"step": "step", "tokens": "tokens", "flop": "FLOPs spent (", "wall": "wall time"}
        switched = []
        for axis, label in labels.items():
            button = p.locator(f"#x-axis button[data-axis={axis}]")
            if button.is_disabled():
                continue
            button.click()
            p.wait_for_function(
                """(axis) => { const c = [...document.querySelectorAll('.chart')];
                   return c.length > 0 && c.every(e => e.dataset.xAxis === axis); }""",
                arg=axis,
            )
            shown = p.eval_on_selector_all(".chart .x-label", "els => els.map(e => e.textContent)")
            assert shown and all(text.startswith(label) for text in shown), (axis, shown)
            switched.append(axis)
        assert "tokens" in switched and "wall" in switched  # every run knows its tokens and its wall time
        assert page.errors == []
    finally:
        served.stop()


def test_strings_from_the_training_code_are_shown_as_text(page, tm_env, tmp_path, capsys):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    result = run_tm(["--no-web", str(script), str(tmp_path / "stop"), "30", XSS_KEY, "</script>"], tm_env)
    assert result.returncode == 0, result.stderr
    served = Served(only_run(Path(tm_env["TM_RUNS_DIR"])), capsys)
    p = page.page
    try:
        p.goto(served.url)
        p.get_by_text(XSS_KEY, exact=True).first.wait_for()  # the custom series' chart title, as literal text
        p.click("#details summary")
        assert "</script>" in p.text_content("#run-command")
        assert p.get_by_text("</script>").count() >= 1
        assert p.locator("img[src=x]").count() == 0
        assert page.dialogs == []
        assert page.errors == []
    finally:
        served.stop()


def test_a_finished_run_reads_at_a_glance_its_summary_mfu_its_time_split_and_its_details(page, capsys):
    run_dir = GOLDEN / "cpu-measured"
    from trainmeter_core.run.summary import summary_line
    from trainmeter_core.runlog.replay import final_snapshot

    summary = json.loads((run_dir / "summary.json").read_text())
    line = summary_line(run_dir, summary, final_snapshot(run_dir))
    served = Served(run_dir, capsys)
    p = page.page
    try:
        p.goto(served.url)
        p.wait_for_function("() => document.querySelector('#run-state')?.textContent === 'finished · exit 0'")
        p.wait_for_function("() => document.querySelector('#tile-mfu .value')?.dataset.metric === 'mfu_avg'")
        assert p.text_content("#conn") == ""
        # The MFU a finished run leads with is its summary's: the training-window average, window named.
        summary_mfu = float(re.search(r"MFU ([\d.]+)% \(titan", line).group(1))
        tile = p.text_content("#tile-mfu .value")
        assert abs(float(tile.rstrip("%")) - summary_mfu) < 0.05, (tile, line)
        mfu_line = p.text_content("#tile-mfu .line")
        # window_end_t − window_start_t = 4496.128541244 − 4493.300415304 = 2.83 s
        assert "average over the training window (" in mfu_line and ", 2.83 s), as in the summary" in mfu_line
        assert (
            "latest EMA 11.9%" in mfu_line
        )  # the EMA at the end (0.119257) is said beside it, not in its place

        # The time split, in the badput buckets' words: productive step time first; what it cannot see is said plainly.
        legend = p.text_content("#split-card .legend")
        assert legend.startswith("compute (productive) 2.82 s") and "start-up and imports 4.47 s" in legend
        caption = p.text_content("#split-card .sub")
        assert "Not measured, so counted as compute: data wait (no torch DataLoader iterated yet)" in caption
        assert "stays in compute" not in caption
        assert "data wait" not in p.text_content("#split-none")  # unmeasured is not "no time"
        assert "hangs" in p.text_content("#split-none")  # a bucket with no time is named once, below
        assert p.query_selector("#attempt-bars") is None  # a run started once: its one bar is the run's
        named = p.evaluate(
            """async () => { const panels = await import('/static/panels.js');
                return panels.splitName('checkpoint_load'); }"""
        )
        assert named == "checkpoint load"

        # Run details: facts read as words and rounded numbers, never raw JSON; the CPU's measured peak is shown.
        p.click("#details summary")
        p.wait_for_selector("#facts")
        values = p.eval_on_selector_all("#facts tr td:nth-child(2)", "cells => cells.map(c => c.textContent)")
        assert values and not [v for v in values if "{" in v or re.search(r"\d\.\d{5,}", v)], values
        facts = dict(
            zip(
                p.eval_on_selector_all("#facts tr td:nth-child(1)", "cells => cells.map(c => c.textContent)"),
                values,
                strict=True,
            )
        )
        assert facts["device"] == "cpu"
        # 85,570,972,453 FLOP/s = 85.6 GFLOP/s
        assert facts["peak (vm/cpu)"] == "85.6 GFLOP/s (measured, cpu)"
        hardware = p.text_content("#hardware")
        assert "vm/cpu, rank 0" in hardware and "85.6 GFLOP/s (measured)" in hardware
        p.mouse.move(0, 0)
        SHOTS.mkdir(parents=True, exist_ok=True)
        p.locator("#details").screenshot(path=str(SHOTS / "finished-details.png"))
        p.locator("#tiles").screenshot(path=str(SHOTS / "finished-tiles.png"))
        p.locator("#node").screenshot(path=str(SHOTS / "finished-node.png"))
        assert page.errors == []
    finally:
        served.stop()
