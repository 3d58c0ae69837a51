"""The dashboard in a real browser (headless Chromium through Playwright): what a person sees, found by its text.

A run renders with its numbers and conventions, both themes read at 4.5:1 or better, a live run updates without a
reload and reconnects by itself after its web process is killed, strings from the training code stay text, and a
non-loopback dashboard wants its token. Screenshots go to artifacts/web/ (git-ignored).
"""

from __future__ import annotations

import http.client
import importlib.metadata as md
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO, TM, log_records, only_run, require_torch, run_tm, wait_for

pytestmark = [pytest.mark.heavy, pytest.mark.xdist_group("heavy")]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
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


@pytest.fixture(scope="session")
def browser():
    """One Chromium per xdist worker. Missing: a failure under TM_REQUIRE_BROWSER=1 (CI), else a skip saying why."""
    why = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        why = f"Playwright is not installed ({exc})"
    if why is None and not os.path.exists(CHROMIUM):
        why = f"Chromium is not at {CHROMIUM}"
    if why is not None:
        if os.environ.get("TM_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{why}, and TM_REQUIRE_BROWSER=1 requires it: run ./scripts/setup-browser")
        pytest.skip(f"{why}: ./scripts/setup-browser installs both")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


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

    def __init__(self, env: dict, tmp_path: Path, args: list[str], steps: int = 0) -> None:
        script = tmp_path / "loop.py"
        script.write_text(LOOP)
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
    keys = ("train_loss", "train/loss", "loss/train", "training_loss", "loss")
    return sum(
        1
        for r in log_records(run_dir)
        if r["kind"] == "metric" and any(k in r.get("values", {}) for k in keys)
    )


# ----------------------------------------------------------------------------------------------------------------------


def test_a_run_renders_its_numbers_with_their_conventions_in_both_themes(page, tm_env, tmp_path, capsys):
    run_dir = find_golden_run() or tiny_gpt_run(tm_env, tmp_path)
    served = Served(run_dir, capsys)
    p = page.page
    try:
        p.goto(served.url)
        p.wait_for_function("() => document.querySelector('#tile-mfu .value').textContent.length > 0")
        snapshot = json.loads(p.evaluate("fetch('/api/snapshot').then(r => r.text())"))
        metrics = snapshot["metrics"]
        for key in ("tokens_per_s", "step_time_s", "mfu", "ofu", "goodput", "flops_per_token"):
            metric = metrics[key]
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
        for key in ("mfu", "flops_per_token"):
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
        assert snapshot["explain"]["mfu"]["formula"] in tooltip
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
        labels = {"step": "step", "tokens": "tokens", "flops": "FLOPs spent (", "wall": "wall time"}
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
        p.wait_for_function("() => document.querySelector('#conn').textContent === 'live'")
        assert tm.finish() == 0
        assert page.exceptions == []
    finally:
        tm.kill()


def test_an_open_page_sees_the_run_finish_and_does_not_hold_tm(page, web_env, tmp_path):
    tm = LiveTm(dict(web_env), tmp_path, [])
    try:
        p = page.page
        p.goto(tm.url)
        p.wait_for_function("() => document.querySelector('#conn').textContent === 'live'")
        assert tm.finish() == 0  # tm ended with a live stream open
        p.wait_for_function("() => document.querySelector('#run-state').textContent.startsWith('finished')")
        assert p.text_content("#run-state") == "finished · exit 0"
        assert page.exceptions == []
    finally:
        tm.kill()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
