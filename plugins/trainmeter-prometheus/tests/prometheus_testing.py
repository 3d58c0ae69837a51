"""What the exporter's tests share: a run's records made by hand, the exposition read back into samples, and a real
Prometheus server (Debian's ``prometheus`` package) started on loopback with its own config and data folder.

A module with a name of its own rather than a conftest.py: tm's suite collects these tests beside its own ``tests/``,
where several conftest.py files make ``from conftest import`` ambiguous (tm's helpers have names of their own too).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from trainmeter_prometheus.exporter import RunCollector, registry_for
from trainmeter_prometheus.identity import Identity
from trainmeter_prometheus.state import ExporterState

from trainmeter_core.api import records

WHO = Identity(job="20261201T000000Z-n1-train", node="n1")
ABOUT = {"run_id": "20261201T000000Z-n1-train", "run_name": "train", "tm_version": "0.1.0"}


def wait_for(predicate: Callable[[], object], timeout_s: float = 30.0, what: str = "condition") -> object:
    """Poll until ``predicate`` returns something truthy; fail with ``what`` after the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def registry(state: ExporterState, now_s: float = 0.0) -> CollectorRegistry:
    import threading

    return registry_for(RunCollector(state, threading.Lock(), WHO, ABOUT, clock=lambda: now_s))


def text(state: ExporterState, now_s: float = 0.0) -> str:
    """The Prometheus text exposition (0.0.4) of ``state``."""
    return generate_latest(registry(state, now_s)).decode()


def openmetrics(state: ExporterState, now_s: float = 0.0) -> str:
    return generate_openmetrics(registry(state, now_s)).decode()


def samples(exposition: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a text exposition: (name, its labels less job) -> value; job is checked once elsewhere."""
    out = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            labels = dict(sample.labels)
            assert labels.pop("job") == WHO.job, sample
            out[(sample.name, frozenset(labels.items()))] = sample.value
    return out


def key(name: str, **labels: str) -> tuple[str, frozenset]:
    return name, frozenset({"node": WHO.node, **labels}.items())


def snapshot(**metrics: records.MetricValue) -> records.Snapshot:
    """A running snapshot at tick 7 with the given metrics (anything not given is simply not there)."""
    return records.Snapshot(
        tick=7, t=100.0, wall=1_796_000_000.0, state="running", elapsed_s=12.5, steps=40, metrics=metrics
    )


# ---------------------------------------------------------------------------------------------------------------------
# A real Prometheus server


def require_prometheus() -> tuple[str, str]:
    """The paths of ``prometheus`` and ``promtool``, or a failure when CI installed them (TM_REQUIRE_PROMETHEUS=1),
    or a skip that says how to install them."""
    found = shutil.which("prometheus"), shutil.which("promtool")
    if all(found):
        return found  # type: ignore[return-value]
    missing = " and ".join(n for n, p in zip(("prometheus", "promtool"), found, strict=True) if p is None)
    if os.environ.get("TM_REQUIRE_PROMETHEUS") == "1":
        pytest.fail(
            f"{missing} required here (TM_REQUIRE_PROMETHEUS=1) but not on PATH: ./scripts/setup-prometheus"
        )
    pytest.skip(f"{missing} not installed: ./scripts/setup-prometheus installs Debian's prometheus package")


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process ``pid`` listens on, read from /proc (its sockets' inodes, then the kernel's tables)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: TCP_LISTEN
                ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


class Prometheus:
    """``prometheus`` on 127.0.0.1 (a port the kernel picks), scraping ``target`` every second with the scrape
    config docs/multinode.md documents; its config, data and log in ``folder``."""

    def __init__(self, folder: Path, target: str, binary: str) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "scrape_configs:\n"
            "  - job_name: trainmeter\n"
            "    honor_labels: true\n"
            "    static_configs:\n"
            f"      - targets: ['{target}']\n"
        )
        self.log_path = folder / "prometheus.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'data'}",
                "--web.listen-address=127.0.0.1:0",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=folder,
        )
        ports = wait_for(self._ports, 60, "prometheus to listen")
        self.url = f"http://127.0.0.1:{ports[0]}"
        wait_for(self._ready, 60, "prometheus to be ready")

    def _ports(self) -> list[int]:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"prometheus exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}"
            )
        return listening_ports(self.proc.pid)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    def query(self, promql: str) -> dict:
        """An instant query through the HTTP API: its ``data`` (resultType and result)."""
        address = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        try:
            with urllib.request.urlopen(address, timeout=10) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as exc:  # a bad query: Prometheus says why in the body
            raise AssertionError(f"{promql!r}: HTTP {exc.code}: {exc.read().decode()}") from None
        assert answer["status"] == "success", answer
        return answer["data"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def full_state() -> ExporterState:
    """A state in which every family has a sample: a range and a chosen convention, two GPUs, an alert, bus stats."""
    state = ExporterState()
    metrics = {
        "mfu": records.MetricValue(low=0.29, high=0.34, label="datasheet"),
        "mfu_avg": records.MetricValue(value=0.31, convention="titan", label="measured"),
        "flop_per_token": records.MetricValue(low=7.4e8, high=8.6e8),
        "spent_flop": records.MetricValue(low=3.6e15, high=4.2e15),
        "required_flop": records.MetricValue(value=1.2e18, convention="declared"),
        "flop_per_token.titan": records.MetricValue(value=8.5e8, convention="titan"),
        "flop_per_token.counted": records.MetricValue(value=8.7e8, convention="counted", label="counted"),
        "gpu_power_throttle.n1/gpu0": records.MetricValue(value=1.0),
        "gpu_thermal_throttle.n1/gpu0": records.MetricValue(value=0.0),
        "gpu_lost.n1/gpu0": records.MetricValue(value=0.0),
        "gpu_xid.n1/gpu0": records.MetricValue(value=2.0),
    }
    for name, value in {
        "tokens_per_s": 388343.8,
        "step_time_s": 0.042,
        "step_time_median_s": 0.0425,
        "since_step_s": 0.8,
        "progress": 0.25,
        "eta_s": 3600.0,
        "ofu": 0.3,
        "observed_flop": 1e15,
        "goodput": 0.9,
        "straggler_spread": 0.05,
        "energy_j": 10241.0,
        "host_cpu_cores": 1.0,
        "host_rss_b": 1.3e9,
        "child_alive": 1.0,
        "loss_nonfinite": 0.0,
    }.items():
        metrics[name] = records.MetricValue(value=value)
    state.feed(
        records.Snapshot(
            tick=26,
            t=340.0,
            wall=1_796_000_000.0,
            elapsed_s=300.0,
            steps=301,
            tokens=4931584,
            metrics=metrics,
            ranks=[records.RankStat(rank=0, host="n1", steps=301, step_time_s=0.042, device="n1/gpu0")],
            series={
                "train_loss": records.SeriesPoint(
                    canonical="train_loss", raw_key="loss", value=2.71, step=301, origin="backward"
                ),
                "lr": records.SeriesPoint(canonical="lr", raw_key="lr", value=3e-4, step=301, origin="emit"),
            },
        )
    )
    for index in (0, 1):
        state.feed(
            records.SampleGpu(
                host="n1",
                index=index,
                uuid=f"GPU-{index}",
                name="NVIDIA H200",
                util_gpu=0.97,
                util_mem=0.4,
                mem_used_b=2**34,
                mem_total_b=2**37,
                power_w=680.0,
                power_limit_w=700.0,
                energy_j=5e6,
                temp_c=61.0,
                clock_sm_mhz=1980.0,
                clock_sm_max_mhz=1980.0,
                clock_mem_mhz=3201.0,
                pcie_tx_bps=1e9,
                pcie_rx_bps=2e9,
                nvlink_tx_bps=3e10,
                nvlink_rx_bps=3e10,
                ecc_corrected=0,
                ecc_uncorrected=0,
                sm_active=0.85,
                sm_occupancy=0.4,
                tensor_active=0.32,
                dram_active=0.43,
            ),
        )
    state.feed(records.Alert(seq=9, rule="gpu_throttle", state="fired", message="power", subject="n1/gpu0"))
    state.feed(records.BusStats(received=9000, published=9000, malformed=0, unknown=0, log_bytes=2**20))
    state.feed(records.Step(host="n1", step=301, agent_us=41.0))
    state.feed(records.Component(name="web", event="crashed", process="web"))
    return state


# ---------------------------------------------------------------------------------------------------------------------
# What docs/multinode.md documents

MULTINODE = Path(__file__).resolve().parents[3] / "docs" / "multinode.md"


def documented(language: str) -> list[str]:
    """The fenced code blocks of docs/multinode.md in ``language`` (``yaml``, ``promql``), in order."""
    import re

    return re.findall(rf"^```{language}\n(.*?)^```$", MULTINODE.read_text(), flags=re.S | re.M)
