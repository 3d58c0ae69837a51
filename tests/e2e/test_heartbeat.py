"""The opt-in heartbeat: a request per interval of snapshot time while the training process lives and steps, none
while it hangs or after it is gone; it reaches a local server (127.0.0.1, port 0) and never writes its URL down."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from collections import deque

import pytest
from tm_runs import TM, only_run

from trainmeter_core.components.heartbeat import HeartbeatSink, Pacer, interval_s, ping
from trainmeter_core.model import records


class Receiver:
    """A local HTTP server that answers every request with ``status`` and remembers (wall time, method, path)."""

    def __init__(self, status: int = 200) -> None:
        self.requests: list[tuple[float, str, str]] = []
        self.status = status
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                receiver.requests.append((time.time(), self.command, self.path))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_HEAD = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


def closed_port_url() -> str:
    server = Receiver()
    url = server.url("/ping/closed")
    server.close()
    return url


def mv(value):
    return records.MetricValue(value=value)


def snapshot(t, since=0.1, alive=1.0, final=False):
    metrics = {"since_step_s": mv(since), "step_time_median_s": mv(0.1), "child_alive": mv(alive)}
    return records.Snapshot(
        tick=int(t), t=float(t), final=final, steps=10, metrics=metrics, elapsed_s=float(t)
    )


def test_the_pacer_asks_once_per_interval_of_snapshot_time_and_only_while_stepping():
    pacer = Pacer(interval_s=3.0, factor=10, floor_s=2.0)
    # stepping at t 0..5: due at 0 and 3; hung at 6..8 (the last step 2.5 s old > max(10 × 0.1, 2) = 2 s); due again
    # at 9 (9 − 3 ≥ 3); gone at 10; the final snapshot is never due
    sequence = [snapshot(t) for t in range(6)] + [snapshot(t, since=2.5) for t in range(6, 9)]
    sequence += [snapshot(9), snapshot(10, alive=0.0), snapshot(13, final=True)]
    assert [s.t for s in sequence if pacer.due(s)] == [0.0, 3.0, 9.0]


def test_a_bad_interval_keeps_the_default_and_says_so(monkeypatch):
    monkeypatch.setenv("TM_HEARTBEAT_INTERVAL_S", "0.1")
    assert interval_s() == (
        60.0,
        "TM_HEARTBEAT_INTERVAL_S='0.1': expected seconds from 0.5 to 86400; using 60",
    )
    monkeypatch.setenv("TM_HEARTBEAT_INTERVAL_S", "5")
    assert interval_s() == (5.0, None)


def test_ping_reaches_the_server_and_failures_never_name_the_url(receiver):
    assert ping(receiver.url("/ping/abc"), 5.0) is None
    assert receiver.requests[0][1:] == ("GET", "/ping/abc")
    receiver.status = 503
    assert ping(receiver.url("/ping/abc"), 5.0) == "HTTP 503"
    url = closed_port_url()
    why = ping(url, 5.0)
    assert why is not None and "refused" in why.lower() and "closed" not in why and "127.0.0.1" not in why


class StandIn:
    def __init__(self, run_dir, logged):
        self.run_dir = run_dir
        self.meta = {"cwd": str(run_dir), "command": ["x"], "script_mode": False}
        self.stopping = threading.Event()
        self.published = []
        self._records = deque(logged)

    def recv(self, timeout_s):
        if self._records:
            return self._records.popleft()
        self.stopping.set()
        return None

    def publish(self, record):
        self.published.append(record)
        return True


def test_the_heartbeat_sink_pings_while_stepping_and_warns_once_when_it_cannot(
    tmp_path, receiver, monkeypatch
):
    monkeypatch.setenv("TM_HEARTBEAT_URL", receiver.url("/hb/run-1"))
    monkeypatch.setenv("TM_HEARTBEAT_INTERVAL_S", "1")
    (tmp_path / "tm.toml").write_text("[alerts.hung]\nfloor_s = 2\n")
    # stepping at t 1..3, hung at 4..6 (since 3 s > 2 s), stepping at 7
    sequence = [snapshot(t) for t in (1, 2, 3)] + [snapshot(t, since=3.0) for t in (4, 5, 6)] + [snapshot(7)]
    HeartbeatSink().run(StandIn(tmp_path, sequence))
    assert [path for _, _, path in receiver.requests] == ["/hb/run-1"] * 4
    monkeypatch.setenv("TM_HEARTBEAT_URL", closed_port_url())
    ctx = StandIn(tmp_path, [snapshot(t) for t in (1, 2, 3)])
    HeartbeatSink().run(ctx)
    (notice,) = [r for r in ctx.published if isinstance(r, records.Notice)]
    assert notice.topic == "heartbeat" and notice.message.startswith("heartbeat request failed (")
    assert "127.0.0.1" not in notice.message


def test_without_a_url_the_heartbeat_is_not_even_started(monkeypatch):
    from trainmeter_core import builtin

    monkeypatch.delenv("TM_HEARTBEAT_URL", raising=False)
    assert "heartbeat" not in [c.name for c in builtin.trainmeter_sinks()]
    monkeypatch.setenv("TM_HEARTBEAT_URL", "http://127.0.0.1:9/x")
    assert "heartbeat" in [c.name for c in builtin.trainmeter_sinks()]


LOOP = """
import sys, time
from pathlib import Path
from trainmeter_agent import emit
marks = Path(sys.argv[1])
def mark(what):
    with marks.open("a") as f:
        f.write(f"{what} {time.time()}\\n")
for i in range(1, 200):
    emit(step=i, tokens=64)
    if i == 40:
        mark("stall")
        time.sleep(9.0)
        mark("resume")
    time.sleep(0.1)
    if i == 100:
        break
mark("exit")
"""


def marks(path) -> dict[str, float]:
    return {word: float(at) for word, at in (line.split() for line in path.read_text().splitlines())}


# Not heavy: it waits for the hang and the heartbeat's silence (the file's tests: 2.0 s of CPU in 23 s, measured alone),
# so it runs beside the heavy tests.
def test_the_heartbeat_reaches_a_local_server_and_stops_while_hung_and_once_gone(tm_env, tmp_path, receiver):
    (tmp_path / "loop.py").write_text(LOOP)
    (tmp_path / "tm.toml").write_text("[alerts.hung]\nfloor_s = 2\n")
    url = receiver.url("/hb/ae1f4c8e-3b7d-4d6a-9d8c-2f6b9e0a1c55")
    env = dict(tm_env, TM_DISABLE_COMPONENTS="web", TM_HEARTBEAT_URL=url, TM_HEARTBEAT_INTERVAL_S="1")
    proc = subprocess.run(
        [TM, str(tmp_path / "loop.py"), str(tmp_path / "marks")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    at = marks(tmp_path / "marks")
    times = [t for t, _, _ in receiver.requests]
    stepping_before = [t for t in times if t < at["stall"]]
    # hung from 2 s after the last step; a snapshot comes each second and a request may be on its way: 2 s of slack
    while_hung = [t for t in times if at["stall"] + 4.0 < t < at["resume"]]
    after = [t for t in times if at["resume"] + 1.0 < t < at["exit"]]
    gone = [t for t in times if t > at["exit"] + 2.0]
    assert len(stepping_before) >= 2 and while_hung == [] and len(after) >= 2 and gone == []
    assert {path for _, _, path in receiver.requests} == {"/hb/ae1f4c8e-3b7d-4d6a-9d8c-2f6b9e0a1c55"}
    run = only_run(tmp_path / "runs")
    for file in run.rglob("*"):
        if file.is_file():
            assert "ae1f4c8e" not in file.read_bytes().decode("utf-8", "replace"), file
    print(f"heartbeat: {len(times)} requests; stall {at['resume'] - at['stall']:.1f} s", file=sys.stderr)


def test_listing_the_sinks_without_a_heartbeat_loads_no_http_client():
    """Every run's components process lists the sinks through this module; only a run with a heartbeat URL needs
    urllib.request (10 to 15 ms of the process's start). In a fresh interpreter, without the variable."""
    code = (
        "import sys\n"
        "from trainmeter_core import builtin\n"
        "sinks = builtin.trainmeter_sinks()\n"
        "print(sorted(s.__name__ for s in sinks), 'urllib.request' in sys.modules, 'http.client' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TM_HEARTBEAT_URL"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['AlertsFileSink',", "'TerminalSink']", "False", "False"]
