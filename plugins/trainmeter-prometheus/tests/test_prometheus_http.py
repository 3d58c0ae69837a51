"""/metrics over real HTTP: the Prometheus text format 0.0.4 by default and OpenMetrics when the scraper asks for it;
``promtool check metrics`` accepts the first (every family filled) and prometheus-client's OpenMetrics parser reads
the second."""

from __future__ import annotations

import subprocess
import urllib.request

import pytest
from prometheus_client import start_http_server
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_testing import full_state, registry, require_prometheus
from trainmeter_prometheus.families import FLOP_GAUGES, GPU_GAUGES, GPU_HEALTH, RUN_GAUGES

# Every family families.py writes, all of which full_state fills: the run's info; tick, timestamp, state, elapsed,
# steps and tokens; the run gauges; MFU and its window average; the FLOPs gauges; FLOPs per token per convention;
# per rank step time and steps; the GPU health families and Xid errors; per GPU info, gauges and energy; alerts firing
# and fired; six bus and log counters and the log's size; the agent's seconds and steps; component crashes; the
# losses and the count of non-finite ones.
FAMILIES = (
    1 + 6 + len(RUN_GAUGES) + 2 + len(FLOP_GAUGES) + 1 + 2 + len(GPU_HEALTH) + 1 + 1 + len(GPU_GAUGES) + 1 + 2
)
FAMILIES += 2 + 6 + 1 + 2 + 1

#: What Prometheus 2.42 sends when it scrapes (scrape/scrape.go, scrapeAcceptHeader).
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.fixture(scope="module")
def url():
    server, _ = start_http_server(0, "127.0.0.1", registry(full_state()))
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def get(url: str, accept: str | None = None) -> tuple[str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.headers["Content-Type"], response.read().decode()


def test_the_text_format_0_0_4_is_served_by_default_and_promtool_accepts_it(url):
    _, promtool = require_prometheus()
    content_type, body = get(url)
    assert content_type.startswith("text/plain; version=0.0.4")
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == "" and checked.stderr.strip() == ""  # not even a lint remark
    # 1 + 6 + 14 + 2 + 3 + 1 + 2 + 3 + 1 + 1 + 20 + 1 + 2 + 2 + 6 + 1 + 2 + 1
    assert body.count("# TYPE ") == FAMILIES == 69


def test_openmetrics_is_served_when_asked_for_and_its_parser_reads_every_family(url):
    for accept in ("application/openmetrics-text; version=1.0.0", PROMETHEUS_ACCEPT):
        content_type, body = get(url, accept)
        assert content_type.startswith("application/openmetrics-text; version=1.0.0")
        assert body.endswith("# EOF\n")
        parsed = {family.name: family for family in parse_openmetrics(body)}
        assert len(parsed) == FAMILIES
        assert parsed["trainmeter_run"].type == "info" and parsed["trainmeter_steps"].type == "counter"
        assert parsed["trainmeter_step_time_seconds"].unit == "seconds"
        (tick,) = parsed["trainmeter_snapshot_tick"].samples
        assert tick.value == 26
        ends = {s.labels["bound"]: s.value for s in parsed["trainmeter_mfu_ratio"].samples}
        assert ends == {"low": 0.29, "high": 0.34}
