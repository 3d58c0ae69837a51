"""The dashboard's listening socket: bound once by the launcher and handed to every incarnation of the web component.

A restarted web process therefore keeps its port. Loopback by default; any other address requires a token, generated
here, printed once in the URL, and compared in constant time by the web component.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
from dataclasses import dataclass

DEFAULT_PORT = 8765
PORT_TRIES = 20


class WebPortError(RuntimeError):
    """The dashboard cannot listen: one line naming the flag that fixes it."""


@dataclass
class WebSocket:
    sock: socket.socket
    host: str
    port: int
    asked_port: int
    token: str | None

    def url(self, host: str | None = None) -> str:
        shown = host or ("localhost" if is_loopback(self.host) else self.host)
        query = f"?token={self.token}" if self.token else ""
        return f"http://{shown}:{self.port}/{query}"

    def startup_lines(self) -> list[str]:
        moved = (
            f" (port {self.asked_port} was taken)" if self.asked_port and self.port != self.asked_port else ""
        )
        lines = [f"dashboard {self.url()}{moved}"]
        ssh = os.environ.get("SSH_CONNECTION")
        if ssh and is_loopback(self.host):
            server_ip = ssh.split()[2] if len(ssh.split()) >= 3 else socket.gethostname()
            lines.append(
                f"on your machine: ssh -N -L {self.port}:localhost:{self.port} {os.environ.get('USER', 'you')}@{server_ip}"
                f" then open http://localhost:{self.port}/"
            )
        return lines


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str = "127.0.0.1", port: int | None = None) -> WebSocket:
    """Bind the dashboard's socket, moving to the next free port when the asked one is taken."""
    asked = DEFAULT_PORT if port is None else port
    token = None if is_loopback(host) else secrets.token_urlsafe(24)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    last_error: OSError | None = None
    candidates = [asked] if asked == 0 else [*range(asked, asked + PORT_TRIES), 0]
    for candidate in candidates:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, candidate))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            last_error = exc
            continue
        sock.set_inheritable(True)
        return WebSocket(sock=sock, host=host, port=sock.getsockname()[1], asked_port=asked, token=token)
    raise WebPortError(
        f"the dashboard cannot listen on {host} ({last_error}): pass --port N, --host ADDR or --no-web"
    )
