"""The opt-in heartbeat: a request to a URL every minute while the training process lives and steps, in the manner of
healthchecks.io, so that a service off the node notices when the node itself dies or the run hangs.

It sends nothing but the request (no body, no run data), only when a URL was given (``--heartbeat URL``, for now
``TM_HEARTBEAT_URL``), and never names the URL in a record, a file or a message: the URL is its secret.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from trainmeter_core import __version__
from trainmeter_core.bus.component import Component, ComponentContext
from trainmeter_core.model import records
from trainmeter_core.model.alerts.episodes import rule_config
from trainmeter_core.model.alerts.training import Hung, is_stepping

URL_ENV = "TM_HEARTBEAT_URL"
INTERVAL_ENV = "TM_HEARTBEAT_INTERVAL_S"
DEFAULT_INTERVAL_S = 60.0
MAX_TIMEOUT_S = 10.0


def heartbeat_url() -> str | None:
    url = os.environ.get(URL_ENV, "").strip()
    return url or None


def interval_s() -> tuple[float, str | None]:
    """The interval between requests and, for a bad value, the one line that says the default is used instead."""
    raw = os.environ.get(INTERVAL_ENV)
    if raw is None:
        return DEFAULT_INTERVAL_S, None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.5 <= value <= 86400:
        return DEFAULT_INTERVAL_S, f"{INTERVAL_ENV}={raw!r}: expected seconds from 0.5 to 86400; using 60"
    return value, None


@dataclass
class Pacer:
    """When to send the next request: once per interval of snapshot time, and only while the run steps."""

    interval_s: float
    factor: float
    floor_s: float
    last_sent_t: float | None = None

    def due(self, snapshot: records.Snapshot) -> bool:
        if not is_stepping(snapshot, self.factor, self.floor_s):
            return False
        # Snapshots follow the hub's tick, a few milliseconds late or early: a tenth of the interval is slack enough.
        slack_s = min(0.1 * self.interval_s, 0.5)
        if self.last_sent_t is not None and snapshot.t - self.last_sent_t < self.interval_s - slack_s:
            return False
        self.last_sent_t = snapshot.t
        return True


def ping(url: str, timeout_s: float) -> str | None:
    """One GET to ``url``; None when it answered 2xx or 3xx, else why not, in words that never hold the URL."""
    # Imported here: every run's components process loads this module (the sinks are listed through it), and
    # urllib.request with http.client and email is 10 to 15 ms of its start (-X importtime, the CI machine) that only
    # a run with a heartbeat needs.
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"User-Agent": f"trainmeter/{__version__}"}, method="GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read(1024)
            return None
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        return _scrub(str(exc.reason), url)
    except (OSError, ValueError) as exc:
        return _scrub(f"{type(exc).__name__}: {exc}", url)


def _scrub(text: str, url: str) -> str:
    return text.replace(url, "***") if url else text


class HeartbeatSink(Component):
    """Pings the heartbeat URL while the run is alive and stepping; stops when it hangs or ends."""

    name = "heartbeat"
    subscribes = ("snapshot",)
    shared = True

    def __init__(self, send: Callable[[str, float], str | None] = ping) -> None:
        self.send = send

    def run(self, ctx: ComponentContext) -> None:
        url = heartbeat_url()
        if url is None:
            return
        every_s, problem = interval_s()
        if problem:
            _say(ctx, problem)
        from trainmeter_core.components.alerts import read_tm_toml

        document, _ = read_tm_toml(ctx.meta)  # the alerts component reports a bad tm.toml
        table = (
            (document.get("alerts") or {}).get(Hung.name)
            if isinstance(document.get("alerts"), dict)
            else None
        )
        try:
            hung = rule_config(Hung(), table)
        except ValueError:
            hung = rule_config(Hung(), None)
        pacer = Pacer(every_s, hung["factor"], hung["floor_s"])
        failing = False
        while not ctx.stopping.is_set():
            record = ctx.recv(0.5)
            if not isinstance(record, records.Snapshot):
                continue
            if record.final:
                return
            if not pacer.due(record):
                continue
            why = self.send(url, min(MAX_TIMEOUT_S, every_s / 2))
            if why is not None and not failing:
                _say(ctx, f"heartbeat request failed ({why}); trying again each interval")
            elif why is None and failing:
                _say(ctx, "heartbeat requests get through again", "info")
            failing = why is not None


def _say(ctx: ComponentContext, message: str, level: str = "warning") -> None:
    ctx.publish(records.Notice(level=level, topic="heartbeat", message=message))  # type: ignore[arg-type]
    try:
        sys.stderr.write(f"tm: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
