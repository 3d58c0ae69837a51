"""Fixtures of the webhook's tests: a local HTTP receiver (127.0.0.1, port 0) that records what it is sent."""

from __future__ import annotations

import http.server
import json
import threading
import time
from dataclasses import dataclass

import pytest


@dataclass
class Received:
    wall: float
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


class Receiver:
    """Answers every request with the next status of ``statuses`` (then 200) and keeps what it received."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.statuses: list[int] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.received.append(
                    Received(time.time(), self.command, self.path, dict(self.headers), body)
                )
                self.send_response(receiver.statuses.pop(0) if receiver.statuses else 200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def closed_url():
    """An address on 127.0.0.1 where nothing listens (a port that was just released)."""
    server = Receiver()
    url = server.url("/hook/closed")
    server.close()
    return url
