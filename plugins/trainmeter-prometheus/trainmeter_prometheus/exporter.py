"""The exporter: a bus component that keeps the run's latest numbers and serves them on /metrics over HTTP, in the
OpenMetrics text format or the Prometheus text format 0.0.4, whichever the scraper's Accept header asks for.

It runs in a process of its own (tm gives every plugin's component one). One thread reads the bus into the state,
prometheus-client's HTTP server thread builds the families from it on each scrape; a lock keeps each scrape to one
instant. It listens on loopback unless the user named another address, and never on a port nobody asked for.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server

from trainmeter_core.api import ComponentContext, Notice, Sink, money
from trainmeter_prometheus import settings as settings_mod
from trainmeter_prometheus.families import families
from trainmeter_prometheus.identity import Identity, identity, scheduler_labels
from trainmeter_prometheus.state import KINDS, ExporterState

#: The run directory's alert file (written by tm's own file sink; the run log holds the same lines).
ALERTS_FILE = "alerts.jsonl"


class RunCollector:
    """A prometheus-client collector: on each scrape, every family from the state as it is at that instant."""

    def __init__(
        self,
        state: ExporterState,
        lock: threading.Lock,
        who: Identity,
        about: Mapping[str, str],
        clock: Callable[[], float] = time.monotonic,
        price: money.Price | None = None,
    ) -> None:
        self.state, self.lock, self.who, self.about, self.clock = state, lock, who, about, clock
        self.price = price  # held here only: never published, never written

    def collect(self):
        with self.lock:
            return list(families(self.state, self.who, self.clock(), self.about, self.price))


def registry_for(collector: RunCollector) -> CollectorRegistry:
    # Our own registry: the exporter's process and garbage-collector metrics are not the run's numbers.
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def restore_alerts(state: ExporterState, run_dir: Path) -> None:
    """The alerts that fired before the exporter started (or before it was restarted), from ``alerts.jsonl``."""
    try:
        lines = (Path(run_dir) / ALERTS_FILE).read_bytes().splitlines()
    except OSError:
        return  # no alert yet
    for line in lines:
        try:
            document = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash
        if isinstance(document, dict):
            state.alert_line(document)


class PrometheusExporter(Sink):
    name = "prometheus"
    subscribes = KINDS
    shared = False

    def run(self, ctx: ComponentContext) -> None:
        try:
            settings = settings_mod.from_env()
        except settings_mod.SettingsError as exc:
            say(ctx, f"prometheus exporter off: {exc}", "error")
            return idle(ctx)
        if settings is None:
            return
        state = ExporterState()
        lock = threading.Lock()
        meta = ctx.meta
        about = {
            "run_id": str(meta.get("run_id") or ""),
            "run_name": str(meta.get("name") or ""),
            "tm_version": str(meta.get("tm_version") or ""),
            **scheduler_labels(meta),  # Slurm's and the Kubernetes pod's ids, where the run read them
        }
        with lock:  # the subscription is already open: an alert both here and on the bus counts once
            restore_alerts(state, ctx.run_dir)
        collector = RunCollector(state, lock, identity(meta), about, price=settings.price)
        try:
            server, _thread = start_http_server(settings.port, settings.host, registry_for(collector))
        except OSError as exc:
            why = exc.strerror or str(exc)
            say(
                ctx,
                f"prometheus exporter off: cannot listen on {settings.host} port {settings.port} ({why}): "
                "pass another --prometheus-port or --prometheus-host",
                "error",
            )
            return idle(ctx)
        say(ctx, f"prometheus: /metrics at {settings.url(server.server_address[1])}", "info")
        try:
            for record in ctx.records(0.5):
                with lock:
                    state.feed(record, time.monotonic())
        finally:
            server.shutdown()
            server.server_close()


def idle(ctx: ComponentContext) -> None:
    """Off for this run, said once: wait for the run's end, reading nothing into anything. Returning early would
    read as a crash to tm's supervisor, which would restart the exporter to fail (and say so) again."""
    for _record in ctx.records(0.5):
        pass


def say(ctx: ComponentContext, message: str, level: str = "warning") -> None:
    """A notice on the bus (so the run log and the dashboard have it) and one line on tm's stderr."""
    ctx.publish(Notice(level=level, topic="prometheus", message=message))  # type: ignore[arg-type]
    try:
        sys.stderr.write(f"tm: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
