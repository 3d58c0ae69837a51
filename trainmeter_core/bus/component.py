"""What a bus component is: a class with a name, the kinds it reads, and a run loop; and the context it runs in.

Where a component runs (a thread of the shared ``components`` process, or a process of its own) is a placement chosen
by the launcher, never a code change: a component only ever talks through its context.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from trainmeter_core.bus.client import Producer, Subscriber
from trainmeter_core.model import records
from trainmeter_core.runlog.reader import read_log
from trainmeter_core.runlog.tail import last_seq

ALL_KINDS = ("*",)
#: Every kind, with each ``block`` as it is (not expanded into its step, metric and phase records): for a component that
#: takes steps in bulk, as the engine does. ``"block"`` among other kinds asks for blocks as they are too.
ALL_KINDS_WITH_BLOCKS = ("*", "block")
STOP_CHECK_S = 0.1
#: After the launcher asks components to stop, alerts from the final snapshot may still be on their way: wait until
#: the bus has been quiet this long, but never longer than STOP_DRAIN_MAX_S (the supervisor kills at 3 s).
STOP_QUIET_S = 0.2
STOP_DRAIN_MAX_S = 1.5


class Stopping(threading.Event):
    """A component process's stop signal: a ``threading.Event`` that, once set, also leaves a pipe readable, so that a
    component waiting for records on the bus wakes at the stop without looking at the event every ``STOP_CHECK_S``
    (``ComponentContext.recv``). Ten looks a second in each of the shared process's five threads were a third of tm's
    CPU in a run that makes no step, on a virtual machine where each wake costs 100 to 250 µs (docs/performance.md)."""

    def __init__(self) -> None:
        super().__init__()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)

    def fileno(self) -> int:
        """The pipe's read end: readable once the event is set (and from then on)."""
        return self._read_fd

    def set(self) -> None:
        first = not self.is_set()
        super().set()
        if first:
            try:
                os.write(self._write_fd, b"s")
            except OSError:
                pass  # a full pipe is readable already


class Component:
    """Base class of every bus component.

    ``name`` identifies it in ``component`` records and on the command line; ``subscribes`` lists the kinds it reads
    (empty for a pure producer such as a sampler); ``shared`` says whether a built-in may run as a thread of the shared
    ``components`` process (third-party components always get their own process).
    """

    name: ClassVar[str] = ""
    subscribes: ClassVar[tuple[str, ...]] = ()
    shared: ClassVar[bool] = True

    def run(self, ctx: ComponentContext) -> None:
        raise NotImplementedError


class ComponentContext:
    """A component's window on the run: publish, read, the run's facts, and the stop signal."""

    def __init__(
        self,
        name: str,
        run_dir: Path,
        stopping: threading.Event,
        subscribes: tuple[str, ...] = (),
        process: str = "components",
    ) -> None:
        self.name = name
        self.process = process  # the placement that runs it (records.Component's ``process``)
        self.run_dir = Path(run_dir)
        self.stopping = stopping
        endpoints = json.loads((self.run_dir / "endpoints.json").read_text())
        self.endpoints = endpoints
        self.meta: dict[str, Any] = json.loads((self.run_dir / "meta.json").read_text())
        self._producer = Producer(endpoints["in"], source=name, linger_ms=1000)
        # ("*",) subscribes to every kind; () to none (a pure producer such as a sampler). A block reaches a component
        # as its rows unless it named the kind "block".
        kinds = None if "*" in subscribes else subscribes
        blocks = "block" in subscribes
        self._subscriber = Subscriber(endpoints["out"], kinds, blocks=blocks) if subscribes else None

    @property
    def child_pid(self) -> int | None:
        return self.meta.get("child_pid")

    def publish(self, record: records.Record) -> bool:
        return self._producer.send(record)

    def publish_many(self, batch: list[records.Record]) -> bool:
        """Publish records made together as one message (``Producer.send_many``): the hub takes them in one wake."""
        return self._producer.send_many(batch)

    def recv(self, timeout_s: float) -> records.Record | records.Unknown | None:
        """The next record, or None after at most ``timeout_s``, or at once when the component is asked to stop (the
        end of a run waits on it): woken by the stop's pipe where ``stopping`` is a ``Stopping``, else looking at the
        event every ``STOP_CHECK_S``. Once stopping, every ``STOP_CHECK_S`` (the pipe stays readable)."""
        if self._subscriber is None:
            self.stopping.wait(timeout_s)
            return None
        stopping = self.stopping
        if type(stopping) is Stopping and not stopping.is_set():
            return self._subscriber.recv(timeout_s, wake_fd=stopping.fileno())
        return self._subscriber.recv(min(timeout_s, STOP_CHECK_S))

    def listen_for(self, kind: str) -> bool:
        """Receive records of one more kind than ``subscribes`` names, from now on (``Subscriber.listen_for``); False
        when the component receives it already, or receives nothing."""
        return self._subscriber is not None and self._subscriber.listen_for(kind)

    def stop_listening(self, kind: str) -> None:
        """Receive no more records of a kind ``listen_for`` added."""
        if self._subscriber is not None:
            self._subscriber.stop_listening(kind)

    def records(self, timeout_s: float = 0.5) -> Iterator[records.Record | records.Unknown]:
        """Records of the subscribed kinds until the component is asked to stop."""
        while not self.stopping.is_set():
            record = self.recv(timeout_s)
            if record is not None:
                yield record

    def done(self) -> None:
        """Say on the bus that this component is done with the run (a ``component`` record, event ``stopped``): the
        alerts component says it once it acted on the final snapshot, and the launcher, which waits for its alert at
        a run's bad end, waits no longer. The hub notes it after run.end and does not write it."""
        self.publish(
            records.Component(name=self.name, event="stopped", process=self.process, child_pid=os.getpid())
        )

    def close(self) -> None:
        self._producer.close(reason="stop")
        if self._subscriber is not None:
            self._subscriber.close()


#: The hub's once-a-second record, received by an alert sink until one comes (``alerts_until_stopped``)
TICK = "tick"
#: How long an alert sink waits for its next record while the run goes on: the stop wakes it at once where the
#: context can be woken (``ComponentContext.recv``), so a shorter wait would only wake it for nothing, 0.1 to 0.2 ms
#: of CPU each time (docs/performance.md, "Sinks that wait for an alert").
ALERT_WAIT_S = 60.0


def alerts_until_stopped(ctx: ComponentContext) -> Iterator[records.Alert]:
    """Every alert of the run, once each and in order: first those already in the run log, then the bus's until the
    component is asked to stop, then those that arrive while the bus drains.

    A component starts after the training did (late on a busy machine), so the alerts raised before it subscribed
    come from the log. Those of an earlier attempt of a resumed run are not repeated; nor, for a component tm
    restarted after a crash, those logged before the crash (its earlier incarnation had them). A context without a
    run directory (a test's stand-in) has no log: it gives the bus's alone.

    Where its subscription took effect is learned from the first alert or hub ``tick`` (once a second) it receives,
    whichever comes first: the alerts logged between the log's first read and that point are read from the log then,
    while it is short. Without that point (a run over within a second, or a context that cannot ``listen_for``) they
    are read at the stop, from a log as long as the run.
    """
    delivered = 0
    for alert in _logged_alerts(ctx):
        delivered = alert.seq or delivered
        yield alert
    # The hub's ticks say where the subscription took effect before any alert may: received until one comes.
    listen_for = getattr(ctx, "listen_for", None)
    ticks = listen_for is not None and listen_for(TICK)
    # A live alert or tick came: anything between the log's part and it is filled in from the log
    joined = False
    drain_until = last_t = None
    while True:
        now = time.monotonic()
        if ctx.stopping.is_set() and drain_until is None:
            drain_until, last_t = now + STOP_DRAIN_MAX_S, now
        if drain_until is not None and (now >= drain_until or now - last_t >= STOP_QUIET_S):  # type: ignore[operator]
            break
        record = ctx.recv(ALERT_WAIT_S)  # at once at the stop, and every STOP_CHECK_S from then on
        alert = isinstance(record, records.Alert)
        if not alert and not (ticks and type(record) is records.Tick):
            continue
        seq = record.seq  # type: ignore[union-attr]  # an alert or a tick
        if seq is not None and seq <= delivered:
            continue  # an alert read from the log already
        if alert:
            last_t = time.monotonic()
        if seq is not None and not joined:
            joined = True
            if ticks:
                ctx.stop_listening(TICK)
                ticks = False
            for logged in _logged_alerts(ctx, after_seq=delivered, before_seq=seq):
                delivered = logged.seq or delivered
                yield logged
        if seq is not None:
            delivered = seq
        if alert:
            yield record  # type: ignore[misc]
    if not joined:
        # None came live: any raised between the first read of the log and the subscription are in the log by now.
        for alert in _logged_alerts(ctx, after_seq=delivered):
            yield alert


#: How long the hand-over from the log to the bus waits for the recorder (it flushes every 100 ms).
LOG_WAIT_S = 2.0


def _logged_alerts(
    ctx: ComponentContext, after_seq: int = 0, before_seq: int | None = None
) -> list[records.Alert]:
    """The alerts of this attempt of the run in the log with ``after_seq < seq < before_seq``, after this component's
    latest crash."""
    run_dir = getattr(ctx, "run_dir", None)
    if run_dir is None:
        return []
    name = getattr(ctx, "name", None)
    # A job hub's log holds the other nodes' records too: only this node's run.start and crashes count.
    host = (getattr(ctx, "meta", None) or {}).get("host")
    if before_seq is not None:
        deadline = time.monotonic() + LOG_WAIT_S
        while ((last_seq(run_dir) or 0) < before_seq - 1) and time.monotonic() < deadline:
            time.sleep(0.02)
    alerts: list[records.Alert] = []
    kinds = {"alert", "run.start", "component"}
    for record in read_log(run_dir, kinds, after_seq=after_seq, before_seq=before_seq):
        if isinstance(record, records.Alert):
            alerts.append(record)
        elif (host is None or record.host in (host, "")) and (
            isinstance(record, records.RunStart)
            or (isinstance(record, records.Component) and record.name == name and record.event == "crashed")
        ):
            alerts.clear()
    return alerts
