"""``tm report`` files in a real browser (headless Chromium), opened from disk with every request refused: the demo
run, a real H200 run and a run whose strings try to be markup. What a person sees is checked by its text and its
pixels: every chart inked, the numbers the engine computed, both themes, the x axis switched with no server, the page
as it prints. Screenshots go to artifacts/report/ (git-ignored).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from dashboard_page import LOOP, XSS_KEY, loss_points_in_log, shown_number, tiny_gpt_run
from tm_runs import REPO, only_run, run_tm

pytestmark = [pytest.mark.heavy, pytest.mark.xdist_group("heavy")]

SHOTS = REPO / "artifacts" / "report"
REAL = REPO / "tests" / "fixtures" / "real"

# Every canvas on screen and how many of its pixels are inked (alpha > 0), by the id of the part that holds it.
INKED = """() => [...document.querySelectorAll('canvas')].filter(c => c.getClientRects().length).map(c => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let inked = 0;
  for (let i = 3; i < d.length; i += 4) if (d[i] > 0) inked += 1;
  return {id: c.closest('[id]').id, points: Number(c.dataset.points || c.closest('[id]').dataset.points || 0), inked};
})"""


class OfflinePage:
    """A page that may read its own file and nothing else: any other request is refused and recorded. It records
    script errors, console errors (a refusal by the page's own policy is one) and dialogs."""

    def __init__(
        self, chromium, color_scheme: str = "light", width: int = 1400, java_script_enabled: bool = True
    ) -> None:
        self.context = chromium.new_context(
            viewport={"width": width, "height": 1000},
            color_scheme=color_scheme,
            java_script_enabled=java_script_enabled,
        )
        self.requests: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def _route(self, route) -> None:
        url = route.request.url
        if url.startswith("file://"):
            route.continue_()
        else:
            self.requests.append(url)
            route.abort()

    def open(self, path: Path):
        self.page.goto(path.as_uri())
        self.page.wait_for_function(
            "() => document.querySelector('#tile-mfu .value')?.textContent.length > 0"
        )
        self.page.wait_for_timeout(300)  # a frame or two for the charts
        return self.page

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def offline(browser):
    opened: list[OfflinePage] = []

    def make(**kw) -> OfflinePage:
        opened.append(OfflinePage(browser, **kw))
        return opened[-1]

    yield make
    for p in opened:
        p.close()


def report_of(run_dir: Path, env: dict, out: Path) -> dict:
    result = run_tm(["report", str(run_dir), "-o", str(out)], env, timeout=300)
    assert result.returncode == 0, result.stderr
    html = out.read_text()
    return json.loads(
        re.search(r'<script type="application/json" id="tm-data">(.*?)</script>', html, re.S).group(1)
    )


def assert_every_chart_drawn(p, expected: set[str]) -> None:
    canvases = p.evaluate(INKED)
    charts = {c["id"]: c for c in canvases if c["id"].startswith("chart-")}
    assert expected <= set(charts), sorted(charts)
    for canvas in canvases:
        if canvas["id"].startswith("tile-") and canvas["points"] < 2:
            continue  # a sparkline of fewer than two points is a tile with no line yet (its number says n/a)
        # a chart's plot is some 300 × 150 pixels: an axis, a line and its area ink thousands of them
        assert canvas["inked"] > 500, canvas


def assert_tiles_say_the_engines_numbers(p, data: dict) -> None:
    metrics = data["doc"]["snapshot"]["metrics"]
    for key in ("tokens_per_s", "step_time_s", "mfu", "ofu", "goodput", "flop_per_token"):
        shown_key = p.get_attribute(f"#tile-{key} .value", "data-metric")
        metric = metrics[shown_key]
        shown = p.text_content(f"#tile-{key} .value")
        if metric.get("value") is None and metric.get("low") is None:
            assert shown == "n/a", key
            continue
        value = metric["value"] if metric.get("value") is not None else metric["low"]
        if key in ("mfu", "ofu", "goodput"):
            value *= 100
        # three significant digits: off by at most half a unit of the third, 0.5 % of the value
        assert abs(shown_number(shown.split(" – ")[0]) - value) <= 0.005 * abs(value) + 1e-12, (key, shown)


def switch_axis(p, axis: str, label: str) -> None:
    p.click(f"#x-axis button[data-axis={axis}]")
    p.wait_for_function(
        """(axis) => { const c = [...document.querySelectorAll('.chart')];
           return c.length > 0 && c.every(e => e.dataset.xAxis === axis); }""",
        arg=axis,
    )
    shown = p.eval_on_selector_all(".chart .x-label", "els => els.map(e => e.textContent)")
    assert shown and all(text.startswith(label) for text in shown), (axis, shown)


def theme_colours(p) -> dict:
    return p.evaluate(
        """() => ({theme: document.documentElement.dataset.theme,
                  bg: getComputedStyle(document.body).backgroundColor,
                  card: getComputedStyle(document.querySelector('.card')).backgroundColor})"""
    )


# ----------------------------------------------------------------------------------------------------------------------


def test_the_demo_runs_report_opens_offline_with_every_chart_drawn_its_numbers_and_its_passport(
    offline, tm_env, tmp_path
):
    run_dir = tiny_gpt_run(tm_env, tmp_path)
    out = tmp_path / "demo.html"
    data = report_of(run_dir, tm_env, out)
    losses = loss_points_in_log(run_dir)
    shutil.rmtree(run_dir)  # the file needs nothing of the run directory any more
    light = offline()
    p = light.open(out)
    assert p.text_content("#run-state") == "finished · exit 0"
    assert p.text_content("#conn").startswith("report written ")
    assert_every_chart_drawn(
        p,
        {
            "chart-loss",
            "chart-tokens-per-s",
            "chart-mfu-ofu",
            "chart-lr",
            "chart-ladder",
            "chart-rank-step-time",
        },
    )
    assert_tiles_say_the_engines_numbers(p, data)
    # The headline MFU names its convention and its window, as the summary line does.
    mfu_line = p.text_content("#tile-mfu .line")
    assert "average over the training window (" in mfu_line and "titan" in mfu_line
    assert 0 < losses <= 600 and p.get_attribute("#chart-loss", "data-points") == str(
        losses
    )  # each loss reported
    assert p.get_attribute("#chart-loss", "data-series") == "train_loss val_loss"
    # The run details and the model card are open: the facts with their provenance, the passport.
    assert p.is_visible("#facts") and p.is_visible("#passport")
    provenance = dict(
        zip(
            p.eval_on_selector_all("#facts tr td:nth-child(1)", "cells => cells.map(c => c.textContent)"),
            p.eval_on_selector_all("#facts tr td:nth-child(3)", "cells => cells.map(c => c.textContent)"),
            strict=True,
        )
    )
    assert provenance["convention"] == "declared" and provenance["device"] == "detected"
    assert p.text_content("#passport").startswith("# Run passport")
    SHOTS.mkdir(parents=True, exist_ok=True)
    p.screenshot(path=str(SHOTS / "demo-light.png"), full_page=True)
    # The x axis is switched with no server: every series is in the file on every axis.
    switch_axis(p, "tokens", "tokens")
    switch_axis(p, "wall", "wall time")
    assert_every_chart_drawn(p, {"chart-loss", "chart-tokens-per-s", "chart-rank-step-time"})
    switch_axis(p, "step", "step")
    # Printed: the light theme whatever the reader chose, and the controls left out.
    dark = offline(color_scheme="dark")
    q = dark.open(out)
    assert theme_colours(q)["theme"] == "dark"
    q.screenshot(path=str(SHOTS / "demo-dark.png"), full_page=True)
    q.emulate_media(media="print")
    q.wait_for_function("() => document.documentElement.dataset.theme === 'light'")
    printed = theme_colours(q)
    assert printed["bg"] == "rgb(255, 255, 255)"
    assert not q.is_visible("#theme-toggle") and not q.is_visible("#copy-passport")
    assert_every_chart_drawn(q, {"chart-loss", "chart-tokens-per-s"})
    q.screenshot(path=str(SHOTS / "demo-print.png"), full_page=True)
    q.pdf(path=str(SHOTS / "demo.pdf"))
    q.emulate_media(media="screen")
    q.wait_for_function(
        "() => document.documentElement.dataset.theme === 'dark'"
    )  # back to the reader's choice
    for opened in (light, dark):
        assert opened.requests == [] and opened.errors == [] and opened.dialogs == []


def test_a_real_h200_runs_report_opens_offline_with_every_gpu_chart_drawn(offline, tm_env, tmp_path):
    out = tmp_path / "h200.html"
    data = report_of(REAL / "h200-nanogpt-eager", tm_env, out)
    page = offline()
    p = page.open(out)
    gpu_charts = {f"chart-gpu-{c}" for c in ("util_gpu", "sm_active", "tensor_active", "dram_active", "power_w",
                                               "clock_sm_mhz")}  # fmt: skip
    expected = {"chart-tokens-per-s", "chart-mfu-ofu", "chart-ladder", "chart-rank-step-time", *gpu_charts}
    assert_every_chart_drawn(p, expected)
    assert_tiles_say_the_engines_numbers(p, data)
    assert p.text_content("#rig") == "1 × NVIDIA H200 SXM"
    assert "FLOP/B at" in p.text_content("#roofline-card")  # the roofline point is drawn, with its numbers
    # No loss was reported by that run: the loss chart is left out, and the passport says why.
    assert p.locator("#chart-loss").count() == 0
    assert "the loop reported no loss" in p.text_content("#passport")
    SHOTS.mkdir(parents=True, exist_ok=True)
    p.screenshot(path=str(SHOTS / "h200-light.png"), full_page=True)
    assert page.requests == [] and page.errors == [] and page.dialogs == []


# 30 finite losses, then NaN for 40 steps: 4 s of it, so the alert rules see it on several ticks.
NAN_LOOP = """
import time
from trainmeter_agent import emit

for step in range(1, 71):
    emit(step=step, tokens=2048, train_loss=4.0 / step if step <= 30 else float("nan"))
    time.sleep(0.1)
"""


def test_a_report_marks_where_and_when_the_loss_became_nan_from_the_data_it_carries(
    offline, tm_env, tmp_path
):
    script = tmp_path / "nan_loop.py"
    script.write_text(NAN_LOOP)
    result = run_tm(["--no-web", str(script)], tm_env)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "nan.html"
    report_of(only_run(Path(tm_env["TM_RUNS_DIR"])), tm_env, out)
    page = offline()
    p = page.open(out)
    # The stretch's wall time comes from the wall-time axis the file carries (the live page asks the server).
    p.wait_for_function(
        "() => document.querySelector('#chart-loss .chart-notes')?.textContent.includes('since')"
    )
    notes = p.text_content("#chart-loss .chart-notes")
    assert "train loss is not a number from step 31 on, since " in notes
    assert p.get_attribute("#chart-loss", "data-nan") == "31"
    alerts = p.text_content("#alert-list")
    assert "loss_nan" in alerts and "train_loss is nan" in alerts
    assert page.requests == [] and page.errors == []


def test_strings_from_the_training_code_stay_text_in_a_report(offline, tm_env, tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    result = run_tm(["--no-web", str(script), str(tmp_path / "stop"), "20", XSS_KEY, "</script>"], tm_env)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "xss.html"
    report_of(only_run(Path(tm_env["TM_RUNS_DIR"])), tm_env, out)
    html = out.read_text()
    assert XSS_KEY not in html  # carried as JSON with every "<" escaped
    page = offline()
    p = page.open(out)
    p.get_by_text(XSS_KEY, exact=True).first.wait_for()  # the custom series' chart title, as literal text
    assert "</script>" in p.text_content("#run-command")
    assert p.locator("img[src=x]").count() == 0
    assert page.dialogs == [] and page.errors == [] and page.requests == []


def summary_numbers(stderr: str) -> tuple[str, list[str]]:
    """The steps and the numbers of the summary line tm printed at the end: the phrases after ``N steps`` and before
    what was dropped."""
    (line,) = [x for x in stderr.splitlines() if " · see it again: " in x]
    parts = line.split(" · ")
    first = next(i for i, part in enumerate(parts) if part.endswith(" steps"))
    last = next(i for i, part in enumerate(parts) if part.endswith(" dropped"))
    return parts[first], parts[first + 1 : last]


def test_a_report_read_without_scripts_shows_the_headline_numbers_the_alerts_and_the_passport(
    offline, tm_env, tmp_path
):
    script = tmp_path / "nan_loop.py"
    script.write_text(NAN_LOOP)
    result = run_tm(["--no-web", str(script)], tm_env)
    assert result.returncode == 0, result.stderr
    steps, numbers = summary_numbers(result.stderr)
    assert (
        steps == "70 steps" and "tokens 1.43e+05" in numbers and "train_loss nan" in numbers
    )  # 70 × 2048 tokens
    out = tmp_path / "nan.html"
    report_of(only_run(Path(tm_env["TM_RUNS_DIR"])), tm_env, out)
    # A mail client or a CI viewer that strips scripts: what the file itself says.
    page = offline(java_script_enabled=False)
    p = page.page
    p.goto(out.as_uri())
    headline = p.text_content("#static-headline").split(" · ")
    assert headline[0].startswith("finished in ") and headline[1] == "exit 0"
    assert headline[2] == steps and headline[3:] == numbers  # the summary line's own words
    assert p.is_visible("#static-headline") and p.is_visible("#static-passport")
    alerts = p.text_content("#static-alerts")
    assert (
        "loss_nan" in alerts and "train_loss is nan" in alerts and "still firing when the run ended" in alerts
    )
    passport = p.text_content("#static-passport")
    assert passport.startswith("# Run passport") and "- steps: 70" in passport
    # The parts the scripts draw are not shown half-empty: no "connecting", no empty progress bar.
    body = p.inner_text("body")
    assert "connecting" not in body and not p.is_visible("#progress") and not p.is_visible("#tiles")
    assert "trainmeter report of " in p.text_content("footer")
    # Nothing in the file needs a server: every reference is the file's own.
    referenced = p.locator("[href], [src], [action]")
    links = [
        referenced.nth(i).get_attribute(name)
        for i in range(referenced.count())
        for name in ("href", "src", "action")
    ]
    links = [link for link in links if link is not None]
    assert links and all(link.startswith("data:") for link in links), links
    assert page.requests == []
    SHOTS.mkdir(parents=True, exist_ok=True)
    p.screenshot(path=str(SHOTS / "no-scripts.png"), full_page=True)
    # With scripts, the dashboard takes the static view's place, and links no server either.
    live = offline()
    q = live.open(out)
    assert q.locator("#static-view").count() == 0 and q.is_visible("#progress")
    assert q.text_content("footer") == p.text_content("footer")
    assert q.locator('[href^="/"], [src^="/"], [href^="http"], [src^="http"]').count() == 0
    assert live.requests == [] and live.errors == [] and live.dialogs == []


def test_a_report_given_a_price_shows_the_money_card_with_the_prices_source_and_one_without_says_why(
    offline, tm_env, tmp_path
):
    env = {k: v for k, v in tm_env.items() if "PRICE" not in k}
    priced, plain = tmp_path / "priced.html", tmp_path / "plain.html"
    result = run_tm(
        ["report", str(REAL / "h200-nanogpt-kill"), "-o", str(priced), "--price-per-gpu-hour", "7.3193"], env
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(
        re.search(
            r'<script type="application/json" id="tm-data">(.*?)</script>', priced.read_text(), re.S
        ).group(1)
    )
    spent = data["doc"]["money"]["figures"]["spent"]["value"]
    page = offline()
    p = page.open(priced)
    card = p.text_content("#money")
    assert "price 7.3193 USD/GPU-h from --price-per-gpu-hour (no currency given: USD by default)" in card
    # the engine's GPU-hours × the price, as the card rounds it (three significant digits below 1)
    assert p.text_content("#money [data-explain='money.spent']") == f"{float(f'{spent:.3g}'):g} USD"
    assert spent == pytest.approx(data["doc"]["snapshot"]["metrics"]["gpu_hours"]["value"] * 7.3193)
    assert "startup" in p.text_content("#money-lost")  # the badput parts, priced
    assert page.errors == [] and page.requests == []
    report_of(REAL / "h200-nanogpt-kill", env, plain)
    p = page.open(plain)
    assert "n/a: no price given: --price-per-gpu-hour, TM_PRICE_PER_GPU_HOUR" in p.text_content("#money")
    assert p.locator("#money [data-explain='money.spent']").count() == 0
