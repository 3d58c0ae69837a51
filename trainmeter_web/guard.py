"""Who may talk to the dashboard: a Host-header check against DNS rebinding, the token for a non-loopback address, and
the headers every response carries (a Content-Security-Policy that allows no inline script).

It must never let a request through on a guess: no Host, a foreign name, or a wrong token is refused with one line.
Tokens are compared in constant time; the token is never logged and never echoed back.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import socket
from collections.abc import Iterable
from urllib.parse import urlencode

TOKEN_COOKIE = "tm_token"

#: No inline script or style, nothing from elsewhere: the page is its own static files and its own API.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the token may be in the address bar for one request
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def split_host(host_header: str) -> str:
    """The name or address of a Host header, without its port, lower case, without a trailing dot."""
    value = host_header.strip()
    if value.startswith("["):  # [::1]:8765
        end = value.find("]")
        name = value[1:end] if end > 0 else value
    elif value.count(":") == 1:
        name = value.split(":", 1)[0]
    else:
        name = value  # a bare IPv6 address, or a name without a port
    return name.lower().rstrip(".")


def is_loopback_address(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Guard:
    """The checks for one listening address; ``allowed_names`` adds host names a user reaches the node by."""

    def __init__(self, bound_host: str, token: str | None, allowed_names: Iterable[str] = ()) -> None:
        self.bound_host = bound_host
        self.token = token
        self.loopback = is_loopback_address(bound_host)
        names = {n.lower().rstrip(".") for n in allowed_names if n}
        env_names = os.environ.get("TM_WEB_ALLOWED_HOSTS", "")
        names.update(n.strip().lower().rstrip(".") for n in env_names.split(",") if n.strip())
        if not self.loopback:
            # Reached by the node's own name: allowed, with the token.
            names.update({socket.gethostname().lower(), socket.getfqdn().lower(), bound_host.lower()})
        names.discard("")
        self.allowed_names = frozenset(names)

    def host_allowed(self, host_header: str | None) -> bool:
        """Any port (an SSH tunnel picks its own), but only names that cannot be rebound to this machine.

        DNS rebinding needs a name the attacker controls, so an address literal is safe and ``localhost`` (with its
        subdomains, which resolve to loopback) is safe; any other name must be one the node answers to.
        """
        if not host_header:
            return False
        name = split_host(host_header)
        if not name:
            return False
        if name == "localhost" or name.endswith(".localhost"):
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return name in self.allowed_names
        return True

    def token_from(self, authorization: str | None, cookie: str | None, query: str | None) -> str | None:
        """Which way the request carried a valid token (``header``, ``cookie``, ``query``), or None."""
        if self.token is None:
            return "none needed"
        expected = self.token.encode()
        bearer = None
        if authorization and authorization[:7].lower() == "bearer ":
            bearer = authorization[7:].strip()
        for how, given in (("header", bearer), ("cookie", cookie), ("query", query)):
            # compare_digest on bytes of any length takes time independent of where they differ
            if given is not None and hmac.compare_digest(given.encode(), expected):
                return how
        return None

    def cookie_header(self) -> str:
        assert self.token is not None
        return f"{TOKEN_COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"


def without_token(path: str, query: dict[str, str]) -> str:
    """The same address with the token taken out of its query (where the page goes after the cookie is set)."""
    rest = {k: v for k, v in query.items() if k != "token"}
    return path + ("?" + urlencode(rest) if rest else "")
