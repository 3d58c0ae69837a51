"""The webhook's settings, read from the environment (tm's command-line options set the same variables).

The URL and the token are secrets: this module never prints or returns them in a message; every error is one line
naming the variable (or option) and what it accepts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

FORMATS = ("json", "slack", "ntfy", "telegram")
TELEGRAM_API = "https://api.telegram.org"

#: option -> the environment variable it sets (the option's argparse ``dest``)
OPTIONS = {
    "--webhook-url": "TM_WEBHOOK_URL",
    "--webhook-format": "TM_WEBHOOK_FORMAT",
    "--webhook-token": "TM_WEBHOOK_TOKEN",
    "--webhook-chat-id": "TM_WEBHOOK_CHAT_ID",
}
#: the names whose values are secret, for tm's redaction (options and variables alike)
SECRETS = [
    "--webhook-url",
    "--webhook-token",
    "--webhook-chat-id",
    "TM_WEBHOOK_URL",
    "TM_WEBHOOK_TOKEN",
    "TM_WEBHOOK_CHAT_ID",
]


class SettingsError(ValueError):
    """A setting the webhook cannot use: one line naming it and what is accepted."""


@dataclass(frozen=True)
class Settings:
    url: str  # for telegram: the Bot API's address, the token is added per request
    format: str = "json"
    token: str | None = None  # telegram: the bot token; ntfy: an access token (sent as a bearer token)
    chat_id: str | None = None
    timeout_s: float = 10.0
    retries: int = 5
    backoff_s: float = 1.0
    states: tuple[str, ...] = ("fired", "cleared")

    def secrets(self) -> list[str]:
        """The strings no message may contain."""
        return [s for s in (self.url, self.token, self.chat_id) if s]


def from_env(environ: Mapping[str, str] | None = None) -> Settings | None:
    """The settings, or None when no webhook was asked for (no URL, and no Telegram token). Raises SettingsError."""
    env = os.environ if environ is None else environ
    url = env.get("TM_WEBHOOK_URL", "").strip()
    fmt = env.get("TM_WEBHOOK_FORMAT", "").strip().lower() or (
        "telegram" if env.get("TM_WEBHOOK_CHAT_ID") else "json"
    )
    token = env.get("TM_WEBHOOK_TOKEN", "").strip() or None
    if fmt not in FORMATS:
        raise SettingsError(f"TM_WEBHOOK_FORMAT (--webhook-format) {fmt!r}: accepted: {', '.join(FORMATS)}")
    if fmt == "telegram":
        if not url and not token:
            return None
        if not token:
            raise SettingsError("telegram needs the bot token: set TM_WEBHOOK_TOKEN (--webhook-token)")
        chat_id = env.get("TM_WEBHOOK_CHAT_ID", "").strip()
        if not chat_id:
            raise SettingsError(
                "telegram needs the chat to write to: set TM_WEBHOOK_CHAT_ID (--webhook-chat-id)"
            )
        url = url or TELEGRAM_API
    else:
        if not url:
            return None
        chat_id = None
    if not url.startswith(("http://", "https://")):
        raise SettingsError("TM_WEBHOOK_URL (--webhook-url): expected an http:// or https:// address")
    states = tuple(s.strip() for s in env.get("TM_WEBHOOK_STATES", "fired,cleared").split(",") if s.strip())
    if not states or not set(states) <= {"fired", "cleared"}:
        raise SettingsError("TM_WEBHOOK_STATES: accepted: fired, cleared, or fired,cleared")
    return Settings(
        url=url.rstrip("/") if fmt == "telegram" else url,
        format=fmt,
        token=token,
        chat_id=chat_id,
        timeout_s=_number(env, "TM_WEBHOOK_TIMEOUT_S", 10.0, 0.1, 300.0),
        retries=int(_number(env, "TM_WEBHOOK_RETRIES", 5, 0, 100)),
        backoff_s=_number(env, "TM_WEBHOOK_BACKOFF_S", 1.0, 0.0, 600.0),
        states=states,
    )


def _number(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:
        raise SettingsError(f"{name}={raw!r}: expected a number from {low:g} to {high:g}")
    return value
