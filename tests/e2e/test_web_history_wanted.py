"""The dashboard tm serves asks the engine for its history only once someone looks: until a page or a request that
reads the history comes, the engine keeps no journal of its points (its deltas say they are not complete) and no
``history.request`` is on the bus; the first request that reads the history waits for it and gets it, and the engine's
deltas are complete from then on."""

from __future__ import annotations

import http.client
import json
import re
import threading

from dashboard_page import LiveTm
from deadline import wait_for
from tm_runs import only_run

from trainmeter_core.bus.client import Subscriber, read_endpoints


class _Heard:
    """Every ``history`` and ``history.request`` record on the run's bus, from a thread of the test."""

    def __init__(self, run_dir) -> None:
        self.subscriber = Subscriber(read_endpoints(run_dir)["out"], kinds=["history", "history.request"])
        self.deltas: list = []
        self.requests: list = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            record = self.subscriber.recv(0.1)
            if record is None:
                continue
            (self.deltas if type(record).__name__ == "HistoryDelta" else self.requests).append(record)

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.subscriber.close()


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


def test_the_served_dashboard_asks_for_the_engines_history_only_once_someone_looks(tm_env, tmp_path):
    tm = LiveTm(dict(tm_env), tmp_path, [])
    heard = None
    try:
        match = re.match(r"http://[^:/]+:(\d+)/(?:\?token=(\S+))?", tm.url)
        assert match, tm.url
        port, token = int(match.group(1)), match.group(2)
        query = f"&token={token}" if token else ""
        run_dir = wait_for(lambda: only_run(tm.runs) if tm.runs.exists() else None, what="the run directory")
        wait_for(lambda: (run_dir / "endpoints.json").exists(), what="the hub's endpoints")
        heard = _Heard(run_dir)
        # The web process serves (its catch-up is over): a request that reads no history wants none.
        wait_for(lambda: _get(port, "/api/run?" + query[1:])[0] == 200, what="the dashboard to serve")
        wait_for(lambda: len(heard.deltas) >= 3, what="three history deltas")
        assert heard.requests == []  # nobody asked the engine for its history
        assert all(
            not d.complete and not d.runs and not d.points for d in heard.deltas
        )  # so it journals nothing

        # Someone reads the history: the request waits for the copy and gets it, points and all.
        status, body = _get(port, "/api/history?series=train_loss" + query)
        assert status == 200, body
        points = json.loads(body)["series"]["train_loss"]
        assert len(points) >= 3 and points[0][0] == 1.0  # from the run's first step on
        assert [r.reason for r in heard.requests[:1]] == ["start"]
        # The engine journals from then on: its next deltas carry the points added since the one before.
        asked = len(heard.deltas)
        wait_for(
            lambda: any(d.complete and d.runs for d in heard.deltas[asked:]),
            what="a complete delta with points",
        )
        assert tm.finish() == 0
    finally:
        if heard is not None:
            heard.close()
        tm.kill()
