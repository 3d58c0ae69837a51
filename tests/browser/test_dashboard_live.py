"""A live run's dashboard in a real browser: it updates without a reload and reconnects by itself after its web
process is killed, a non-loopback dashboard wants its token and checks the host, and an open page sees the run
finish without holding tm.
"""

from __future__ import annotations

import http.client
import os
import re
import signal

from dashboard_page import (
    LiveTm,
)
from deadline import wait_for
from tm_runs import log_records, only_run


def test_a_live_run_updates_without_a_reload_and_reconnects_after_its_web_process_is_killed(
    page, web_env, tmp_path
):
    tm = LiveTm(dict(web_env), tmp_path, [])
    p = page.page
    try:
        p.goto(tm.url)
        p.evaluate("window.__sameDocument = true")
        steps = lambda: int(p.text_content("#progress-stats [data-explain=steps]") or 0)  # noqa: E731
        wait_for(lambda: steps() > 0, what="the first steps on the page")
        first = steps()
        wait_for(lambda: steps() > first, what="the page to update by itself")
        run_dir = only_run(tm.runs)
        (started,) = [
            r
            for r in log_records(run_dir)
            if r["kind"] == "component" and r["name"] == "web" and r["event"] == "started"
        ]
        os.kill(started["child_pid"], signal.SIGKILL)
        wait_for(
            lambda: any(
                r["kind"] == "component" and r["name"] == "web" and r["event"] == "restarted"
                for r in log_records(run_dir)
            ),
            what="the launcher to restart the web process",
        )
        before = steps()
        wait_for(lambda: steps() > before and p.text_content("#conn") == "live", what="the page to reconnect")
        assert p.evaluate("window.__sameDocument") is True  # no reload happened
        assert p.url.startswith(tm.url)  # the same port
        assert tm.finish() == 0
        assert page.exceptions == []  # (the console does log the refused reconnection attempts)
    finally:
        tm.kill()


def request(port: int, path: str, host: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers={"Host": host})
    status = conn.getresponse().status
    conn.close()
    return status


def test_a_non_loopback_dashboard_needs_its_token_and_checks_the_host(page, web_env, tmp_path):
    tm = LiveTm(dict(web_env), tmp_path, ["--host", "0.0.0.0"])
    try:
        match = re.match(r"http://[^:/]+:(\d+)/\?token=(\S+)", tm.url)
        assert match, tm.url
        port, token = int(match.group(1)), match.group(2)
        assert request(port, "/api/run", f"127.0.0.1:{port}") == 401
        assert request(port, f"/api/run?token={token}", f"127.0.0.1:{port}") == 200
        assert request(port, f"/api/run?token={token}", "evil.example") == 403
        assert request(port, f"/api/run?token={token}", "localhost:9999") == 200
        p = page.page
        p.goto(f"http://127.0.0.1:{port}/?token={token}")
        assert "token" not in p.url  # traded for a cookie
        p.wait_for_function("() => document.querySelector('#conn')?.textContent === 'live'")
        assert tm.finish() == 0
        assert page.exceptions == []
    finally:
        tm.kill()


def test_an_open_page_sees_the_run_finish_and_does_not_hold_tm(page, web_env, tmp_path):
    tm = LiveTm(dict(web_env), tmp_path, [])
    try:
        p = page.page
        p.goto(tm.url)
        p.wait_for_function("() => document.querySelector('#conn')?.textContent === 'live'")
        assert tm.finish() == 0  # tm ended with a live stream open
        p.wait_for_function("() => document.querySelector('#run-state')?.textContent.startsWith('finished')")
        assert p.text_content("#run-state") == "finished · exit 0"
        assert page.exceptions == []
    finally:
        tm.kill()
