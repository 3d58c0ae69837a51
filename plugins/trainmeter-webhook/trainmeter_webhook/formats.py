"""What each webhook format sends for one alert: the address, the body and the headers. Pure: no I/O, no clock.

Formats, each as its service documents it:
- ``json``: the alert as JSON, for your own receiver.
- ``slack``: a Slack incoming webhook, ``{"text": ...}`` (https://api.slack.com/messaging/webhooks).
- ``ntfy``: the message as the body, ``Title``, ``Priority`` and ``Tags`` headers (https://docs.ntfy.sh/publish/).
- ``telegram``: the Bot API's ``sendMessage`` with ``chat_id`` and ``text`` (https://core.telegram.org/bots/api).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainmeter_core.api import Alert
from trainmeter_webhook.settings import Settings

# Telegram refuses a message longer than 4096 characters (Bot API, sendMessage: "1-4096 characters").
TELEGRAM_MAX_CHARS = 4096
# ntfy priorities (https://docs.ntfy.sh/publish/#message-priority): 5 urgent, 4 high, 3 default.
NTFY_PRIORITY = {"critical": "urgent", "warning": "high", "info": "default"}


@dataclass(frozen=True)
class Outgoing:
    """One HTTP POST: the full address (it may hold a secret), the body, the headers."""

    url: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def alert_text(alert: Alert, run: Mapping[str, Any]) -> str:
    """The one line a person reads: the run, ALERT or cleared, the rule, the severity, the message."""
    where = f"tm {run.get('name') or 'run'} on {run.get('host') or alert.host or 'this node'}"
    if alert.state == "fired":
        return f"{where}: ALERT {alert.rule} ({alert.severity}): {alert.message}"
    return f"{where}: cleared {alert.rule}: {alert.message}"


def alert_document(alert: Alert, run: Mapping[str, Any]) -> dict[str, Any]:
    """The generic JSON body: the run's identity, the text, and the alert's fields (NaN and inf as strings)."""
    numbers = {
        k: (v if math.isfinite(v) else ("NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")))
        for k, v in alert.numbers.items()
    }
    return {
        "source": "trainmeter",
        "run": run.get("name"),
        "run_id": run.get("run_id"),
        "host": run.get("host") or alert.host,
        "text": alert_text(alert, run),
        "alert": {
            "rule": alert.rule,
            "state": alert.state,
            "severity": alert.severity,
            "message": alert.message,
            "numbers": numbers,
            "subject": alert.subject,
            "episode": alert.episode,
            "wall": alert.wall,
        },
    }


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")


def _header(text: str) -> str:
    # HTTP header values are Latin-1 at best: anything else becomes "?".
    return "".join(c if 32 <= ord(c) < 127 else "?" for c in text)


def outgoing(alert: Alert, settings: Settings, run: Mapping[str, Any]) -> Outgoing:
    """The request that delivers ``alert`` in ``settings.format``."""
    fmt = settings.format
    text = alert_text(alert, run)
    json_type = {"Content-Type": "application/json; charset=utf-8"}
    if fmt == "json":
        return Outgoing(settings.url, _json(alert_document(alert, run)), json_type)
    if fmt == "slack":
        return Outgoing(settings.url, _json({"text": text}), json_type)
    if fmt == "ntfy":
        fired = alert.state == "fired"
        headers = {
            "Content-Type": "text/plain; charset=utf-8",
            "Title": _header(f"tm {run.get('name') or 'run'}: {alert.rule} {alert.state}"),
            "Priority": NTFY_PRIORITY.get(alert.severity, "default") if fired else "default",
            "Tags": "rotating_light" if fired else "white_check_mark",
        }
        if settings.token:
            headers["Authorization"] = f"Bearer {settings.token}"
        return Outgoing(settings.url, alert.message.encode("utf-8"), headers)
    if fmt == "telegram":
        body = {
            "chat_id": settings.chat_id,
            "text": text[:TELEGRAM_MAX_CHARS],
            "disable_web_page_preview": True,
        }
        return Outgoing(f"{settings.url}/bot{settings.token}/sendMessage", _json(body), json_type)
    raise ValueError(f"unknown webhook format {fmt!r}")
