"""The plugin tm loads through the ``trainmeter`` entry point: the exporter sink and its two options.

Nothing in tm names this plugin; installing the distribution is what makes tm find it. The exporter is only listed
when a port was given, so a run without ``--prometheus-port`` starts no process for it and serves nothing.
"""

from __future__ import annotations

from trainmeter_core.api import hookimpl
from trainmeter_prometheus import settings


@hookimpl
def trainmeter_sinks():
    try:
        wanted = settings.from_env() is not None
    except settings.SettingsError:
        wanted = True  # the exporter starts, says what is wrong in one line, and stops
    if not wanted:
        return []  # and prometheus-client is never imported
    from trainmeter_prometheus.exporter import PrometheusExporter

    return [PrometheusExporter]


@hookimpl
def trainmeter_add_options(parser):
    # Each option's dest is the variable it sets, so the component sees options and variables alike.
    group = parser.add_argument_group("prometheus (trainmeter-prometheus)")
    group.add_argument(
        "--prometheus-port",
        dest=settings.PORT_ENV,
        metavar="PORT",
        help="serve the run's numbers on http://HOST:PORT/metrics (0: any free port; off without it)",
    )
    group.add_argument(
        "--prometheus-host",
        dest=settings.HOST_ENV,
        metavar="ADDRESS",
        help=f"the address /metrics listens on (default {settings.DEFAULT_HOST}: this node only)",
    )
    group.add_argument(
        "--prometheus-price-per-gpu-hour",
        dest=settings.PRICE_ENV,
        metavar="PRICE",
        help="the price per GPU-hour money on /metrics is at (beats tm's --price-per-gpu-hour; never stored)",
    )
    group.add_argument(
        "--prometheus-price-currency",
        dest=settings.CURRENCY_ENV,
        metavar="CODE",
        help="that price's currency (default USD)",
    )
