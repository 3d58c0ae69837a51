"""End to end: this folder installed with pip (into the test's own directory), tm running a small torch loop with
``--prometheus-port 0``, and a real Prometheus server (Debian's package) scraping it every second. What Prometheus
stored, read back through its HTTP API, equals the engine's snapshots of the ticks the exporter reported (captured by
an independent subscriber, ``tm tail``); promtool accepts the live text exposition and the OpenMetrics parser reads
the live OpenMetrics one. A port already taken is one line and the run goes on."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_testing import Prometheus, documented, require_prometheus, wait_for

PLUGIN = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TM = str(BIN / "tm") if (BIN / "tm").exists() else shutil.which("tm")
# Steps until the test touches the stop file (or 150 s pass): the test, not a step count, decides how long it runs.
TORCH_LOOP = """
import sys, time
from pathlib import Path
import torch
from trainmeter_agent import emit
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Flatten(), torch.nn.Linear(32 * 16, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
stop = Path(sys.argv[1])
deadline = time.monotonic() + 150
step = 0
while not stop.exists() and time.monotonic() < deadline:
    x = torch.randint(0, 64, (8, 16))
    loss = torch.nn.functional.cross_entropy(model(x), x[:, 0])
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    emit(train_loss=loss.item())
    if step % 10 == 0:
        with torch.no_grad():
            x = torch.randint(0, 64, (8, 16))
            emit(**{"eval/loss": torch.nn.functional.cross_entropy(model(x), x[:, 0]).item()})
    time.sleep(0.05)
"""
EMIT_LOOP = """
import time
from trainmeter_agent import emit
for i in range(1, 21):
    emit(step=i, tokens=256)
    time.sleep(0.1)
"""
# Steps until the test touches the stop file (or 120 s pass), with no torch.
STOP_LOOP = """
import sys, time
from pathlib import Path
from trainmeter_agent import emit
stop, deadline, step = Path(sys.argv[1]), time.monotonic() + 120, 0
while not stop.exists() and time.monotonic() < deadline:
    step += 1
    emit(step=step, tokens=256)
    time.sleep(0.05)
"""
# Declared so that MFU is known on a CPU: the shape gives titan's FLOPs per token (6(N-E) + 12·L·d·T), the peak is
# declared for the CPU device the model's parameters live on.
DECLARED = [
    "--tokens-per-step",
    "128",
    "--params",
    "40000",
    "--layers",
    "1",
    "--d-model",
    "32",
    "--seq-len",
    "16",
    "--convention",
    "titan",
    "--peak-tflops",
    "0.001",
    "--peak-source",
    "a figure for this test",
]


def require_torch() -> None:
    if importlib.util.find_spec("torch") is not None:
        return
    if os.environ.get("TM_REQUIRE_TORCH") == "1":
        pytest.fail("torch is required here (TM_REQUIRE_TORCH=1) but is not installed")
    pytest.skip("torch is not installed; ./scripts/setup installs it")


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
    assert (target / "trainmeter_prometheus" / "exporter.py").exists()
    return target


def tm_env(tmp_path: Path, site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TM_", "LOCAL_RANK"))}
    env.update(
        PYTHONPATH=str(site),
        TM_RUNS_DIR=str(tmp_path / "runs"),
        TM_DISABLE_COMPONENTS="web",
        OMP_NUM_THREADS="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


class Lines:
    """Every line of a pipe, read by a thread of its own as it comes."""

    def __init__(self, pipe) -> None:
        self.lines: list[str] = []
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe) -> None:
        for line in pipe:
            self.lines.append(line.rstrip("\n"))

    def wait(self, pattern: str, timeout_s: float = 90.0) -> re.Match:
        regex = re.compile(pattern)
        return wait_for(
            lambda: next((m for m in map(regex.search, list(self.lines)) if m), None),
            timeout_s,
            repr(pattern),
        )


def get(url: str, accept: str | None = None) -> tuple[str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.headers["Content-Type"], response.read().decode()


def listening_address(port: int) -> str:
    """The local address of the TCP socket listening on ``port`` in this network namespace (from /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, hex_port = fields[1].split(":")
        if fields[3] == "0A" and int(hex_port, 16) == port:
            return socket.inet_ntoa(bytes.fromhex(address)[::-1])  # little-endian on x86 and arm64
    raise AssertionError(f"nothing listens on TCP port {port}")


def stored(prometheus: Prometheus, selector: str) -> dict[str, list[tuple[float, float]]]:
    """Every raw sample Prometheus stored for ``selector`` over the last 10 minutes: series (labels as JSON) ->
    [(scrape timestamp, value)]."""
    data = prometheus.query(f"{selector}[10m]")
    assert data["resultType"] == "matrix"
    return {
        json.dumps(series["metric"], sort_keys=True): [(float(t), float(v)) for t, v in series["values"]]
        for series in data["result"]
    }


@pytest.mark.heavy
@pytest.mark.xdist_group("heavy")
def test_a_real_prometheus_scrapes_the_run_and_stores_the_snapshots_tokens_per_s_and_mfu(tmp_path, site):
    binary, promtool = require_prometheus()
    require_torch()
    loop, stop = tmp_path / "loop.py", tmp_path / "stop"
    loop.write_text(TORCH_LOOP)
    env = tm_env(tmp_path, site, TM_FAKE_GPUS="1xH100")  # a fake GPU, so the per-device families are live too
    tm = subprocess.Popen(
        [TM, "--prometheus-port", "0", *DECLARED, str(loop), str(stop)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    prometheus = tail = None
    try:
        err = Lines(tm.stderr)
        run_id, runs = err.wait(r"^tm: run (\S+) in (.+)$").groups()
        url = err.wait(r"^tm: prometheus: /metrics at (http://127\.0\.0\.1:\d+/metrics)$").group(1)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert listening_address(port) == "127.0.0.1"  # loopback: nothing was said about another address
        # An independent subscriber keeps every live snapshot, by tick.
        tail = subprocess.Popen(
            [TM, "tail", str(Path(runs) / run_id), "--kind", "snapshot"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        snapshots = Lines(tail.stdout)
        snapshots.wait(r'"kind":"snapshot"')
        prometheus = Prometheus(tmp_path / "prometheus", f"127.0.0.1:{port}", binary)

        def mfu_scrapes() -> int:
            return sum(len(values) for values in stored(prometheus, "trainmeter_mfu_ratio").values())

        wait_for(lambda: mfu_scrapes() >= 4, 120, "four scrapes with an MFU")
        # MFU first: every scrape it holds is then also in the two later answers (scrapes go on meanwhile)
        mfus = stored(prometheus, "trainmeter_mfu_ratio")
        rates = stored(prometheus, "trainmeter_tokens_per_second")
        ticks = stored(prometheus, "trainmeter_snapshot_tick")
        (mfu_series,) = mfus  # one series: a chosen convention is one sample
        assert json.loads(mfu_series) == {
            "__name__": "trainmeter_mfu_ratio",
            "job": run_id,
            "node": socket.gethostname(),
            "instance": f"127.0.0.1:{port}",
            "convention": "titan",
            "bound": "value",
            "peak": "declared",
        }
        (tick_values,), (rate_values,), (mfu_values,) = ticks.values(), rates.values(), mfus.values()
        tick_at, rate_at, mfu_at = dict(tick_values), dict(rate_values), dict(mfu_values)

        def captured() -> dict[int, dict]:
            return {s["tick"]: s["metrics"] for s in map(json.loads, list(snapshots.lines))}

        def captured_series() -> dict[int, dict]:
            return {s["tick"]: s.get("series", {}) for s in map(json.loads, list(snapshots.lines))}

        first_seen = min(captured())
        compared = 0
        for scraped_t, mfu in sorted(mfu_at.items()):
            tick = int(tick_at[scraped_t])  # the tick of the same scrape: same timestamp
            if tick < first_seen:
                continue  # published before tm tail subscribed
            metrics = wait_for(lambda t=tick: captured().get(t), 30, f"snapshot {tick} from tm tail")
            expected_rate, expected_mfu = metrics["tokens_per_s"]["value"], metrics["mfu"]["value"]
            assert abs(rate_at[scraped_t] - expected_rate) <= 0.01 * expected_rate, (tick, rate_at[scraped_t])
            assert abs(mfu - expected_mfu) <= 0.01 * expected_mfu, (tick, mfu)
            assert metrics["mfu"]["convention"] == "titan" and metrics["mfu"]["label"] == "declared"
            compared += 1
        assert compared >= 3, (sorted(tick_at.values()), first_seen)
        # The losses the loop emitted, each with its series and origin: what the snapshot of the same tick held.
        wait_for(
            lambda: len(stored(prometheus, "trainmeter_loss")) == 2, 60, "the train and validation losses"
        )
        losses = {json.loads(labels)["series"]: (json.loads(labels), values) for labels, values in stored(
            prometheus, "trainmeter_loss").items()}  # fmt: skip
        assert set(losses) == {"train_loss", "val_loss"}
        compared = 0
        for name, (labels, values) in losses.items():
            assert labels["origin"] == "emit" and labels["job"] == run_id, labels
            for scraped_t, value in values:
                tick = int(tick_at.get(scraped_t, -1))
                if tick < first_seen:
                    continue  # a scrape after the tick query, or published before tm tail subscribed
                point = wait_for(lambda t=tick: captured_series().get(t), 30, f"snapshot {tick}")[name]
                assert value == point["value"] and point["origin"] == "emit", (name, tick, value, point)
                compared += 1
        assert compared >= 3, losses
        assert prometheus.query("trainmeter_loss_nonfinite_total")["result"][0]["value"][1] == "0"
        # the scrape itself went well, as Prometheus saw it
        assert prometheus.query('up{job="trainmeter"}')["result"][0]["value"][1] == "1"
        # the queries docs/multinode.md documents run, and the first finds this job's MFU
        fleet_mfu, slow_gpus, stale, not_a_number = (
            prometheus.query(q)["result"] for q in documented("promql")
        )
        ((labels, value),) = [(r["metric"], float(r["value"][1])) for r in fleet_mfu]
        assert labels == {"job": run_id, "convention": "titan", "peak": "declared"} and 0 < value < 1
        assert slow_gpus == [] and stale == []  # one GPU is never below its own mean; the numbers are fresh
        assert not_a_number == []  # every loss of this loop is a number
        # the live expositions: promtool accepts the text one, the OpenMetrics parser reads the other
        content_type, body = get(url)
        assert content_type.startswith("text/plain; version=0.0.4")
        checked = subprocess.run(
            [promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "trainmeter_gpu_power_watts{" in body  # the fake GPU's counters, per device
        content_type, body = get(url, "application/openmetrics-text; version=1.0.0")
        assert content_type.startswith("application/openmetrics-text")
        names = {family.name for family in parse_openmetrics(body)}
        assert {"trainmeter_mfu_ratio", "trainmeter_tokens_per_second", "trainmeter_gpu_power_watts"} <= names
    finally:
        stop.touch()
        try:
            tm.wait(120)
        finally:
            if prometheus is not None:
                prometheus.stop()
            if tail is not None:
                tail.wait(30)
    assert tm.returncode == 0


@pytest.mark.heavy
@pytest.mark.xdist_group("heavy")
def test_a_port_already_taken_is_one_line_and_the_run_goes_on(tmp_path, site):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    loop = tmp_path / "loop.py"
    loop.write_text(EMIT_LOOP)
    try:
        done = subprocess.run(
            [TM, "--prometheus-port", str(port), str(loop)],
            env=tm_env(tmp_path, site),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        taken.close()
    assert done.returncode == 0, done.stderr
    line = (
        f"tm: prometheus exporter off: cannot listen on 127.0.0.1 port {port} (Address already in use): "
        "pass another --prometheus-port or --prometheus-host"
    )
    assert line in done.stderr.splitlines() and "Traceback" not in done.stderr
    (run,) = (tmp_path / "runs").iterdir()
    records = [
        json.loads(x) for seg in sorted(run.glob("events-*.jsonl")) for x in seg.read_text().splitlines()
    ]
    assert [r["step"] for r in records if r["kind"] == "step"] == list(range(1, 21))
    (notice,) = [r for r in records if r["kind"] == "notice" and r["topic"] == "prometheus"]
    assert notice["level"] == "error" and notice["message"] == line.removeprefix("tm: ")
    assert not [r for r in records if r["kind"] == "component" and r["event"] == "crashed"]


@pytest.mark.heavy
@pytest.mark.xdist_group("heavy")
def test_a_real_prometheus_stores_the_slurm_and_kubernetes_ids_as_labels_of_the_run_info(tmp_path, site):
    """A run in a test's Slurm step of an array job, in a test's pod: the variables Slurm and the kubelet set, a
    cgroup file of cgroup v2's systemd shape and a namespace file (tm told where they are by its two variables)."""
    binary, _promtool = require_prometheus()
    loop, stop = tmp_path / "loop.py", tmp_path / "stop"
    loop.write_text(STOP_LOOP)
    cgroup, namespace = tmp_path / "cgroup", tmp_path / "namespace"
    cgroup.write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0c3b5e2a_1b2c_4d5e_8f90_123456789abc"
        ".slice/cri-containerd-4f7e.scope\n"
    )
    namespace.write_text("ml-team")
    env = tm_env(
        tmp_path,
        site,
        SLURM_JOB_ID="4242",
        SLURM_STEP_ID="3",
        SLURM_ARRAY_JOB_ID="4240",
        SLURM_ARRAY_TASK_ID="2",
        KUBERNETES_SERVICE_HOST="10.96.0.1",
        HOSTNAME="trainer-0",
        TM_CGROUP_FILE=str(cgroup),
        TM_K8S_NAMESPACE_FILE=str(namespace),
    )
    for name in ("POD_NAME", "POD_NAMESPACE", "POD_UID", "SLURM_JOBID", "SLURM_STEPID"):
        env.pop(name, None)  # the test's own ids only, whatever runs the test
    tm = subprocess.Popen(
        [TM, "--prometheus-port", "0", str(loop), str(stop)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    prometheus = None
    try:
        err = Lines(tm.stderr)
        run_id = err.wait(r"^tm: run (\S+) in (.+)$").group(1)
        url = err.wait(r"^tm: prometheus: /metrics at (http://127\.0\.0\.1:\d+/metrics)$").group(1)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        prometheus = Prometheus(tmp_path / "prometheus", f"127.0.0.1:{port}", binary)
        found = wait_for(
            lambda: prometheus.query("trainmeter_run_info")["result"],
            60,
            "the run's info stored by prometheus",
        )
        ((labels, value),) = [(r["metric"], r["value"][1]) for r in found]
        assert value == "1" and labels["job"] == run_id
        assert {k: labels.get(k) for k in ("slurm_job_id", "slurm_step_id", "slurm_array_job_id",
                                           "slurm_array_task_id", "namespace", "pod", "pod_uid")} == {
            "slurm_job_id": "4242",
            "slurm_step_id": "3",
            "slurm_array_job_id": "4240",
            "slurm_array_task_id": "2",
            "namespace": "ml-team",
            "pod": "trainer-0",
            "pod_uid": "0c3b5e2a-1b2c-4d5e-8f90-123456789abc",
        }  # fmt: skip
        # the join docs/job-identity.md documents: a number of the run by its Slurm job
        joined = wait_for(
            lambda: prometheus.query(
                "trainmeter_steps_total * on(job, node) group_left(slurm_job_id) trainmeter_run_info"
            )["result"],
            60,
            "the steps joined with the run's Slurm job",
        )
        assert [r["metric"]["slurm_job_id"] for r in joined] == ["4242"]
    finally:
        stop.touch()
        try:
            tm.wait(120)
        finally:
            if prometheus is not None:
                prometheus.stop()
    assert tm.returncode == 0


# A loop of emitted steps whose rank computes on the fake node's GPU 0 (as a torch loop on cuda:0 says), until the
# stop file: a run with GPU-hours, so with money, and no torch.
GPU_EMIT_LOOP = """
import sys, time
from pathlib import Path
import trainmeter_agent
from trainmeter_agent import emit
stop = Path(sys.argv[1])
deadline = time.monotonic() + 150
step = 0
while not stop.exists() and time.monotonic() < deadline:
    step += 1
    emit(step=step, tokens=1000)
    if step == 1:
        trainmeter_agent._process_agent.fact("device", {"type": "cuda", "index": 0}, "model")
    time.sleep(0.1)
"""


@pytest.mark.heavy
@pytest.mark.xdist_group("heavy")
def test_a_real_prometheus_stores_money_at_the_exporters_own_price_over_the_runs(tmp_path, site):
    binary, _ = require_prometheus()
    loop, stop = tmp_path / "loop.py", tmp_path / "stop"
    loop.write_text(GPU_EMIT_LOOP)
    # The run's price (the flag) and the exporter's own: the exporter's wins on /metrics.
    env = tm_env(tmp_path, site, TM_FAKE_GPUS="1xH100")
    tm = subprocess.Popen(
        [TM, "--prometheus-port", "0", "--price-per-gpu-hour", "2.49", "--prometheus-price-per-gpu-hour", "7.3193",
         "--prometheus-price-currency", "EUR", str(loop), str(stop)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    prometheus = None
    try:
        err = Lines(tm.stderr)
        run_id = err.wait(r"^tm: run (\S+) in (.+)$").group(1)
        url = err.wait(r"^tm: prometheus: /metrics at (http://127\.0\.0\.1:\d+/metrics)$").group(1)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        prometheus = Prometheus(tmp_path / "prometheus", f"127.0.0.1:{port}", binary)
        wait_for(lambda: len(next(iter(stored(prometheus, "trainmeter_money_spent").values()), [])) >= 3, 120,
                 "three scrapes of money spent")  # fmt: skip
        ((labels, spent),) = stored(prometheus, "trainmeter_money_spent").items()
        assert json.loads(labels) == {
            "__name__": "trainmeter_money_spent",
            "job": run_id,
            "node": socket.gethostname(),
            "instance": f"127.0.0.1:{port}",
            "currency": "EUR",
            "price_source": "TM_PROMETHEUS_PRICE_PER_GPU_HOUR (--prometheus-price-per-gpu-hour)",
        }
        values = [v for _, v in spent]
        assert values == sorted(values) and values[-1] > values[0] > 0  # spent so far grows, live
        (rate,) = stored(prometheus, "trainmeter_money_price_per_gpu_hour").values()
        assert {v for _, v in rate} == {7.3193}
        # Each scrape's spent is that scrape's elapsed time × 1 GPU × the price (GPU-hours of the same snapshot).
        (elapsed,) = stored(prometheus, "trainmeter_elapsed_seconds").values()
        elapsed_at = dict(elapsed)
        for t, value in spent:
            assert value == pytest.approx(elapsed_at[t] / 3600 * 7.3193, rel=1e-9)
    finally:
        stop.touch()
        try:
            tm.wait(120)
        finally:
            if prometheus is not None:
                prometheus.stop()
    assert tm.returncode == 0
