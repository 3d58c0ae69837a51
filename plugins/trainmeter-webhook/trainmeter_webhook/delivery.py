"""Delivering one request: a POST with a timeout, retried with exponential backoff, given up after a limit.

It never raises and never blocks past its timeouts and backoffs (the caller may cut a backoff short); its error words
never hold the address or the token: a failure is said as what happened, never where.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainmeter_webhook import __version__
from trainmeter_webhook.formats import Outgoing

MAX_BACKOFF_S = 60.0


@dataclass(frozen=True)
class Delivery:
    ok: bool
    attempts: int
    error: str | None = None  # why the last attempt failed, scrubbed of secrets


def post(request: Outgoing, timeout_s: float) -> tuple[int | None, str | None, float | None]:
    """One POST: (HTTP status or None, what went wrong or None, the Retry-After seconds the server asked for)."""
    headers = {"User-Agent": f"trainmeter-webhook/{__version__}", **request.headers}
    http_request = urllib.request.Request(request.url, data=request.body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(http_request, timeout=timeout_s) as response:
            response.read(64 * 1024)
            return response.status, None, None
    except urllib.error.HTTPError as exc:
        return (
            exc.code,
            f"HTTP {exc.code}",
            _retry_after(exc.headers.get("Retry-After") if exc.headers else None),
        )
    except urllib.error.URLError as exc:
        return None, str(exc.reason), None
    except (OSError, ValueError) as exc:  # a timeout while reading, a reset connection, a malformed address
        return None, f"{type(exc).__name__}: {exc}", None


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the plain backoff will do


def retryable(status: int | None) -> bool:
    """No answer, a server error, or too many requests: worth another try. Any other 4xx will not change."""
    return status is None or status == 429 or status >= 500


def deliver(
    request: Outgoing,
    *,
    timeout_s: float,
    retries: int,
    backoff_s: float,
    secrets: Sequence[str] = (),
    wait: Callable[[float], bool] = lambda s: False,
    send: Callable[[Outgoing, float], tuple[int | None, str | None, float | None]] = post,
) -> Delivery:
    """Try once, then up to ``retries`` more times after backoff_s, 2 × backoff_s, ... (at most 60 s each, or what
    a 429's Retry-After asks, within the same cap). ``wait(seconds)`` does the waiting and returns True to give up
    early (the component is stopping)."""
    attempts = 0
    error = None
    while True:
        attempts += 1
        status, error, retry_after = send(request, timeout_s)
        if error is None and status is not None and 200 <= status < 300:
            return Delivery(True, attempts)
        if error is None:
            error = f"HTTP {status}"
        if attempts > retries or not retryable(status):
            break
        delay = min(backoff_s * 2 ** (attempts - 1), MAX_BACKOFF_S)
        if retry_after is not None:
            delay = min(max(delay, retry_after), MAX_BACKOFF_S)
        if wait(delay):
            break
    return Delivery(False, attempts, scrub(error, secrets))


def scrub(text: str, secrets: Sequence[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return text
