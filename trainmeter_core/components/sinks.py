"""The built-in alert sinks: the terminal (one line per alert on stderr) and ``alerts.jsonl`` in the run directory.

Each is a bus component that reads ``alert`` records; the file sink is the one writer of ``alerts.jsonl`` and catches up
from the run log after a restart. Neither ever blocks: a closed stderr silences the terminal sink, and neither sends
anything off the node.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from trainmeter_core.bus.component import Component, ComponentContext, alerts_until_stopped
from trainmeter_core.model import records
from trainmeter_core.runlog.reader import read_log

ALERTS_FILE = "alerts.jsonl"


def _printable(text: str) -> str:
    # Words in an alert may come from the training code (a host name, a metric key): no terminal escapes.
    return "".join(c if c.isprintable() else "?" for c in text)


def alert_line(alert: records.Alert, local_time: Callable[[float], time.struct_time] = time.localtime) -> str:
    """The terminal's line for one alert: local time, ALERT or cleared, the rule, the severity, the message."""
    when = time.strftime("%H:%M:%S", local_time(alert.wall)) if alert.wall else "--:--:--"
    if alert.state == "fired":
        return _printable(f"tm: {when} ALERT {alert.rule} ({alert.severity}): {alert.message}")
    return _printable(f"tm: {when} cleared {alert.rule}: {alert.message}")


class TerminalSink(Component):
    """One line per alert on tm's stderr, as it happens."""

    name = "terminal"
    subscribes = ("alert",)
    shared = True

    def run(self, ctx: ComponentContext) -> None:
        for alert in alerts_until_stopped(ctx):
            try:
                sys.stderr.write(alert_line(alert) + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                return  # stderr is gone (a closed pipe): nobody is reading the terminal


def last_written_seq(path: Path) -> int:
    """The largest hub sequence number in an alerts file (0 when there is none, or none can be read)."""
    last = 0
    try:
        with open(path, "rb") as f:
            for line in f:
                try:
                    seq = json.loads(line).get("seq")
                except (ValueError, AttributeError):
                    continue  # a line cut by a crash
                if isinstance(seq, int) and seq > last:
                    last = seq
    except OSError:
        pass
    return last


class AlertsFile:
    """Appends alerts to ``alerts.jsonl`` in hub order, each once (by sequence number); created at the first alert."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / ALERTS_FILE
        self.last_seq = last_written_seq(self.path)

    def write(self, alert: records.Alert) -> bool:
        if alert.seq is not None and alert.seq <= self.last_seq:
            return False
        line = records.to_log_line(records.to_builtins(alert))
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        if alert.seq is not None:
            self.last_seq = alert.seq
        return True


class AlertsFileSink(Component):
    """Every alert of the run, as JSON lines, in ``alerts.jsonl`` (the same line the run log holds)."""

    name = "alerts-file"
    subscribes = ("alert",)
    shared = True

    def run(self, ctx: ComponentContext) -> None:
        out = AlertsFile(ctx.run_dir)
        # Alerts published while this sink was down (a restart) are in the log after the last one the file holds (an
        # incarnation may die before writing what it had); alerts_until_stopped then skips what the file already has.
        for alert in read_log(ctx.run_dir, kinds={"alert"}, after_seq=out.last_seq):
            if isinstance(alert, records.Alert):
                out.write(alert)
        for alert in alerts_until_stopped(ctx):
            out.write(alert)
