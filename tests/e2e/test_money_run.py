"""Money on a real run (issue 44, item 3): a price given by every source at once (``--price-per-gpu-hour``,
``TM_PRICE_PER_GPU_HOUR``, tm.toml's ``price_per_gpu_hour``, the exporter's ``--prometheus-price-per-gpu-hour``) shows
in the live dashboard and on /metrics with its source, in ``tm view --json``, ``tm report`` and ``tm runs``, and is
found nowhere in the run directory afterwards: not as text, not as a packed double in a binary file.

The run is a loop of ``emit`` steps on a fake H100 (``TM_FAKE_GPUS``), its rank reporting cuda:0 as a torch loop
would, so that the run has GPU-hours to price."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import struct
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from tm_runs import TM, only_run, run_tm

pytestmark = [pytest.mark.heavy, pytest.mark.xdist_group("heavy")]

#: Distinctive digits: no timestamp, count or measurement of the run is likely to hold them.
PRICE = "7.3193"
LOOP = """
import sys, time
from pathlib import Path
import trainmeter_agent
from trainmeter_agent import emit

stop = Path(sys.argv[1])
deadline = time.monotonic() + 90
step = 0
while not stop.exists() and time.monotonic() < deadline:
    step += 1
    emit(step=step, tokens=1000)
    if step == 1:
        # The rank computes on the fake node's GPU 0, as a torch loop on cuda:0 says.
        trainmeter_agent._process_agent.fact("device", {"type": "cuda", "index": 0}, "model")
    time.sleep(0.1)
"""


class Lines:
    """Every line of a pipe, read by a thread of its own as it comes."""

    def __init__(self, pipe) -> None:
        self.lines: list[str] = []
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe) -> None:
        for line in pipe:
            self.lines.append(line.rstrip("\n"))

    def wait(self, pattern: str, timeout_s: float = 60.0) -> re.Match:
        regex = re.compile(pattern)
        return poll(
            lambda: next((m for m in map(regex.search, list(self.lines)) if m), None), timeout_s, pattern
        )


def poll(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def money_of_state(url: str) -> dict | None:
    """The dashboard's money document once its spent figure has a value."""
    doc = json.loads(fetch(url + "api/state"))
    money = doc.get("money") or {}
    return money if "value" in (money.get("figures") or {}).get("spent", {}) else None


def money_on(metrics_url: str) -> str | None:
    """The /metrics text once it holds money spent."""
    text = fetch(metrics_url)
    return text if "trainmeter_money_spent{" in text else None


def holds_price(path: Path) -> str | None:
    """Where in ``path`` the price is, as text or as a packed double (either byte order), gzip opened; None if not."""
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    for needle in (PRICE.encode(), struct.pack("<d", float(PRICE)), struct.pack(">d", float(PRICE))):
        if needle in raw:
            return f"{path.name} holds {needle!r}"
    return None


def test_a_price_from_every_source_shows_in_every_view_and_nowhere_in_the_run_directory(tmp_path, tm_env):
    loop, stop = tmp_path / "loop.py", tmp_path / "stop"
    loop.write_text(LOOP)
    (tmp_path / "tm.toml").write_text(
        f'price_per_gpu_hour = {PRICE}\nprice_currency = "EUR"\nbudget_tokens = 1e6\n'
    )
    env = dict(tm_env, TM_FAKE_GPUS="1xH100", TM_PRICE_PER_GPU_HOUR=PRICE)
    prometheus = importlib.util.find_spec("trainmeter_prometheus") is not None
    exporter = ["--prometheus-port", "0", "--prometheus-price-per-gpu-hour", PRICE] if prometheus else []
    tm = subprocess.Popen(
        [TM, "--price-per-gpu-hour", PRICE, *exporter, str(loop), str(stop)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        err = Lines(tm.stderr)
        dashboard = err.wait(r"^tm: dashboard (http://localhost:\d+/)$").group(1)
        # The live dashboard: the flag's price (it beats the environment and tm.toml), money spent as it grows.
        money = poll(lambda: money_of_state(dashboard), 60, "money spent on the dashboard")
        assert money["price"]["source"] == "--price-per-gpu-hour"
        assert (
            money["price"]["words"]
            == f"price {PRICE} USD/GPU-h from --price-per-gpu-hour (no currency given: USD by default)"
        )
        assert money["figures"]["spent"]["value"] > 0
        if prometheus:
            metrics = err.wait(r"^tm: prometheus: /metrics at (http://127\.0\.0\.1:\d+/metrics)$").group(1)
            source = 'price_source="TM_PROMETHEUS_PRICE_PER_GPU_HOUR (--prometheus-price-per-gpu-hour)"'
            text = poll(lambda: money_on(metrics), 60, "money on /metrics")
            (rate,) = [
                line for line in text.splitlines() if line.startswith("trainmeter_money_price_per_gpu_hour{")
            ]
            assert source in rate and rate.endswith(f" {PRICE}")
    finally:
        stop.touch()
        tm.wait(60)
    assert tm.returncode == 0
    run = only_run(tmp_path / "runs")
    # The views, each from its own source: tm.toml in the working folder, the environment, the flag.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    no_env = {k: v for k, v in env.items() if k != "TM_PRICE_PER_GPU_HOUR"}
    from_toml = json.loads(run_tm(["view", "--json", str(run)], no_env, cwd=tmp_path).stdout)
    assert from_toml["money"]["price"]["source"] == f"tm.toml price_per_gpu_hour ({tmp_path / 'tm.toml'})"
    assert from_toml["money"]["price"]["currency"] == "EUR"
    from_env = json.loads(run_tm(["view", "--json", str(run)], env, cwd=outside).stdout)
    assert from_env["money"]["price"]["source"] == "TM_PRICE_PER_GPU_HOUR"
    spent = from_env["money"]["figures"]["spent"]
    # GPU-hours of the final snapshot × the price
    assert spent["value"] == pytest.approx(from_env["metrics"]["gpu_hours"]["value"] * float(PRICE))
    assert "money" not in json.loads(run_tm(["view", "--json", str(run)], no_env, cwd=outside).stdout)
    report = run_tm(
        ["report", str(run), "-o", str(outside / "r.html"), "--price-per-gpu-hour", PRICE], no_env
    )
    assert report.returncode == 0, report.stderr
    assert f"price {PRICE} USD/GPU-h from --price-per-gpu-hour" in (outside / "r.html").read_text()
    runs = run_tm(["runs", "--price-per-gpu-hour", PRICE], no_env, cwd=outside).stdout
    assert re.search(rf"{run.name} .* \d+\.\d+ USD", runs), runs
    # Nothing of it in the run directory: log, meta.json, summary.json, passport, alerts, checkpoint, anything.
    found = [where for path in sorted(run.rglob("*")) if path.is_file() and (where := holds_price(path))]
    assert found == []


def test_tm_view_serves_a_finished_runs_dashboard_with_money_at_the_viewers_price(tm_env, tmp_path):
    env = {k: v for k, v in tm_env.items() if "PRICE" not in k}
    run = Path(__file__).parents[1] / "fixtures" / "real" / "h200-nanogpt-kill"
    view = subprocess.Popen(
        [TM, "view", str(run), "--port", "0", "--price-per-gpu-hour", PRICE, "--price-currency", "EUR"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = Lines(view.stderr).wait(r"^tm: dashboard (http://localhost:\d+/)").group(1)
        money = poll(lambda: money_of_state(url), 60, "money on the dashboard")
        snapshot = json.loads(fetch(url + "api/snapshot"))
        assert money["price"]["words"] == f"price {PRICE} EUR/GPU-h from --price-per-gpu-hour"
        # the run's GPU-hours (1 H200 for its elapsed time) × the price
        assert money["figures"]["spent"]["value"] == pytest.approx(
            snapshot["metrics"]["gpu_hours"]["value"] * float(PRICE)
        )
        assert money["figures"]["to_finish"]["absent"] == "the run has ended"
        assert "money" not in snapshot  # the snapshot itself never holds money
    finally:
        view.terminate()
        view.wait(30)
