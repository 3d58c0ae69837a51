"""The loss chart in a real browser: it follows the bulk of a loss that starts high, marks what it clips, and
shows where the loss stopped being a number.
"""

from __future__ import annotations

import re

from dashboard_page import (
    SHOTS,
    LiveTm,
    Served,
)
from tm_runs import only_run

# A loss that starts at 43 and settles near 2 (41·e^-(step-1)/2 + 2, with a ripple), then is not a number from step 111
# on: the first steps would flatten a chart scaled to them, and a NaN must not simply end the line.
LOSS_LOOP = """
import math, os, sys, time
from trainmeter_agent import emit

stop = sys.argv[1]
step = 0
while not os.path.exists(stop):
    step += 1
    loss = 41.0 * math.exp(-(step - 1) / 2) + 2.0 + 0.05 * math.sin(step) if step <= 110 else float("nan")
    emit(step=step, tokens=2048, train_loss=loss)
    time.sleep(0.02)
"""


def chart_range(p, chart: str) -> tuple[float, float]:
    low, high = p.get_attribute(chart, "data-y-range").split(",")
    return float(low), float(high)


def test_the_loss_chart_follows_the_bulk_marks_what_it_clips_and_where_the_loss_became_nan(
    page, web_env, tmp_path, capsys
):
    tm = LiveTm(dict(web_env), tmp_path, [], loop=LOSS_LOOP)
    p = page.page
    try:
        p.goto(tm.url)
        # Live, the stream may bring the steps around 111 as one merged point, which sits at its newest step.
        p.wait_for_function(
            "() => ((document.querySelector('#chart-loss') || {dataset: {}}).dataset.nan || '') !== ''"
        )
        assert 111 <= float(p.get_attribute("#chart-loss", "data-nan")) < 400
        notes = p.locator("#chart-loss .chart-notes")
        # Where (on the chart's axis) and when (wall time, from the wall-time history) the loss stopped being a number.
        p.wait_for_function(
            "() => document.querySelector('#chart-loss .chart-notes')?.textContent.includes('since')"
        )
        text = notes.text_content()
        assert re.search(r"train loss is not a number from step \d+ on, since \S.*\(.*marked NaN\)", text), (
            text
        )
        # The first losses (43, 26.9, 17.1, ...) lie far above the bulk (about 2): the y axis follows the bulk, and
        # says how many points it left above, up to the first loss.
        assert int(p.get_attribute("#chart-loss", "data-clipped")) >= 5
        low, high = chart_range(p, "#chart-loss")
        assert 1.5 < low < 2.0 < 2.1 < high < 5.0, (low, high)
        assert "above this range (up to 43), marked ▲" in notes.text_content()
        assert p.text_content("#chart-loss .now") == "NaN"
        assert p.text_content("#conn") == "live"  # running: the page follows it live
        SHOTS.mkdir(parents=True, exist_ok=True)
        p.mouse.move(0, 0)
        p.screenshot(path=str(SHOTS / "live.png"), full_page=True)
        # The log scale shows every value, the first loss included.
        p.click("#chart-loss .scale-toggle")
        p.wait_for_function("() => document.querySelector('#chart-loss')?.dataset.scale === 'log'")
        assert p.get_attribute("#chart-loss", "data-clipped") == "0"
        low, high = chart_range(p, "#chart-loss")
        assert low < 2.0 and high > 43.0
        p.locator("#chart-loss").screenshot(path=str(SHOTS / "loss-log.png"))
        p.click("#chart-loss .scale-toggle")
        p.wait_for_function("() => document.querySelector('#chart-loss')?.dataset.scale === 'linear'")

        assert tm.finish() == 0
        p.wait_for_function("() => document.querySelector('#run-state')?.textContent.startsWith('finished')")
        assert p.text_content("#conn") == ""  # a finished run is never "live"
        served = Served(only_run(tm.runs), capsys)
        try:
            p.goto(served.url)
            p.wait_for_function(
                "() => (document.querySelector('#chart-loss') || {dataset: {}}).dataset.nan === '111'"
            )
            p.wait_for_function(
                "() => document.querySelector('#run-state')?.textContent === 'finished · exit 0'"
            )
            assert p.text_content("#conn") == ""
            p.wait_for_function(
                "() => document.querySelector('#chart-loss .chart-notes')?.textContent.includes('since')"
            )
            # From the log every point is raw: the stretch starts exactly at step 111, and its values are counted.
            steps = int(p.text_content("#progress-stats [data-explain=steps]"))
            text = p.text_content("#chart-loss .chart-notes")
            assert re.search(
                rf"train loss is not a number from step 111 on, since \S.* \({steps - 110} values, marked NaN\)",
                text,
            ), text
            # The NaN loss fired loss_nan, and the run ended with it open: said so, not "firing".
            alert = p.text_content("#alert-list .alert.critical")
            assert "loss_nan" in alert and "still firing when the run ended" in alert, alert
            p.mouse.move(0, 0)
            p.screenshot(path=str(SHOTS / "finished.png"), full_page=True)
        finally:
            served.stop()
        assert page.exceptions == []
    finally:
        tm.kill()
