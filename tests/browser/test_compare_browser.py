"""Two real CPU runs of the demo script that differ only by their learning rate, compared: ``tm compare --json`` lists
exactly that flag, and the comparison's page (the file ``tm compare -o`` writes, opened with every request refused,
and the page ``tm view A B`` serves) draws both loss curves on a tokens axis, each in its run's colour. Screenshots go
to artifacts/compare/ (git-ignored).
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
from deadline import wait_for
from test_report_browser import OfflinePage, assert_every_chart_drawn
from tm_runs import REPO, run_tm
from torch_required import require_torch

pytestmark = [pytest.mark.heavy, pytest.mark.xdist_group("heavy")]

SHOTS = REPO / "artifacts" / "compare"

# Pixels of the loss chart within a small distance of each run's colour (the page's --c1 and --c2): a line drawn in
# that colour inks dozens of them, an area under it (translucent) none.
INKED_BY_RUN = """() => {
  const style = getComputedStyle(document.documentElement);
  const rgb = (v) => { const n = parseInt(style.getPropertyValue(v).trim().slice(1), 16); return [n >> 16, (n >> 8) & 255, n & 255]; };
  const colours = [rgb('--c1'), rgb('--c2')];
  const canvas = document.querySelector('#chart-train-loss canvas');
  const d = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  const counts = [0, 0];
  for (let i = 0; i < d.length; i += 4) {
    if (d[i + 3] < 200) continue;
    colours.forEach((c, k) => {
      if (Math.abs(d[i] - c[0]) + Math.abs(d[i + 1] - c[1]) + Math.abs(d[i + 2] - c[2]) < 40) counts[k] += 1;
    });
  }
  return counts;
}"""


def lr_run(env: dict, lr: str) -> Path:
    require_torch()
    flags = [
        "--no-web", "--params", "106240", "--embedding-params", "4096", "--layers", "2", "--d-model", "64",
        "--seq-len", "64", "--convention", "titan", "--tokens-per-step", "1024",
    ]  # fmt: skip
    before = set(Path(env["TM_RUNS_DIR"]).glob("*")) if Path(env["TM_RUNS_DIR"]).exists() else set()
    result = run_tm(
        [*flags, str(REPO / "examples" / "tiny_gpt.py"), "--steps", "40", "--lr", lr], env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    (run_dir,) = set(Path(env["TM_RUNS_DIR"]).glob("*")) - before
    return run_dir


def check_loss_on_tokens(p) -> None:
    p.wait_for_selector("#chart-train-loss")
    p.click("#x-axis button[data-axis=tokens]")
    p.wait_for_function("() => document.querySelector('#chart-train-loss')?.dataset.xAxis === 'tokens'")
    assert p.get_attribute("#chart-train-loss", "data-series") == "A:train_loss B:train_loss"
    assert p.text_content("#chart-train-loss .x-label") == "tokens"
    legend = p.eval_on_selector_all("#chart-train-loss .legend .key", "keys => keys.map(k => k.textContent)")
    assert legend == ["A", "B"]
    a, b = p.evaluate(INKED_BY_RUN)
    assert a > 30 and b > 30, (a, b)  # both curves drawn, each in its run's colour
    assert_every_chart_drawn(p, {"chart-train-loss", "chart-val-loss", "chart-tokens-per-s", "chart-lr"})


def test_two_runs_that_differ_by_their_learning_rate_compare_with_both_losses_on_a_tokens_axis(
    browser, tm_env, tmp_path, capsys
):
    a = lr_run(tm_env, "1e-3")
    b = lr_run(tm_env, "3e-3")
    result = run_tm(["compare", "--json", str(a), str(b)], tm_env)
    assert result.returncode == 0, result.stderr
    comparison = json.loads(result.stdout)
    # The same script, flags and machine: the one difference is the learning rate, as each command line gave it.
    assert comparison["differences"] == [
        {"category": "command line", "name": "--lr", "values": ["1e-3", "3e-3"]}
    ]
    assert comparison["convention"]["name"] == "titan"
    rows = {row["key"]: row for row in comparison["headline"]}
    assert rows["tokens"]["values"] == [40 * 1024, 40 * 1024]  # 40 steps of the declared 1,024 tokens
    assert rows["train_loss"]["values"][0] != rows["train_loss"]["values"][1]

    out = tmp_path / "lr.html"
    result = run_tm(["compare", str(a), str(b), "-o", str(out)], tm_env)
    assert result.returncode == 0, result.stderr
    offline = OfflinePage(browser)
    try:
        p = offline.page
        p.goto(out.as_uri())
        assert p.text_content("#difference-table").count("--lr") == 1
        check_loss_on_tokens(p)
        SHOTS.mkdir(parents=True, exist_ok=True)
        p.screenshot(path=str(SHOTS / "lr-file.png"), full_page=True)
        assert offline.requests == [] and offline.errors == [] and offline.dialogs == []
    finally:
        offline.close()

    from trainmeter_web import compare

    stopping = threading.Event()
    thread = threading.Thread(target=compare.serve, args=([a, b], "127.0.0.1", 0, stopping), daemon=True)
    thread.start()
    seen: list[str] = []

    def url():
        seen.append(capsys.readouterr().err)
        return re.search(r"dashboard (http://\S+)", "".join(seen))

    context = browser.new_context(viewport={"width": 1400, "height": 1000}, color_scheme="dark")
    errors: list[str] = []
    try:
        served = wait_for(url, what="tm view A B's start line").group(1)
        p = context.new_page()
        p.on("pageerror", lambda exc: errors.append(str(exc)))
        p.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        p.goto(served)
        check_loss_on_tokens(p)
        assert p.evaluate("document.documentElement.dataset.theme") == "dark"
        p.screenshot(path=str(SHOTS / "lr-served-dark.png"), full_page=True)
        assert errors == []
    finally:
        context.close()
        stopping.set()
        thread.join(10)
