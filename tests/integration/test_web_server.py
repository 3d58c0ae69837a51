"""The dashboard's HTTP server on a real socket: the page, the API of docs/api.md, the live stream, and the guard."""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest
from live_run import feed

from trainmeter_core.model import records
from trainmeter_web.dashboard_state import DashboardState
from trainmeter_web.guard import Guard
from trainmeter_web.server import Server

WALL0 = 1_700_000_000.0
TOKEN = "test-token-123"


def feed_run(model: DashboardState, steps: int, first_seq: int = 1) -> None:
    seq = first_seq
    for step in range(1, steps + 1):
        for record in (
            records.Step(step=step, tokens_global=1000),
            records.Metric(values={"train/loss": 4.0 / step, "<img src=x onerror=alert(1)>": 1.0}, step=step),
            records.Tick(n=step, interval_s=1.0),
        ):
            record.seq, record.t, record.wall = seq, 10.0 + seq, WALL0 + 10.0 + seq
            feed(model, record)
            seq += 1


@pytest.fixture
def served(tmp_path):
    """A server on a loopback port of its own, stopped after the test; yields (server, port, model)."""
    servers = []

    def start(model: DashboardState | None = None, token: str | None = None, bound: str = "127.0.0.1"):
        model = model or DashboardState(tmp_path / "runs" / "20260101T000000Z-host-demo", {"run_id": "demo"})
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        server = Server(model, sock, Guard(bound, token))
        server.start()
        servers.append(server)
        return server, sock.getsockname()[1], model

    yield start
    for server in servers:
        server.stop()


def get(port: int, path: str, headers: dict | None = None, method: str = "GET"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, headers={"Host": f"localhost:{port}", **(headers or {})})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response, body


def get_json(port: int, path: str, status: int = 200) -> dict:
    response, body = get(port, path)
    assert response.status == status, body
    assert response.getheader("Content-Type").startswith("application/json")
    return json.loads(body)


def test_the_page_and_its_files_are_served_with_a_csp_that_forbids_inline_script(served):
    _, port, _ = served()
    response, body = get(port, "/")
    assert response.status == 200
    assert b'<script type="module" src="/static/app.js"></script>' in body
    csp = response.getheader("Content-Security-Policy")
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert response.getheader("X-Content-Type-Options") == "nosniff"
    assert response.getheader("Referrer-Policy") == "no-referrer"
    for name, content_type in (
        ("app.js", "text/javascript"),
        ("style.css", "text/css"),
        ("icon.svg", "image/svg+xml"),
    ):
        response, _ = get(port, f"/static/{name}")
        assert response.status == 200 and response.getheader("Content-Type").startswith(content_type)


def test_the_page_has_no_inline_script_or_style():
    from trainmeter_web.server import load_static

    page = load_static()["index.html"][0].decode()
    assert "<script>" not in page and "<style" not in page and " style=" not in page and "onclick" not in page


@pytest.mark.parametrize(
    "path", ["/static/nope.js", "/static/..%2Fserver.py", "/static/../server.py", "/api/nope"]
)
def test_anything_but_the_pages_own_files_is_not_found(served, path):
    _, port, _ = served()
    assert get(port, path)[0].status == 404


def test_the_api_is_read_only(served):
    _, port, _ = served()
    assert get(port, "/api/run", method="POST")[0].status == 405


def test_the_run_snapshot_and_series_describe_the_run(served):
    model = DashboardState(meta={"run_id": "r1", "name": "demo", "command": ["train.py", "</script>"]})
    feed_run(model, 5)
    _, port, _ = served(model)
    run = get_json(port, "/api/run")
    assert run["command"] == ["train.py", "</script>"] and run["status"]["state"] == "running"
    snapshot = get_json(port, "/api/snapshot")
    assert snapshot["kind"] == "snapshot" and snapshot["steps"] == 5 and snapshot["tick"] == 5
    assert snapshot["state"] == "running"  # as docs/api.md's example has one: a live snapshot's too
    assert snapshot["metrics"]["tokens_per_s"]["unit"] == "tokens/s"
    series = get_json(port, "/api/series")
    assert series["x_axes"] == ["step", "tokens", "flop", "wall"]
    assert series["series"]["train_loss"] == {"group": "loop", "points": 5, "raw_key": "train/loss"}
    assert "<img src=x onerror=alert(1)>" in series["series"]


def test_history_reads_incrementally_and_thins_on_the_server(served):
    model = DashboardState()
    feed_run(model, 10)
    _, port, _ = served(model)
    whole = get_json(port, "/api/history?series=train_loss&x=step")["series"]["train_loss"]
    assert [p[0] for p in whole] == [float(s) for s in range(1, 11)]
    assert whole[1] == [2.0, 2.0, 2.0, 2.0, 1]  # x, value, min, max, count: 4.0 / 2
    newer = get_json(port, "/api/history?series=train_loss&x=step&since=8")["series"]["train_loss"]
    assert [p[0] for p in newer] == [9.0, 10.0]
    thin = get_json(port, "/api/history?series=train_loss&x=step&points=2")["series"]["train_loss"]
    # two buckets of five: steps 1-5 and 6-10, each at its newest x, min and max kept
    assert [(p[0], p[4]) for p in thin] == [(5.0, 5), (10.0, 5)]
    assert thin[0][2] == 4.0 / 5 and thin[0][3] == 4.0
    tokens = get_json(port, "/api/history?series=train_loss&x=tokens&since=9000")["series"]["train_loss"]
    assert [p[0] for p in tokens] == [10000.0]  # 10 steps × 1000 tokens
    every = get_json(port, "/api/history?x=wall&points=1")
    assert set(every["series"]) == set(model.catalog())


@pytest.mark.parametrize(
    ("query", "status", "words"),
    [
        ("series=train_loss&x=epoch", 400, "step, tokens, flop, wall"),
        ("series=train_loss&points=0", 400, "whole number from 1"),
        ("series=train_loss&points=lots", 400, "whole number from 1"),
        ("series=train_loss&since=soon", 400, "a number on the x axis"),
        ("series=no_such_series", 404, "/api/series lists them"),
    ],
)
def test_a_bad_history_request_is_one_line_naming_what_is_accepted(served, query, status, words):
    model = DashboardState()
    feed_run(model, 2)
    _, port, _ = served(model)
    assert words in get_json(port, f"/api/history?{query}", status)["error"]


def test_the_runs_next_to_this_one_are_listed_with_this_one_marked(served, tmp_path):
    base = tmp_path / "runs"
    for name in ("20260101T000000Z-host-a", "20260102T000000Z-host-b"):
        (base / name).mkdir(parents=True)
        (base / name / "meta.json").write_text(json.dumps({"start_wall": WALL0}))
    (base / "20260102T000000Z-host-b" / "summary.json").write_text(
        json.dumps({"state": "finished", "exit_status": 0})
    )
    _, port, _ = served(DashboardState(base / "20260101T000000Z-host-a"))
    runs = get_json(port, "/api/runs")["runs"]
    assert [(r["name"], r["current"]) for r in runs] == [
        ("20260102T000000Z-host-b", False),
        ("20260101T000000Z-host-a", True),
    ]
    assert runs[0]["state"] == "finished (exit 0)" and runs[1]["state"] == "lost"


def test_the_passport_is_absent_with_a_reason_until_the_run_wrote_it(served, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _, port, _ = served(DashboardState(run_dir))
    assert "when the run ends" in get_json(port, "/api/passport")["absent"]
    (run_dir / "passport.md").write_text("# Run passport\n")
    assert get_json(port, "/api/passport") == {"markdown": "# Run passport\n"}


class EventReader:
    """Reads a Server-Sent Events stream event by event."""

    def __init__(self, port: int, path: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n".encode())
        self.file = self.sock.makefile("rb")
        while self.file.readline() not in (b"\r\n", b""):  # status line and headers
            pass
        self.chunk_left = 0

    def _line(self) -> bytes:
        # the body is chunked: read chunk sizes as they come
        out = b""
        while not out.endswith(b"\n"):
            if self.chunk_left == 0:
                size = self.file.readline()
                if not size.strip():
                    size = self.file.readline()
                if not size:
                    return out
                self.chunk_left = int(size.strip(), 16)
                if self.chunk_left == 0:
                    return out
            byte = self.file.read(1)
            if not byte:
                return out
            self.chunk_left -= 1
            out += byte
        return out

    def event(self) -> tuple[str | None, dict | None]:
        name, data = None, None
        while True:
            line = self._line()
            if not line:
                return None, None
            if line == b"\n":
                if name or data:
                    return name, data
                continue
            field, _, value = line.decode().rstrip("\n").partition(": ")
            if field == "event":
                name = value
            elif field == "data":
                data = json.loads(value)

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def test_the_stream_sends_the_whole_state_then_only_what_changed(served):
    model = DashboardState()
    feed_run(model, 3)
    server, port, _ = served(model)
    reader = EventReader(port, "/api/events?x=step&points=100")
    name, first = reader.event()
    assert name == "state"
    assert first["doc"]["snapshot"]["tick"] == 3
    assert [p[0] for p in first["series"]["train_loss"]] == [1.0, 2.0, 3.0]
    feed_run(model, 4, first_seq=10)  # steps 1..4 again under new sequence numbers: step 4 is new
    server.notify()
    name, patch = reader.event()
    assert name == "patch"
    assert patch["doc"]["snapshot"]["tick"] == 4
    assert "catalog" not in patch["doc"]  # unchanged parts are not sent again
    assert [p[0] for p in patch["series"]["train_loss"]][-1] == 4.0
    reader.close()


def test_stopping_the_server_ends_an_open_stream_at_once(served):
    model = DashboardState()
    feed_run(model, 1)
    server, port, _ = served(model)
    reader = EventReader(port, "/api/events")
    assert reader.event()[0] == "state"
    started = time.monotonic()
    server.stop()
    assert reader.event() == (None, None)  # end of the stream, not a keep-alive 15 s later
    assert time.monotonic() - started < 10.0  # far below the keep-alive: the stream was closed, not timed out
    reader.close()


def test_a_foreign_host_is_refused_and_a_tunnel_on_any_local_port_is_accepted(served):
    _, port, _ = served()
    response, body = get(port, "/api/run", {"Host": "evil.example:8765"})
    assert response.status == 403 and b"DNS rebinding" in body
    assert get(port, "/api/run", {"Host": "localhost:9999"})[0].status == 200


def test_a_non_loopback_dashboard_refuses_a_request_without_its_token(served):
    _, port, _ = served(token=TOKEN, bound="0.0.0.0")
    response, body = get(port, "/api/run")
    assert response.status == 401 and b"token" in body
    assert get(port, "/api/run", {"Authorization": "Bearer wrong"})[0].status == 401
    assert get(port, "/api/run", {"Authorization": f"Bearer {TOKEN}"})[0].status == 200
    assert get(port, f"/api/run?token={TOKEN}")[0].status == 200


def test_the_token_in_the_address_becomes_a_cookie_and_leaves_the_address(served):
    _, port, _ = served(token=TOKEN, bound="0.0.0.0")
    response, _ = get(port, f"/?token={TOKEN}")
    assert response.status == 303
    assert response.getheader("Location") == "/"
    cookie = response.getheader("Set-Cookie")
    assert cookie.startswith(f"tm_token={TOKEN};") and "HttpOnly" in cookie
    assert get(port, "/", {"Cookie": f"tm_token={TOKEN}"})[0].status == 200
    assert get(port, "/static/app.js", {"Cookie": "tm_token=nope"})[0].status == 401


def test_a_change_wakes_the_event_loop_only_for_a_stream_that_waits_and_once_for_a_burst():
    import asyncio
    import threading

    from trainmeter_web.changes import Changes

    changes = Changes()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    woken = []
    real_woken = changes._woken

    def counted() -> None:
        woken.append(changes.version)
        real_woken()

    changes._woken = counted  # type: ignore[method-assign]
    try:
        for _ in range(100):  # no page open: the version moves, the loop is never woken
            changes.changed(loop)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(5)
        assert changes.version == 100 and woken == []
        # A stream that saw version 100 waits: a burst of changes wakes it, through one wake or a few, never one each
        waited = asyncio.run_coroutine_threadsafe(changes.wait(100, 10.0), loop)
        deadline = time.monotonic() + 5
        while not changes._waiters and time.monotonic() < deadline:
            time.sleep(0.001)
        for _ in range(100):
            changes.changed(loop)
        waited.result(5)
        assert changes.version == 200 and 1 <= len(woken) < 100
        # A stream that comes to wait after a change it has not seen returns at once
        started = time.monotonic()
        asyncio.run_coroutine_threadsafe(changes.wait(150, 10.0), loop).result(5)
        assert time.monotonic() - started < 5
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
