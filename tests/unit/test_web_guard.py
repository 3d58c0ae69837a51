"""The dashboard's guard: Host names that cannot be rebound, the token for a non-loopback address, the CSP."""

from __future__ import annotations

import pytest

from trainmeter_web.guard import CONTENT_SECURITY_POLICY, Guard, split_host, without_token


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8765", "localhost"),
        ("LOCALHOST.:9999", "localhost"),
        ("127.0.0.1", "127.0.0.1"),
        ("[::1]:8765", "::1"),
        ("::1", "::1"),
        ("evil.example:80", "evil.example"),
    ],
)
def test_a_host_header_is_split_into_its_name_without_the_port(header, name):
    assert split_host(header) == name


@pytest.mark.parametrize(
    "header", ["localhost:9999", "localhost:8765", "127.0.0.1:1", "[::1]:4000", "app.localhost:3000"]
)
def test_a_tunnel_on_any_local_port_is_accepted(header):
    assert Guard("127.0.0.1", None).host_allowed(header)


@pytest.mark.parametrize("header", ["evil.example:8765", "localhost.evil.example", "attacker.test", "", None])
def test_a_foreign_or_missing_host_is_refused(header):
    # DNS rebinding points a name the attacker owns at 127.0.0.1: the browser then sends that name.
    assert not Guard("127.0.0.1", None).host_allowed(header)


def test_an_address_literal_is_accepted_because_rebinding_needs_a_name():
    guard = Guard("0.0.0.0", "secret")
    assert guard.host_allowed("10.1.2.3:8765")
    assert guard.host_allowed("[fe80::1]:8765")


def test_names_the_user_allows_are_accepted(monkeypatch):
    monkeypatch.setenv("TM_WEB_ALLOWED_HOSTS", "gpu-node-7, Dash.Internal")
    guard = Guard("127.0.0.1", None)
    assert guard.host_allowed("gpu-node-7:8765")
    assert guard.host_allowed("dash.internal")
    assert not guard.host_allowed("gpu-node-8:8765")


def test_without_a_token_configured_every_request_passes_the_token_check():
    assert Guard("127.0.0.1", None).token_from(None, None, None) == "none needed"


def test_the_token_is_accepted_from_the_header_the_cookie_or_the_query():
    guard = Guard("0.0.0.0", "s3cret-token")
    assert guard.token_from("Bearer s3cret-token", None, None) == "header"
    assert guard.token_from("bearer s3cret-token", None, None) == "header"
    assert guard.token_from(None, "s3cret-token", None) == "cookie"
    assert guard.token_from(None, None, "s3cret-token") == "query"


@pytest.mark.parametrize(
    ("authorization", "cookie", "query"),
    [
        (None, None, None),
        ("Bearer s3cret-tokeN", None, None),
        ("Basic s3cret-token", None, None),
        (None, "s3cret", None),
        (None, None, "s3cret-token-and-more"),
        (None, None, ""),
    ],
)
def test_a_missing_or_wrong_token_is_refused(authorization, cookie, query):
    assert Guard("0.0.0.0", "s3cret-token").token_from(authorization, cookie, query) is None


def test_the_cookie_is_http_only_and_same_site_strict():
    header = Guard("0.0.0.0", "abc").cookie_header()
    assert header.startswith("tm_token=abc;")
    assert "HttpOnly" in header and "SameSite=Strict" in header


def test_the_address_without_its_token_keeps_the_other_parameters():
    assert without_token("/", {"token": "abc"}) == "/"
    assert without_token("/", {"token": "abc", "x": "tokens"}) == "/?x=tokens"


def test_the_content_security_policy_allows_no_inline_script_and_nothing_from_elsewhere():
    directives = dict(d.strip().split(" ", 1) for d in CONTENT_SECURITY_POLICY.split(";"))
    assert directives["script-src"] == "'self'"
    assert directives["default-src"] == "'none'"
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert "unsafe-eval" not in CONTENT_SECURITY_POLICY
    assert directives["connect-src"] == "'self'"
