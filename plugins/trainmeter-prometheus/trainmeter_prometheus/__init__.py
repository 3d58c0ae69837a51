"""trainmeter-prometheus: each node's tm serves its run's numbers on /metrics for Prometheus to scrape."""

__version__ = "0.1.0"
