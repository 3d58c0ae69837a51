"""The built-in sinks: one line per alert on stderr, and alerts.jsonl written once per alert, caught up from the run
log after a restart. Components run on a stand-in context (records in, records out) so no bus is needed here."""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque

import pytest

from trainmeter_core.bus import component
from trainmeter_core.components.sinks import (
    AlertsFile,
    AlertsFileSink,
    TerminalSink,
    alert_line,
    last_written_seq,
)
from trainmeter_core.model import records


class StandIn:
    """What a component sees of its context: records to read (then the stop signal), and what it published."""

    def __init__(self, run_dir, logged, stop_first=False):
        self.run_dir = run_dir
        self.meta = {}
        self.stopping = threading.Event()
        self.published = []
        self._records = deque(logged)
        if stop_first:
            self.stopping.set()

    def recv(self, timeout_s):
        if self._records:
            return self._records.popleft()
        self.stopping.set()
        self.stopping.wait(timeout_s)  # as a quiet bus: nothing within the timeout
        return None

    def publish(self, record):
        self.published.append(record)
        return True


@pytest.fixture(autouse=True)
def short_drain(monkeypatch):
    monkeypatch.setattr(component, "STOP_QUIET_S", 0.05)


def alert(seq, state="fired", rule="hung", message="no step for 42 s", **extra):
    return records.Alert(
        seq=seq,
        t=10.0 + seq,
        wall=1_800_000_000.0 + seq,
        rule=rule,
        state=state,
        severity="critical",
        message=message,
        **extra,
    )


def test_a_fired_alert_is_one_line_with_time_rule_severity_and_message():
    # 1_800_000_003 s after the epoch is 2027-01-15 08:00:03 UTC
    assert (
        alert_line(alert(3), local_time=time.gmtime) == "tm: 08:00:03 ALERT hung (critical): no step for 42 s"
    )
    cleared = alert(4, state="cleared", message="cleared after 9 s: stepping again")
    assert (
        alert_line(cleared, local_time=time.gmtime)
        == "tm: 08:00:04 cleared hung: cleared after 9 s: stepping again"
    )


def test_terminal_escapes_in_an_alert_never_reach_the_terminal():
    line = alert_line(alert(1, message="host \x1b[2Jevil\nline"), local_time=time.gmtime)
    assert "\x1b" not in line and "\n" not in line and line.endswith("host ?[2Jevil?line")


def test_the_terminal_sink_prints_each_alert_and_those_that_arrive_while_it_stops(tmp_path, capsys):
    ctx = StandIn(
        tmp_path,
        [alert(1), records.Notice(topic="x", message="not an alert"), alert(2, state="cleared")],
        stop_first=True,
    )
    TerminalSink().run(ctx)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "ALERT hung (critical): no step for 42 s",
        "cleared hung: no step for 42 s",
    ]


def test_alerts_file_writes_each_alert_once_in_the_run_logs_line_format(tmp_path):
    out = AlertsFile(tmp_path)
    assert not (tmp_path / "alerts.jsonl").exists()  # created at the first alert only
    nan = alert(5, rule="loss_nan", numbers={"train_loss": math.nan, "step": 41.0})
    assert out.write(nan) and not out.write(nan) and out.write(alert(6, state="cleared"))
    lines = (tmp_path / "alerts.jsonl").read_bytes().splitlines(keepends=True)
    assert len(lines) == 2
    assert lines[0] == records.to_log_line(records.to_builtins(nan))
    assert json.loads(lines[0])["numbers"] == {
        "train_loss": "NaN",
        "step": 41.0,
    }  # JSON has no NaN: as the log
    assert (tmp_path / "alerts.jsonl").stat().st_mode & 0o777 == 0o600


def test_last_written_seq_skips_a_line_cut_by_a_crash(tmp_path):
    path = tmp_path / "alerts.jsonl"
    path.write_bytes(records.to_log_line(records.to_builtins(alert(7))) + b'{"kind":"alert","seq":9,"ru')
    assert last_written_seq(path) == 7 and last_written_seq(tmp_path / "none.jsonl") == 0


def test_the_file_sink_catches_up_from_the_run_log_then_writes_live_alerts_once(tmp_path):
    log = [
        records.RunStart(
            seq=1,
            run_id="r",
            name="r",
            run_dir=str(tmp_path),
            command=["x"],
            cwd="/",
            tm_version="0",
            python="3",
            platform="p",
        ),
        alert(3),
        alert(7, state="cleared"),
    ]
    (tmp_path / "events-0001.jsonl").write_bytes(
        b"".join(records.to_log_line(records.to_builtins(r)) for r in log)
    )
    AlertsFile(tmp_path).write(alert(3))  # the sink's previous life wrote 3, then crashed before 7
    ctx = StandIn(tmp_path, [alert(7, state="cleared"), alert(9, rule="gpu_xid", subject="n1/gpu0")])
    AlertsFileSink().run(ctx)
    written = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [(a["seq"], a["rule"], a["state"]) for a in written] == [
        (3, "hung", "fired"),
        (7, "hung", "cleared"),
        (9, "gpu_xid", "fired"),
    ]
