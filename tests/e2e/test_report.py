"""``tm report``: the dashboard's own modules joined into one file, the run's data carried in it at the page's
resolution, and the command's answers (a file, or one line and status 2). The browser's view of the file is in
test_report_browser.py."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_web_view import write_run
from tm_runs import REPO, run_tm

from trainmeter_core.model.history import History
from trainmeter_web import bundle
from trainmeter_web.dashboard_state import DashboardState
from trainmeter_web.report import _number, _x, report_data, series_columns

NAN = math.nan
WALL0 = 1_700_000_000.0
_MODULE_LINE = re.compile(r"^\s*(import|export)\b", re.M)


def sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# ----------------------------------------------------------------------------------------------------------------------
# The bundle


@pytest.mark.parametrize("entry", ["app.js", "report.js", "compare.js"])
def test_each_page_bundles_into_one_script_with_every_module_after_the_ones_it_imports(entry):
    files = bundle.static_files()
    script = bundle.bundle(files, entry)
    assert not _MODULE_LINE.search(script)  # no import or export is left for the browser to resolve
    starts = {m.group(1): m.start() for m in re.finditer(r"^// ---- (\S+)$", script, re.M)}
    assert entry in starts and max(starts.values()) == starts[entry]  # the entry runs last
    for name, at in starts.items():
        for dependency, _ in bundle._imports(files[name]):
            assert starts[dependency] < at, (name, dependency)


def test_an_import_is_renamed_as_the_module_said_and_a_module_returns_its_exports():
    files = {
        "a.js": "export function f() {\n  return 1;\n}\nexport const K = 2;\nconst hidden = 3;\n",
        "b.js": 'import { f as g, K } from "./a.js";\nexport async function run() {\n  return g() + K;\n}\n',
    }
    script = bundle.bundle(files, "b.js")
    assert "const { f: g, K } = __tm_a;" in script
    assert "return { f, K };" in script  # `hidden` stays inside a.js
    assert "return { run };" in script and "async function run()" in script
    assert script.index("// ---- a.js") < script.index("// ---- b.js")


@pytest.mark.parametrize(
    ("files", "said"),
    [
        ({"a.js": "export let n = 1;\n"}, "export let n"),  # importers would not see it change
        ({"a.js": 'import x from "./b.js";\n', "b.js": "export const x = 1;\n"}, "only `import {"),
        ({"a.js": "const x = 1;\nexport { x };\n"}, "only `export function"),
        (
            {"a.js": 'import { y } from "./b.js";\n', "b.js": 'import { x } from "./a.js";\n'},
            "imports itself",
        ),
        ({"a.js": 'import { y } from "./gone.js";\n'}, "no static module gone.js"),
        ({"a.js": 'const s = "</script>";\n'}, "would end the inline script"),
    ],
)
def test_a_module_the_bundle_cannot_join_faithfully_is_refused(files, said):
    with pytest.raises(bundle.BundleError, match=re.escape(said)):
        bundle.bundle(files, "a.js")


def test_no_string_of_the_run_can_end_the_data_a_file_carries():
    hostile = "</script><img src=x onerror=alert(1)><!--"
    carried = bundle.carried_json({"series": {hostile: [1]}})
    assert "<" not in carried
    assert json.loads(carried) == {"series": {hostile: [1]}}


def test_a_standalone_page_refers_to_nothing_outside_itself_and_its_policy_admits_only_its_own_script_and_style():
    html = bundle.standalone_html("index.html", "report.js", {"kind": "report"})
    assert "/static/" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', html).group(1)
    script = re.search(r'<script type="module">(.*?)</script>', html, re.S).group(1)
    style = re.search(r"<style>(.*?)</style>", html, re.S).group(1)
    assert f"script-src {sha256(script)};" in policy
    assert f"style-src {sha256(style)};" in policy
    assert (
        policy.startswith("default-src 'none';") and "img-src data:;" in policy
    )  # nothing to fetch, anywhere
    assert html.index("Content-Security-Policy") < html.index("<style>")  # in force before anything loads
    data = re.search(r'<script type="application/json" id="tm-data">(.*?)</script>', html, re.S).group(1)
    assert json.loads(data) == {"kind": "report"}
    assert html.count('src="data:image/svg+xml;base64,') == 1 and 'href="data:image/svg+xml;base64,' in html


# ----------------------------------------------------------------------------------------------------------------------
# The data


def test_numbers_are_carried_to_six_significant_digits_x_to_seven_and_wall_times_to_the_millisecond():
    assert _number(0.123456789) == 0.123457
    assert _number(3.0) == 3 and isinstance(_number(3.0), int)
    assert _number(NAN) is None and _number(math.inf) is None
    assert _x(1_700_000_000.1234567, "wall") == 1_700_000_000.123
    assert _x(123_456_789.5, "tokens") == 123_456_800  # 7 significant digits: 1.234568e8
    assert _x(2.0e18 / 3, "flop") == 6.666667e17


def model_with(history: History) -> DashboardState:
    model = DashboardState()
    model.load_history(history, "test", 0)
    return model


def test_a_series_is_carried_once_with_one_x_column_per_axis():
    history = History()
    # Three steps of 100 tokens; FLOPs known from the second step on (a convention came late), so the FLOPs axis has
    # other points than the rest and carries its own columns.
    for step, flop in ((1, NAN), (2, 1200.0), (3, 1800.0)):
        history.add(
            "train_loss", {"step": step, "tokens": 100 * step, "flop": flop, "wall": WALL0 + step}, 4.0 / step
        )
    entry = series_columns(model_with(history), "train_loss")
    assert entry == {
        "v": [4, 2, 1.33333],  # 4/1, 4/2, 4/3 to six significant digits
        "x": {"step": [1, 2, 3], "tokens": [100, 200, 300], "wall": [WALL0 + 1, WALL0 + 2, WALL0 + 3]},
        "own": {"flop": {"x": [1200, 1800], "v": [2, 1.33333]}},
    }


def test_a_long_series_is_carried_at_the_pages_resolution_with_the_min_max_and_count_of_each_point():
    history = History()
    for i in range(1, 2401):
        history.add("tm:tokens_per_s", {"step": i, "wall": WALL0 + i}, float(i % 4))
    entry = series_columns(model_with(history), "tm:tokens_per_s")
    # 2,400 points in 600 groups of 4: each group holds values 1, 2, 3, 0 (i % 4 for i = 4k+1 .. 4k+4), so its mean is
    # 6 / 4 = 1.5, its min 0 and its max 3; its x is the group's last step, 4k + 4.
    assert entry["v"] == [1.5] * 600 and entry["lo"] == [0] * 600 and entry["hi"] == [3] * 600
    assert entry["n"] == [4] * 600
    assert entry["x"]["step"] == list(range(4, 2401, 4))
    assert set(entry["x"]) == {"step", "wall"}  # no tokens or FLOPs were known: those axes have no points


def test_the_report_carries_the_live_pages_first_document_the_run_and_a_passport(tmp_path):
    from trainmeter_web.follow import finished_dashboard

    run_dir = tmp_path / "runs" / "20260101T000000Z-host-demo"
    write_run(run_dir, 5, ended=True)
    model = finished_dashboard(run_dir)
    data = report_data(model, WALL0 + 100)
    assert data["written_wall"] == WALL0 + 100 and data["points"] == 600
    assert data["doc"]["status"]["state"] == "finished" and data["doc"]["snapshot"]["steps"] == 5
    assert data["run"]["name"] == "demo"
    # No passport.md in the run directory: the passport is made from the final snapshot, as the launcher makes it.
    assert data["passport"]["markdown"].startswith("# Run passport")
    assert data["series"]["train_loss"]["x"]["step"] == [1, 2, 3, 4, 5]  # a bare `loss` is the train loss
    assert data["series"]["train_loss"]["v"] == [1, 0.5, 0.333333, 0.25, 0.2]
    (run_dir / "passport.md").write_text("# the run's own passport\n")
    # the run's own passport, then where its paid time went (model/paid_time), as tm runs RUN says it
    markdown = report_data(model, WALL0)["passport"]["markdown"]
    assert markdown.startswith("# the run's own passport\n\n## Paid time\n")
    assert "- Money: n/a (no price given: --price-per-gpu-hour" in markdown


# ----------------------------------------------------------------------------------------------------------------------
# The command


def test_tm_report_writes_one_file_named_after_the_run(tm_env, tmp_path):
    run_dir = Path(tm_env["TM_RUNS_DIR"]) / "20260101T000000Z-host-demo"
    write_run(run_dir, 3, ended=True)
    result = run_tm(["report"], tm_env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    written = tmp_path / "20260101T000000Z-host-demo-report.html"
    assert result.stderr.startswith(f"tm: wrote {written} (") and result.stderr.count("\n") == 1
    assert written.read_text().startswith("<!doctype html>")
    to_stdout = run_tm(["report", "demo", "-o", "-"], tm_env, cwd=tmp_path)
    assert to_stdout.returncode == 0 and to_stdout.stdout.startswith("<!doctype html>")
    assert to_stdout.stderr == ""


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda runs: None, "no run matches 'nothing-like-this'"),
        (lambda runs: (runs / "x").mkdir(parents=True), "no run matches 'nothing-like-this'"),
    ],
)
def test_tm_report_of_a_run_that_is_not_there_is_one_line_and_status_2(tm_env, tmp_path, make, said):
    make(Path(tm_env["TM_RUNS_DIR"]))
    result = run_tm(["report", "nothing-like-this"], tm_env, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("tm: ") and said in result.stderr and result.stderr.count("\n") == 1


def test_tm_report_of_a_log_with_no_usable_record_is_one_line_and_status_2(tm_env, tmp_path):
    run_dir = Path(tm_env["TM_RUNS_DIR"]) / "20260101T000000Z-host-broken"
    run_dir.mkdir(parents=True)
    (run_dir / "meta.json").write_text(json.dumps({"name": "broken"}))
    (run_dir / "events-0001.jsonl").write_bytes(b'\x00\xff not json\n{"kind": 3}\n')
    result = run_tm(["report", str(run_dir)], tm_env, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == f"tm: {run_dir.name} has no record the engine can use: nothing to report\n"
    assert not list(tmp_path.glob("*.html"))


def test_tm_report_into_a_folder_that_does_not_exist_is_one_line_and_status_2(tm_env, tmp_path):
    run_dir = Path(tm_env["TM_RUNS_DIR"]) / "20260101T000000Z-host-demo"
    write_run(run_dir, 3, ended=True)
    result = run_tm(["report", "-o", str(tmp_path / "no" / "such" / "r.html")], tm_env, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "cannot write" in result.stderr and "pass -o FILE" in result.stderr


@pytest.mark.heavy
@pytest.mark.xdist_group("heavy")
def test_a_week_long_run_makes_a_report_of_at_most_5_mb(tm_env, tmp_path):
    run_dir = tmp_path / "week"
    subprocess.run(
        [sys.executable, str(REPO / "tests" / "scripts" / "week_run.py"), str(run_dir)], check=True
    )
    out = tmp_path / "week.html"
    result = run_tm(["report", str(run_dir), "-o", str(out)], tm_env, timeout=300)
    assert result.returncode == 0, result.stderr
    size_b = out.stat().st_size
    assert size_b <= 5_000_000, f"{size_b / 1e6:.2f} MB"
    html = out.read_text()
    data = json.loads(
        re.search(r'<script type="application/json" id="tm-data">(.*?)</script>', html, re.S).group(1)
    )
    # 3 loop series, 8 ranks, 11 metrics and 6 counters on each of 8 GPUs, and the validation loss: 71 series, each at
    # the page's resolution on every axis; the loss's step axis reaches the last step, (7 days) / 0.6048 s = 1,000,000.
    assert len(data["series"]) == 71
    for name, entry in data["series"].items():
        assert set(entry["x"]) == {"step", "tokens", "flop", "wall"}, name
        assert all(len(xs) <= 600 for xs in entry["x"].values()), name
    assert data["series"]["train_loss"]["x"]["step"][-1] == 1_000_000
