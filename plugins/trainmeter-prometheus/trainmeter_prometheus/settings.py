"""The exporter's settings, read from the environment (tm's ``--prometheus-port`` and ``--prometheus-host`` options set
the same variables). No port, no exporter: nothing is served unless the user asked for it.

Every error is one line naming the variable, its option and what is accepted; nothing here opens a socket.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from trainmeter_core.api import money

PORT_ENV = "TM_PROMETHEUS_PORT"
HOST_ENV = "TM_PROMETHEUS_HOST"
#: The exporter's own price per GPU-hour and its currency: they beat the run's (tm's --price-per-gpu-hour, then
#: TM_PRICE_PER_GPU_HOUR, then tm.toml), for /metrics alone. Held in memory, never written.
PRICE_ENV = "TM_PROMETHEUS_PRICE_PER_GPU_HOUR"
CURRENCY_ENV = "TM_PROMETHEUS_PRICE_CURRENCY"
#: option -> the environment variable it sets (the option's argparse ``dest``)
OPTIONS = {
    "--prometheus-port": PORT_ENV,
    "--prometheus-host": HOST_ENV,
    "--prometheus-price-per-gpu-hour": PRICE_ENV,
    "--prometheus-price-currency": CURRENCY_ENV,
}
#: Loopback unless told otherwise: the numbers of a run leave the node only when the user names another address.
DEFAULT_HOST = "127.0.0.1"


class SettingsError(ValueError):
    """A setting the exporter cannot use: one line naming it and what is accepted."""


@dataclass(frozen=True)
class Settings:
    port: int  # 0: any free port, said at start
    host: str = DEFAULT_HOST
    price: money.Price | None = None  # the price money on /metrics is at; None: no money family

    def url(self, port: int | None = None) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port if port is None else port}/metrics"


def from_env(environ: Mapping[str, str] | None = None) -> Settings | None:
    """The settings, or None when no exporter was asked for (no port). Raises SettingsError."""
    env = os.environ if environ is None else environ
    raw_port = env.get(PORT_ENV, "").strip()
    host = env.get(HOST_ENV, "").strip()
    if not raw_port:
        if host:
            raise SettingsError(
                f"{HOST_ENV} (--prometheus-host) is set but {PORT_ENV} (--prometheus-port) is not: "
                "pass the port to serve /metrics on"
            )
        return None
    try:
        port = int(raw_port)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise SettingsError(
            f"{PORT_ENV} (--prometheus-port) {raw_port!r}: expected a port from 0 to 65535 (0: any free port)"
        )
    if any(c.isspace() for c in host) or "/" in host:
        raise SettingsError(
            f"{HOST_ENV} (--prometheus-host) {host!r}: expected an address to listen on, such as 0.0.0.0"
        )
    return Settings(port=port, host=host.strip("[]") or DEFAULT_HOST, price=price_from_env(env))


def price_from_env(env: Mapping[str, str]) -> money.Price | None:
    """The exporter's own price (``TM_PROMETHEUS_PRICE_PER_GPU_HOUR``, ``--prometheus-price-per-gpu-hour``), else the
    run's as tm handed it on; None without either. Raises SettingsError naming the variable and its option."""
    try:
        own = money.from_environ(env, PRICE_ENV, CURRENCY_ENV)
        if own is not None:
            source = f"{PRICE_ENV} (--prometheus-price-per-gpu-hour)"
            return money.Price(own.per_gpu_hour, own.currency, source, own.currency_given)
        return money.from_environ(env)
    except money.PriceError as exc:
        # The exporter says a bad setting in a notice, which the run log keeps: never a price's digits there.
        raise SettingsError(exc.unquoted) from None
