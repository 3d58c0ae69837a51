"""Delivery to a local HTTP server: each format arrives; a server error is retried with doubling backoff; a server
that is down is given up after the limit, with words that never hold the address or the token."""

from __future__ import annotations

import pytest
from trainmeter_webhook.delivery import deliver, retryable, scrub
from trainmeter_webhook.formats import Outgoing, outgoing
from trainmeter_webhook.settings import Settings

from trainmeter_core.model import records

ALERT = records.Alert(rule="hung", state="fired", severity="critical", message="no step for 42 s", wall=1.0)
RUN = {"name": "r", "host": "n1"}


def settings_for(fmt: str, url: str) -> Settings:
    if fmt == "telegram":
        return Settings(url=url.rstrip("/"), format=fmt, token="42:SECRET-tok", chat_id="7")
    return Settings(url=url, format=fmt)


@pytest.mark.parametrize("fmt", ["json", "slack", "ntfy", "telegram"])
def test_each_format_is_delivered_to_a_local_server(receiver, fmt):
    url = receiver.url("/hook/abc") if fmt != "telegram" else receiver.url("")
    settings = settings_for(fmt, url)
    result = deliver(outgoing(ALERT, settings, RUN), timeout_s=5, retries=0, backoff_s=0)
    assert (result.ok, result.attempts, result.error) == (True, 1, None)
    (got,) = receiver.received
    assert got.method == "POST"
    if fmt == "telegram":
        assert got.path == "/bot42:SECRET-tok/sendMessage" and got.json()["chat_id"] == "7"
    elif fmt == "ntfy":
        assert (
            got.path == "/hook/abc"
            and got.body == b"no step for 42 s"
            and got.headers["Priority"] == "urgent"
        )
    elif fmt == "slack":
        assert got.json() == {"text": "tm r on n1: ALERT hung (critical): no step for 42 s"}
    else:
        assert got.json()["alert"]["rule"] == "hung"
    assert got.headers["User-Agent"].startswith("trainmeter-webhook/")


def test_a_server_error_is_retried_with_doubling_backoff(receiver):
    receiver.statuses = [503, 500]
    waits: list[float] = []
    result = deliver(
        Outgoing(receiver.url("/h"), b"{}"),
        timeout_s=5,
        retries=5,
        backoff_s=0.5,
        wait=lambda s: waits.append(s) or False,
    )
    # 503, 500, then 200: three attempts, waiting 0.5 and 1.0 s between them
    assert (result.ok, result.attempts, waits) == (True, 3, [0.5, 1.0])
    assert len(receiver.received) == 3


def test_a_refused_request_is_not_retried(receiver):
    receiver.statuses = [404]
    result = deliver(Outgoing(receiver.url("/h"), b"{}"), timeout_s=5, retries=5, backoff_s=0.5)
    assert (result.ok, result.attempts, result.error) == (False, 1, "HTTP 404")


def test_a_server_that_is_down_is_given_up_after_the_limit(closed_url):
    waits: list[float] = []
    secret_url = closed_url + "/T0123/SECRETPART"
    result = deliver(
        Outgoing(secret_url, b"{}"),
        timeout_s=5,
        retries=3,
        backoff_s=1.0,
        secrets=[secret_url],
        wait=lambda s: waits.append(s) or False,
    )
    # 1 + 3 attempts, waiting 1, 2 and 4 s between them
    assert (result.ok, result.attempts, waits) == (False, 4, [1.0, 2.0, 4.0])
    assert (
        "refused" in result.error.lower()
        and "SECRETPART" not in result.error
        and "127.0.0.1" not in result.error
    )


def test_a_stop_cuts_the_backoff_short(closed_url):
    result = deliver(Outgoing(closed_url, b"{}"), timeout_s=5, retries=10, backoff_s=1.0, wait=lambda s: True)
    assert (result.ok, result.attempts) == (False, 1)


def test_retry_after_of_a_429_is_honoured_up_to_the_cap():
    answers = [(429, "HTTP 429", 30.0), (429, "HTTP 429", 600.0), (200, None, None)]
    waits: list[float] = []
    result = deliver(
        Outgoing("https://x", b""),
        timeout_s=1,
        retries=5,
        backoff_s=1.0,
        wait=lambda s: waits.append(s) or False,
        send=lambda request, timeout: answers.pop(0),
    )
    # max(1, 30) = 30; max(2, 600) capped at 60
    assert (result.ok, waits) == (True, [30.0, 60.0])


def test_what_is_worth_retrying():
    assert [retryable(s) for s in (None, 429, 500, 503, 400, 401, 404)] == [
        True,
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    assert scrub("failed at https://a/b/tok and tok", ["https://a/b/tok", "tok"]) == "failed at *** and ***"
