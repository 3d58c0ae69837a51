"""The scrape configuration docs/multinode.md documents is one promtool accepts, and the page shows the queries the
end-to-end test runs against a real Prometheus."""

from __future__ import annotations

import subprocess

from prometheus_testing import documented, require_prometheus


def test_the_documented_scrape_configuration_passes_promtool_check_config(tmp_path):
    _, promtool = require_prometheus()
    (config,) = documented("yaml")
    assert "honor_labels: true" in config  # the exporter's job label is the training job
    path = tmp_path / "prometheus.yml"
    path.write_text(config)
    checked = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout + checked.stderr


def test_the_page_documents_at_least_two_queries_of_the_exporter_s_families():
    queries = documented("promql")
    assert len(queries) >= 2
    assert all("trainmeter_" in q for q in queries)
