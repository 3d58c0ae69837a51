"""What a report file shows without scripts (``trainmeter_web.report_static``): the headline numbers in the summary
line's words, the alerts, the passport, a footer that links nothing; and no page links what needs a server."""

from __future__ import annotations

import re

import pytest

from trainmeter_core.model import records
from trainmeter_core.run.summary import headline
from trainmeter_web import bundle
from trainmeter_web.report_static import STATIC_CLASS, alerts_html, badput_html, static_view, with_static_view

WALL = 1_796_000_000.0  # 2026-11-30 00:53:20 UTC
HOSTILE = "<img src=x onerror=alert(1)>"


def finished_snapshot() -> records.Snapshot:
    return records.Snapshot(
        tick=9,
        final=True,
        state="finished",
        elapsed_s=7.44,
        steps=70,
        tokens=143360,
        metrics={
            "tokens": records.MetricValue(value=143360.0, unit="tokens"),
            "spent_flop": records.MetricValue(value=1.4336e11, unit="FLOP", convention="declared"),
            "mfu_avg": records.MetricValue(value=0.0421, convention="titan", label="declared"),
        },
        series={
            "train_loss": records.SeriesPoint(
                canonical="train_loss", raw_key="loss", value=0.125, origin="emit"
            )
        },
    )


def carried(alerts: dict | None = None, passport: dict | None = None) -> dict:
    return {
        "kind": "report",
        "tm_version": "0.1.0",
        "written_wall": WALL,
        "points": 600,
        "doc": {"status": {"state": "finished", "exit_status": 0}, "alerts": alerts or {}},
        "run": {"name": "gpt"},
        "passport": passport or {"markdown": "# Run passport: gpt\n\n- steps: 70\n"},
    }


def test_the_headline_is_the_state_the_steps_and_the_summary_lines_numbers():
    snapshot = finished_snapshot()
    view = static_view(snapshot, carried())
    line = re.search(r'<p id="static-headline">(.*?)</p>', view).group(1)
    # The same phrases as the summary line tm prints at the end (summary.headline), after the state and the steps.
    assert line.split(" · ") == ["finished in 7.4 s", "exit 0", "70 steps", *headline(snapshot)]
    tokens, flops, mfu, loss = headline(snapshot)
    # 143360 tokens to three digits; 1.4336e11 FLOP; MFU 0.0421 as a percentage; the latest loss
    assert (tokens, loss) == ("tokens 1.43e+05", "train_loss 0.125")
    assert flops.startswith("FLOPs 1.43e+11 FLOP (") and mfu.startswith("MFU 4.21% (")
    assert '<pre id="static-passport"># Run passport: gpt\n\n- steps: 70\n</pre>' in view


def test_alerts_read_as_the_dashboard_lists_them_newest_first_and_their_strings_stay_text():
    alerts = {
        "loss_nan": {"rule": "loss_nan", "state": "fired", "severity": "critical", "message": "train_loss is nan",
                     "fired_wall": WALL + 60},
        "hung": {"rule": "hung", "state": "cleared", "severity": "warning", "message": HOSTILE, "subject": "rank 0",
                 "fired_wall": WALL, "cleared_wall": WALL + 30},
    }  # fmt: skip
    shown = alerts_html(alerts.values(), run_over=True)
    assert shown.index("loss_nan") < shown.index("hung")
    assert "still firing when the run ended; fired 2026-11-30 00:54:20 UTC" in shown
    assert "cleared 2026-11-30 00:53:50 UTC; fired 2026-11-30 00:53:20 UTC" in shown
    assert HOSTILE not in shown and "&lt;img src=x onerror=alert(1)&gt;" in shown
    assert alerts_html([], run_over=True) == '<p class="empty">No alert fired.</p>'


def test_a_run_without_a_passport_says_why():
    view = static_view(finished_snapshot(), carried(passport={"absent": "the run has no snapshot"}))
    assert '<p class="empty">the run has no snapshot</p>' in view


def test_the_page_of_a_report_shows_the_static_view_until_scripts_run_and_its_footer_links_nothing():
    page = with_static_view(bundle.static_files()["index.html"], finished_snapshot(), carried())
    assert f'<html lang="en" data-theme="light" class="{STATIC_CLASS}">' in page
    assert page.index('<section id="static-view"') < page.index('<section id="progress"')
    footer = re.search(r"<footer>(.*?)</footer>", page, re.S).group(1)
    assert footer == (
        "trainmeter report of gpt · written 2026-11-30 00:53:20 UTC by tm 0.1.0 from the run&#x27;s log · charts hold "
        "up to 600 points a series"
    )
    html = bundle.standalone_html(
        "index.html", "report.js", carried(), {**bundle.static_files(), "index.html": page}
    )
    without_scripts = re.sub(r"<(script|style)\b[^>]*>.*?</\1>", "", html, flags=re.S)
    links = re.findall(r'\b(?:href|src|action)="([^"]*)"', without_scripts)
    assert links and all(link.startswith("data:") for link in links), links


def test_the_style_hides_every_part_the_scripts_draw_while_the_static_view_shows():
    css = bundle.static_files()["style.css"]
    assert (
        "html.static main > :not(#static-view),\nhtml.static header > :not(.brand) {\n  display: none;" in css
    )


@pytest.mark.parametrize(
    "link", ['<a href="/api/snapshot">JSON API</a>', '<img src="https://example.com/x.png">']
)
def test_a_page_that_links_what_needs_a_server_cannot_become_a_file(link):
    files = bundle.static_files()
    files["index.html"] = files["index.html"].replace("</footer>", f"{link}</footer>")
    with pytest.raises(bundle.BundleError, match="needs a server: a file cannot follow it"):
        bundle.standalone_html("index.html", "report.js", carried(), files)


def test_the_static_view_names_the_straggler_and_each_rank_s_communication_its_strings_as_text():
    snapshot = finished_snapshot()
    snapshot.metrics["straggler_rank"] = records.MetricValue(value=2.0, label=HOSTILE)
    snapshot.metrics["straggler_wait_s"] = records.MetricValue(value=0.199, unit="s", label="compute")
    snapshot.metrics["bus_bandwidth_bps.all_reduce.4.rank2"] = records.MetricValue(value=1.87e9, unit="B/s")
    snapshot.ranks = [
        records.RankStat(rank=2, host="n1", steps=70, step_time_s=0.326, collective_wait_s=0.02,
                         data_wait_s=0.0045, compute_s=0.301, collective_steps=70),
        records.RankStat(rank=0, host="n1", steps=70, step_time_s=0.326),
    ]  # fmt: skip
    view = static_view(snapshot, carried())
    assert "the straggler is rank 2 on &lt;img src=x onerror=alert(1)&gt;: the others wait 199 ms" in view
    assert "cause: compute" in view and HOSTILE not in view
    # one row: rank 0 reported no collective wait
    assert "<td>2</td><td>n1</td><td>326 ms</td><td>20 ms</td><td>4.5 ms</td><td>301 ms</td>" in view
    assert "<td>all_reduce ×4 1.87 GB/s</td>" in view
    assert view.count("<tr><td>") == 1


def test_the_static_view_says_why_no_straggler_is_named():
    snapshot = finished_snapshot()
    why = "no collective probe reported: no rank sent a collectives metric record"
    snapshot.metrics["straggler_rank"] = records.MetricValue(absent=why)
    view = static_view(snapshot, carried())
    assert f'<div class="card" id="static-communication"><p>{why}</p></div>' in view


def test_the_static_view_says_where_the_time_went_for_the_run_and_each_attempt():
    split = {
        "compute": 18.0,
        "startup": 20.0,
        "checkpoint": 0.5,
        "down": 30.0,
        "after_last_step": 2.0,
        "hang": 0.0,
    }
    shares = [
        {"compute": 9.0, "startup": 10.0, "checkpoint": 0.5, "down": 0.0, "after_last_step": 0.5},
        {"compute": 9.0, "startup": 10.0, "checkpoint": 0.0, "down": 30.0, "after_last_step": 1.5},
    ]
    snapshot = records.Snapshot(
        tick=3,
        phases_s=split,
        attempts=[
            records.AttemptStat(attempt=i + 1, start_t=0.0, start_wall=0.0, end="lost", phases_s=share)
            for i, share in enumerate(shares)
        ],
    )
    table = badput_html(snapshot)
    rows = re.findall(r'<tr data-part="(\w+)"><td>([^<]+)</td>((?:<td>[^<]+</td>)+)</tr>', table)
    # the buckets with time in them, in the engine's order; a bucket with none (the hang) is left out
    assert [(name, title) for name, title, _ in rows] == [
        ("compute", "productive step time"), ("startup", "start-up and imports"), ("checkpoint", "checkpoint save"),
        ("down", "down between attempts"), ("after_last_step", "after the last step"),
    ]  # fmt: skip
    assert rows[3][2] == "<td>30.0 s</td><td>0.0 s</td><td>30.0 s</td>"  # the run, attempt 1, attempt 2
    assert "<th>attempt 2</th>" in table
    assert badput_html(records.Snapshot(tick=1)) == ""  # no split, no table
