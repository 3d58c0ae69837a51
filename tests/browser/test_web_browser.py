"""The dashboard in a real browser (headless Chromium through Playwright): what a person sees, found by its text.

A run renders with its numbers and conventions, both themes read at 4.5:1 or better, a live run updates without a
reload and reconnects by itself after its web process is killed, strings from the training code stay text, and a
non-loopback dashboard wants its token, and a job's run shows its nodes. Screenshots go to artifacts/web/ (git-ignored).
"""

from __future__ import annotations

import http.client
import importlib.metadata as md
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import msgspec
import pytest
from deadline import wait_for
from test_engine_attempts import Log
from tm_runs import REPO, TM, log_records, only_run, run_tm
from torch_required import require_torch

from trainmeter_core.model import records as rec

pytestmark = [pytest.mark.heavy, pytest.mark.xdist_group("heavy")]

SHOTS = REPO / "artifacts" / "web"
XSS_KEY = "<img src=x onerror=alert(1)>"
GOLDEN = REPO / "tests" / "fixtures" / "golden"

# The series key is read from the command line, so the script itself holds no markup-looking text.
LOOP = """
import os, sys, time
from trainmeter_agent import emit

stop, steps, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
step = 0
while not os.path.exists(stop) and (steps == 0 or step < steps):
    step += 1
    emit(step=step, tokens=2048, train_loss=4.0 / step)
    emit(**{key: float(step)})
    time.sleep(0.05)
"""


class Page:
    """A fresh page that records dialogs and script errors, closed after the test."""

    def __init__(self, browser) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.exceptions: list[str] = []  # uncaught in the page's scripts
        self.errors: list[str] = []  # anything the console calls an error (CSP refusals included)
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on(
            "pageerror", lambda exc: (self.exceptions.append(str(exc)), self.errors.append(str(exc)))
        )
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def page(browser):
    opened = Page(browser)
    yield opened
    opened.close()


@pytest.fixture
def web_env(tm_env, tmp_path):
    """tm's environment, with the ``web`` entry point visible even before the checkout was reinstalled."""
    names = {ep.name for ep in md.entry_points(group="trainmeter")}
    if "web" not in names:
        info = tmp_path / "ep" / "trainmeter_web_test-0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trainmeter-web-test\nVersion: 0\n")
        (info / "entry_points.txt").write_text("[trainmeter]\nweb = trainmeter_web.plugin\n")
        tm_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(info.parent), tm_env.get("PYTHONPATH", "")) if p
        )
    return tm_env


class Served:
    """``tm view``'s server for a finished run, in a thread of this test."""

    def __init__(self, run_dir: Path, capsys, host: str = "127.0.0.1") -> None:
        from trainmeter_web import view

        self.stopping = threading.Event()
        self.thread = threading.Thread(target=view.serve, args=(run_dir, host, 0, self.stopping), daemon=True)
        self.thread.start()
        seen: list[str] = []

        def url():
            seen.append(capsys.readouterr().err)
            return re.search(r"dashboard (http://\S+)", "".join(seen))

        self.url = wait_for(url, what="the dashboard's start line").group(1)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)


class LiveTm:
    """``tm`` running the loop above until its stop file appears; stderr read as it comes."""

    def __init__(self, env: dict, tmp_path: Path, args: list[str], steps: int = 0, loop: str = LOOP) -> None:
        script = tmp_path / "loop.py"
        script.write_text(loop)
        self.stop_file = tmp_path / "stop"
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [TM, "--port", "0", *args, str(script), str(self.stop_file), str(steps), XSS_KEY, "</script>"],
            env=env,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        self.url = wait_for(self._url, what="tm's dashboard line")
        self.runs = Path(env["TM_RUNS_DIR"])

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def _url(self) -> str | None:
        for line in self.lines:
            match = re.search(r"dashboard (http://\S+)", line)
            if match:
                return match.group(1)
        return None

    def finish(self) -> int:
        self.stop_file.touch()
        return self.proc.wait(60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def luminance(css: str) -> float:
    r, g, b = (int(v) / 255 for v in re.findall(r"\d+", css)[:3])
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(fg: str, bg: str) -> float:
    hi, lo = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def colors(p) -> dict[str, str]:
    return p.evaluate(
        """() => {
          const s = (sel, prop) => getComputedStyle(document.querySelector(sel))[prop];
          return {bg: s('body', 'backgroundColor'), text: s('body', 'color'), card: s('.card', 'backgroundColor'),
                  muted: s('.tile .line', 'color')};
        }"""
    )


_PREFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def shown_number(text: str) -> float:
    """The number a person reads in a tile, in the metric's own unit: "41.2%" is 41.2, "72.6k tok/s" 72600,
    "13.8 ms" 0.0138 (seconds), "711 kFLOP" 711000."""
    match = re.match(r"(-?\d+(?:\.\d+)?(?:e-?\d+)?)\s*([kMGTPE]?)(.*)", text.strip())
    assert match, text
    number = float(match.group(1)) * _PREFIX[match.group(2)]
    return number / 1000 if match.group(3).strip() == "ms" else number


def find_golden_run() -> Path | None:
    """A golden run from the numbers issue with a train loss, preferring one with a chosen convention."""
    if not GOLDEN.is_dir():
        return None
    found = []
    for run_dir in sorted(p for p in GOLDEN.iterdir() if p.is_dir()):
        lines = b"".join(p.read_bytes() for p in sorted(run_dir.glob("events-*.jsonl")))
        if b"train_loss" in lines or b'"loss"' in lines:
            found.append((b'"name":"convention"' not in lines, run_dir))
    return sorted(found)[0][1] if found else None


def tiny_gpt_run(env: dict, tmp_path: Path) -> Path:
    require_torch()
    flags = [
        "--no-web", "--params", "106240", "--embedding-params", "4096", "--layers", "2", "--d-model", "64",
        "--seq-len", "64", "--convention", "titan", "--tokens-per-step", "1024", "--peak-tflops", "0.1",
        "--peak-source", "a figure for this test", "--budget-tokens", "100000",
    ]  # fmt: skip
    result = run_tm([*flags, str(REPO / "examples" / "tiny_gpt.py"), "--steps", "60"], env, timeout=300)
    assert result.returncode == 0, result.stderr
    return only_run(Path(env["TM_RUNS_DIR"]))


def loss_points_in_log(run_dir: Path) -> int:
    """The train losses the chart plots: the loop's own (emit or a tracker), which win over the agent's reading at
    backward(); the backward ones only where the loop reported none."""
    keys = ("train_loss", "train/loss", "loss/train", "training_loss", "loss")
    losses = [
        r
        for r in log_records(run_dir)
        if r["kind"] == "metric" and any(k in r.get("values", {}) for k in keys)
    ]
    own = [r for r in losses if r.get("origin", "emit") != "backward"]
    return len(own or losses)


# ----------------------------------------------------------------------------------------------------------------------


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


def test_a_finished_run_reads_at_a_glance_its_summary_mfu_its_time_split_and_its_details(page, capsys):
    run_dir = GOLDEN / "cpu-measured"
    from trainmeter_core.run.end import summary_line
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

        # The time split: nothing was compiled, so its first part is "startup"; what it cannot see is said plainly.
        legend = p.text_content("#split-card .legend")
        assert legend.startswith("startup 4.47 s") and "compile" not in legend
        caption = p.text_content("#split-card .sub")
        assert "Not measured, so counted as compute: data wait (no torch DataLoader iterated yet)" in caption
        assert "stays in compute" not in caption
        assert "data wait" not in p.text_content("#split-none")  # unmeasured is not "no time"
        compiled = p.evaluate(
            """async () => { const panels = await import('/static/panels.js');
                const page = await import('/static/page.js');
                const seen = page.state.doc.phases_seen; page.state.doc.phases_seen = {compile: 1};
                const name = panels.splitName('startup_compile'); page.state.doc.phases_seen = seen; return name; }"""
        )
        assert compiled == "startup and compile"

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


def test_a_live_run_updates_without_a_reload_and_reconnects_after_its_web_process_is_killed(
    page, web_env, tmp_path
):
    tm = LiveTm(dict(web_env), tmp_path, [])
    p = page.page
    try:
        p.goto(tm.url)
        p.evaluate("window.__sameDocument = true")
        steps = lambda: int(p.text_content("#progress-stats [data-explain=steps]") or 0)  # noqa: E731
        wait_for(lambda: steps() > 0, what="the first steps on the page")
        first = steps()
        wait_for(lambda: steps() > first, what="the page to update by itself")
        run_dir = only_run(tm.runs)
        (started,) = [
            r
            for r in log_records(run_dir)
            if r["kind"] == "component" and r["name"] == "web" and r["event"] == "started"
        ]
        os.kill(started["child_pid"], signal.SIGKILL)
        wait_for(
            lambda: any(
                r["kind"] == "component" and r["name"] == "web" and r["event"] == "restarted"
                for r in log_records(run_dir)
            ),
            what="the launcher to restart the web process",
        )
        before = steps()
        wait_for(lambda: steps() > before and p.text_content("#conn") == "live", what="the page to reconnect")
        assert p.evaluate("window.__sameDocument") is True  # no reload happened
        assert p.url.startswith(tm.url)  # the same port
        assert tm.finish() == 0
        assert page.exceptions == []  # (the console does log the refused reconnection attempts)
    finally:
        tm.kill()


def request(port: int, path: str, host: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers={"Host": host})
    status = conn.getresponse().status
    conn.close()
    return status


def test_a_non_loopback_dashboard_needs_its_token_and_checks_the_host(page, web_env, tmp_path):
    tm = LiveTm(dict(web_env), tmp_path, ["--host", "0.0.0.0"])
    try:
        match = re.match(r"http://[^:/]+:(\d+)/\?token=(\S+)", tm.url)
        assert match, tm.url
        port, token = int(match.group(1)), match.group(2)
        assert request(port, "/api/run", f"127.0.0.1:{port}") == 401
        assert request(port, f"/api/run?token={token}", f"127.0.0.1:{port}") == 200
        assert request(port, f"/api/run?token={token}", "evil.example") == 403
        assert request(port, f"/api/run?token={token}", "localhost:9999") == 200
        p = page.page
        p.goto(f"http://127.0.0.1:{port}/?token={token}")
        assert "token" not in p.url  # traded for a cookie
        p.wait_for_function("() => document.querySelector('#conn')?.textContent === 'live'")
        assert tm.finish() == 0
        assert page.exceptions == []
    finally:
        tm.kill()


def test_an_open_page_sees_the_run_finish_and_does_not_hold_tm(page, web_env, tmp_path):
    tm = LiveTm(dict(web_env), tmp_path, [])
    try:
        p = page.page
        p.goto(tm.url)
        p.wait_for_function("() => document.querySelector('#conn')?.textContent === 'live'")
        assert tm.finish() == 0  # tm ended with a live stream open
        p.wait_for_function("() => document.querySelector('#run-state')?.textContent.startsWith('finished')")
        assert p.text_content("#run-state") == "finished · exit 0"
        assert page.exceptions == []
    finally:
        tm.kill()


# --------------------------------------------------------------------------------------------------------------------
# The Profile part: a trace of the run's own process imported into a finished run shows where each profiled step's GPU
# time went, the run's steps it maps to, the top kernels, what the window achieved, and the profiled steps shaded on
# the step-time chart (artifacts/web/profile.png).

PROFILED_RUN = GOLDEN / "cpu-measured"
PROFILE_BASE_NS = 1_795_984_000_000_000_000


def steps_of(run_dir):
    out = {}
    for line in (run_dir / "events-0001.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "step":
            out[record["step"]] = record
    return out


def write_trace(run_dir, folder):
    """A Kineto trace of the run's own process (pid and host in the handler's file name): profiler steps #10-#12
    around the run's steps 4-6, each with a GEMM, a flash-attention kernel, an NCCL all-reduce partly hidden by
    compute, a copy and an elementwise kernel, each launched by a runtime call; the GEMM's op counts 2 GFLOP."""
    steps = steps_of(run_dir)
    pid = steps[4]["pid"]
    base_us = PROFILE_BASE_NS / 1000
    events = []
    corr = 100
    for number, run_step in ((10, 4), (11, 5), (12, 6)):
        start = (steps[run_step - 1]["wall"] + 0.001) * 1e6 - base_us  # µs after the base
        end = (steps[run_step]["wall"] + 0.001) * 1e6 - base_us
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{number}",
                "pid": pid,
                "tid": pid,
                "ts": start,
                "dur": end - start,
                "args": {},
            }
        )
        gpu = start + 500.0
        for name, cat, dur, stream in (
            ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "kernel", 20000.0, 7),
            (
                "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(Flash_fwd_params)",
                "kernel",
                12000.0,
                7,
            ),
            (
                "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                "kernel",
                15000.0,
                20,
            ),
            ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 2000.0, 7),
            (
                "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>(int)",
                "kernel",
                6000.0,
                7,
            ),
        ):
            corr += 1
            launch = gpu - 400.0
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": pid,
                    "tid": pid,
                    "ts": launch,
                    "dur": 10.0,
                    "args": {"correlation": corr},
                }
            )
            if cat == "kernel" and "gemm" in name:
                events.append(
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": "aten::mm",
                        "pid": pid,
                        "tid": pid,
                        "ts": launch - 5.0,
                        "dur": 20.0,
                        "args": {"flops": 2_000_000_000},
                    }
                )
            ts = gpu - 8000.0 if stream == 20 else gpu  # NCCL starts under the GEMM: partly hidden
            events.append(
                {
                    "ph": "X",
                    "cat": cat,
                    "name": name,
                    "pid": 0,
                    "tid": stream,
                    "ts": ts,
                    "dur": dur,
                    "args": {"device": 0, "stream": stream, "correlation": corr, "bytes": 1 << 20},
                }
            )
            if stream == 7:
                gpu += dur + 300.0
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
        "traceEvents": events,
        "baseTimeNanoseconds": PROFILE_BASE_NS,
    }
    folder.mkdir()
    path = folder / f"{steps[4]['host']}_{pid}.1795984653000.pt.trace.json"
    path.write_text(json.dumps(trace))
    return path


def test_the_profile_part_shows_the_split_the_steps_the_kernels_and_marks_the_step_time_chart(
    page,
    tmp_path,
    capsys,
):
    import contextlib
    import io

    from trainmeter_core.commands.cli import main

    run_dir = tmp_path / PROFILED_RUN.name
    shutil.copytree(PROFILED_RUN, run_dir)
    write_trace(run_dir, tmp_path / "traces")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert (
            main(["import", str(run_dir), str(tmp_path / "traces")]) == 0
        )  # the run's own process: no --force
    assert out.getvalue().startswith("process ProfilerStep#10-12 = step 4-6: ")
    served = Served(run_dir, capsys)
    p = page.page
    try:
        p.goto(served.url)
        p.wait_for_selector("#profile-split .profile-rank")
        head = p.text_content("#profile-split .profile-rank-head")
        assert head.startswith("the process · steps 4–6 · ") and head.endswith("torch.profiler")
        legend = p.text_content("#profile-split .legend")
        # The copy runs while the all-reduce does: the exclusive split gives that time to communication.
        for part in ("GEMM", "attention", "communication (exposed)", "other compute", "idle"):
            assert part in legend, legend
        assert "memory copies" not in legend
        rows = p.eval_on_selector_all(
            "#profile-steps tr",
            "rows => rows.slice(1).map(r => [...r.cells].slice(1, 3).map(c => c.textContent))",
        )
        assert rows == [["#10", "4"], ["#11", "5"], ["#12", "6"]]
        kernels = p.eval_on_selector_all(
            "#profile-kernels td.kernel-name", "cells => cells.map(c => c.textContent)"
        )
        assert kernels[0].startswith("sm90_xmma_gemm") and any("flash_fwd_kernel" in k for k in kernels)
        # 2 GFLOP per profiled step over each window against the run's measured CPU peak: a number, not n/a.
        mfu = p.text_content("#profile-achieved [data-explain='profile_mfu']")
        assert mfu.endswith("%") and mfu != "n/a"
        # The step-time chart shades the profiled steps 4, 5 and 6 (each from half a step before to half after).
        marks = p.get_attribute("#chart-rank-step-time", "data-nan")
        assert marks == "3.5,4.5,5.5", marks
        p.mouse.move(0, 0)
        SHOTS.mkdir(parents=True, exist_ok=True)
        p.locator("#profile").screenshot(path=str(SHOTS / "profile.png"))
        p.locator("#chart-rank-step-time").screenshot(path=str(SHOTS / "profile-step-time.png"))
        assert page.errors == []
    finally:
        served.stop()


# --------------------------------------------------------------------------------------------------------------------
# The job part (docs/multinode.md): a job's run, as its job hub wrote it (its clock and node records before a node's
# own), replayed by tm view; one row per node, the straggler named, a lost node marked. A single-node run has none.

AHEAD_S = {"node0": 0.0, "node1": 1000.0, "node2": 2000.0}
JOB = rec.JobPlace(id="torchrun-exp7", node_rank=0, nnodes=3, hub="10.0.0.1:29401", found_by="torchrun flags")


def job_run(run_dir) -> None:
    """A finished job of three nodes: node 2 reports every step 0.25 s late, then falls silent and is lost."""
    records: list[rec.Record] = [
        rec.RunStart(
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
            records.append(
                rec.ClockMap(
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
            records.append(rec.NodeEvent(t=100.5, host="node0", node_rank=k, node_host=host, event="joined"))
        records.append(
            rec.Fact(
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
            records.append(
                rec.Step(
                    t=110.0 + step + late + AHEAD_S[host],
                    wall=1.7e9 + step,
                    host=host,
                    rank=k,
                    step=step,
                    step_time_s=1.0,
                    tokens=1024,
                )
            )
    records.append(
        rec.NodeEvent(
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
    records.append(rec.Tick(t=140.0, wall=1.7e9 + 40, host="node0", n=1, interval_s=1.0))
    records.append(
        rec.RunEnd(t=141.0, wall=1.7e9 + 41, host="node0", status=0, reason="exited", elapsed_s=41.0)
    )
    run_dir.mkdir()
    lines = []
    for seq, record in enumerate(records, 1):
        record.seq, record.v, record.source = seq, rec.SCHEMA_VERSION, record.source or "launcher"
        lines.append(rec.to_log_line(msgspec.to_builtins(record)))
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


# ---------------------------------------------------------------------------------------------------------------------
# A resumed run (tm --resume): the header says which attempt and how long the run was down, and every chart marks the
# gap on the wall-time axis and the step the run went back to on the step axis.

RESUMED_WALL0 = 1_796_000_000.0


def resumed_run(run_dir):
    """Attempt 1 steps 1..10 and is lost after its checkpoint of step 10 (its last tick at wall + 120); attempt 2
    starts at wall + 150 (30 s down), resumes after step 10 and ends after step 20."""
    log = Log()
    log.start(100.0)
    for step in range(1, 11):
        log.add(rec.Step(t=109.0 + step, step=step, tokens=100), wall_offset=RESUMED_WALL0)
        log.add(
            rec.Metric(t=109.2 + step, values={"train_loss": 4.0 / step}, step=step),
            wall_offset=RESUMED_WALL0,
        )
    log.tick(120.0, 1)
    log.start(150.0, attempt=2, resume_reason="--resume")
    for step in range(11, 21):
        fields = {"resumed_from": 10} if step == 11 else {"step_time_s": 1.0}
        log.add(rec.Step(t=149.0 + step, step=step, tokens=100, **fields), wall_offset=RESUMED_WALL0)
        log.add(
            rec.Metric(t=149.2 + step, values={"train_loss": 4.0 / step}, step=step),
            wall_offset=RESUMED_WALL0,
        )
    log.tick(170.0, 2)
    log.end(170.5)
    for record in log.records:
        if record.wall < RESUMED_WALL0:
            record.wall = record.t + RESUMED_WALL0
    run_dir.mkdir(parents=True)
    meta = {
        "run_id": run_dir.name,
        "name": "train",
        "command": ["train.py"],
        "start_wall": RESUMED_WALL0 + 100.0,
    }
    meta["attempts"] = [{"attempt": 1}, {"attempt": 2, "resume_reason": "--resume"}]
    (run_dir / "meta.json").write_text(json.dumps(meta))
    (run_dir / "events-0001.jsonl").write_bytes(
        b"".join(rec.to_log_line(rec.to_builtins(r)) for r in log.records if r.seq < 25)
    )
    (run_dir / "events-0002.jsonl").write_bytes(
        b"".join(rec.to_log_line(rec.to_builtins(r)) for r in log.records if r.seq >= 25)
    )


def test_the_dashboard_says_the_attempt_and_marks_where_the_run_was_down(page, tmp_path, capsys):
    run_dir = tmp_path / "runs" / "20261201T000000Z-vm-train"
    resumed_run(run_dir)
    served = Served(run_dir, capsys)
    p = page.page
    try:
        p.goto(served.url)
        p.wait_for_function("() => document.querySelector('#run-state')?.textContent === 'finished · exit 0'")
        assert p.text_content("#attempts") == "attempt 2 · resumed after step 10 · down 30 s (attempt 1 lost)"
        assert p.text_content("#progress-stats [data-explain=steps]") == "20"
        # On the step axis, the loss chart marks the step the run went back to
        p.wait_for_function(
            "() => (document.querySelector('#chart-loss') || {dataset: {}}).dataset.gaps === '10..10'"
        )
        # On the wall-time axis, the stretch from attempt 1's last tick (wall + 120) to attempt 2's start (+ 150)
        p.click("#x-axis button[data-axis=wall]")
        expected = f"{RESUMED_WALL0 + 120.0:.0f}..{RESUMED_WALL0 + 150.0:.0f}"
        p.wait_for_function(
            f"() => (document.querySelector('#chart-loss') || {{dataset: {{}}}}).dataset.gaps === '{expected}'"
        )
        assert p.get_attribute("#chart-loss", "data-nan") == ""  # a gap is no NaN stretch
        SHOTS.mkdir(parents=True, exist_ok=True)
        p.mouse.move(0, 0)
        p.screenshot(path=str(SHOTS / "resumed.png"), full_page=False)
        assert page.errors == []
    finally:
        served.stop()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
