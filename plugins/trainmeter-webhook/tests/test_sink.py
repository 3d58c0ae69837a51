"""End to end: this folder installed with pip (into the test's own directory), tm running a loop whose loss turns NaN,
the alert delivered to a local server in each format; with the server down, retries, a warning, an unaffected run;
and the URL in no file of the run directory."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TM = str(BIN / "tm") if (BIN / "tm").exists() else shutil.which("tm")
SECRET = "T0A1B2C3/B9Z8Y7X6/q1w2e3r4t5y6u7i8"  # shaped like a Slack webhook's secret path
TOKEN = "123456:AAH-test-token-0123456789"
STEPS = 100
# The loss is NaN for 2 s, two snapshot periods: the first check after it turns NaN sees NaN as the latest value (a
# stretch shorter than a period may be over by the check, which then fires on the count alone, another message). The
# steps after it leave the clear time to come (the window a second, the tick a second, 1 s of finite losses) and its
# webhook time for three attempts before the run ends: with 80 steps, it came at the last tick and the sink stopped.
LOOP = f"""
import math, time
from trainmeter_agent import emit
for i in range(1, {STEPS} + 1):
    emit(step=i, tokens=256)
    emit(train_loss=math.nan if 15 <= i < 35 else 1.0 / i)
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The plugin installed from its folder with pip, into a folder of this test's own (put on tm's path)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(PLUGIN),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert (target / "trainmeter_webhook" / "sink.py").exists()
    return target


def run_tm(tmp_path, site, extra_env):
    (tmp_path / "loop.py").write_text(LOOP)
    (tmp_path / "tm.toml").write_text("[alerts.loss_nan]\nclear_after_s = 1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TM_", "LOCAL_RANK"))}
    env.update(
        PYTHONPATH=str(site),
        TM_RUNS_DIR=str(tmp_path / "runs"),
        TM_DISABLE_COMPONENTS="web",
        OMP_NUM_THREADS="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        **extra_env,
    )
    proc = subprocess.run(
        [TM, str(tmp_path / "loop.py")], env=env, capture_output=True, text=True, timeout=180
    )
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    return proc, run


def log(run: Path) -> list[dict]:
    return [
        json.loads(line)
        for seg in sorted(run.glob("events-*.jsonl"))
        for line in seg.read_text().splitlines()
    ]


def assert_no_file_holds(run: Path, *secrets: str) -> None:
    for file in run.rglob("*"):
        if not file.is_file():
            continue
        data = file.read_bytes()
        if file.suffix == ".gz":
            data = gzip.decompress(data)
        text = data.decode("utf-8", "replace")
        for secret in secrets:
            assert secret not in text, f"{file.name} holds a secret"


# Not heavy, nor the test after it: each run waits for its alerts and the sink's deliveries (the file's tests: 7.0 s of
# CPU in 57 s, measured alone), so they run beside the heavy tests instead of holding up their one-at-a-time line.
@pytest.mark.parametrize("fmt", ["json", "slack", "ntfy", "telegram"])
def test_each_alert_reaches_a_local_server_in_each_format(tmp_path, site, receiver, fmt):
    if fmt == "telegram":
        extra = {
            "TM_WEBHOOK_FORMAT": fmt,
            "TM_WEBHOOK_URL": receiver.url(""),
            "TM_WEBHOOK_TOKEN": TOKEN,
            "TM_WEBHOOK_CHAT_ID": "-100777",
        }
    else:
        extra = {"TM_WEBHOOK_FORMAT": fmt, "TM_WEBHOOK_URL": receiver.url(f"/services/{SECRET}")}
    proc, run = run_tm(tmp_path, site, extra)
    assert proc.returncode == 0, proc.stderr
    got = [
        r
        for r in receiver.received
        if b"loss_nan" in r.body or r.headers.get("Title", "").endswith(("fired", "cleared"))
    ]
    assert len(got) == 2, [r.body for r in receiver.received]
    fired, cleared = got
    if fmt == "json":
        assert [r.json()["alert"]["state"] for r in got] == ["fired", "cleared"]
        assert fired.json()["alert"]["numbers"]["train_loss"] == "NaN" and fired.json()["run"] == "loop"
    elif fmt == "slack":
        assert (
            fired.json()["text"].startswith("tm loop on ")
            and ": ALERT loss_nan (critical): " in fired.json()["text"]
        )
        assert ": cleared loss_nan: cleared after " in cleared.json()["text"]
    elif fmt == "ntfy":
        assert (fired.headers["Title"], fired.headers["Priority"]) == ("tm loop: loss_nan fired", "urgent")
        assert fired.body.startswith(b"train_loss is nan") and cleared.headers["Tags"] == "white_check_mark"
    else:
        assert fired.path == f"/bot{TOKEN}/sendMessage" and fired.json()["chat_id"] == "-100777"
    records = log(run)
    assert [(r["rule"], r["state"]) for r in records if r["kind"] == "alert"] == [
        ("loss_nan", "fired"),
        ("loss_nan", "cleared"),
    ]
    meta = json.loads((run / "meta.json").read_text())
    assert any(
        p["name"] == "webhook" and p.get("distribution") == "trainmeter-webhook" for p in meta["plugins"]
    )
    assert meta["env"].get("TM_WEBHOOK_URL") == "***"
    assert_no_file_holds(run, SECRET, TOKEN, receiver.url(""))


def test_with_the_server_down_it_retries_gives_up_with_a_warning_and_the_run_is_unaffected(
    tmp_path, site, closed_url
):
    url = f"{closed_url}/{SECRET}"
    extra = {"TM_WEBHOOK_URL": url, "TM_WEBHOOK_RETRIES": "2", "TM_WEBHOOK_BACKOFF_S": "0.1"}
    proc, run = run_tm(tmp_path, site, extra)
    assert proc.returncode == 0
    records = log(run)
    assert [r["step"] for r in records if r["kind"] == "step"] == list(range(1, STEPS + 1))
    warnings = [r for r in records if r["kind"] == "notice" and r.get("topic") == "webhook"]
    # one per alert (fired, cleared), each after 1 + 2 attempts
    assert [w["message"].split(":")[0] for w in warnings] == [
        "webhook gave up on alert loss_nan fired after 3 attempts",
        "webhook gave up on alert loss_nan cleared after 3 attempts",
    ]
    # "warning" is the notice's default level, so the log line leaves it out
    assert all(w.get("level", "warning") == "warning" and "refused" in w["message"].lower() for w in warnings)
    assert "tm: webhook gave up on alert loss_nan fired after 3 attempts" in proc.stderr
    assert [r["state"] for r in records if r["kind"] == "alert"] == ["fired", "cleared"]  # the alerts stand
    assert not [
        r for r in records if r["kind"] == "component" and r["name"] == "webhook" and r["event"] == "crashed"
    ]
    assert_no_file_holds(run, SECRET, url)
