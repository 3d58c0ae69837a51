"""Filling a DashboardState. A live run: the dashboard's own parts (alerts, the run's start and end, tm's overhead)
through the one hand-over from log to bus, the numbers from the run's one engine (its snapshots, and its history
copied whole once through its checkpoint, then kept in step by its deltas). A finished run: a replay here, since no
engine runs then.
``dashboard_now`` opens a run either way, once, for ``tm view``, ``tm report`` and ``tm compare``.

It only reads the run directory, never writes to it, and never builds an engine while the run's own engine runs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trainmeter_core.model import records
from trainmeter_core.runlog import rundir
from trainmeter_core.runlog.checkpoint import load_history
from trainmeter_core.runlog.handover import HandOver
from trainmeter_core.runlog.reader import read_log
from trainmeter_core.runlog.replay import replay_engine
from trainmeter_web.dashboard_state import HISTORY_WAIT_S, SIDE_KINDS, DashboardState

#: How often the whole history is asked for again while it has not come.
ASK_EVERY_S = 2.0
#: How long a stopping follower keeps reading what the bus already delivered.
DRAIN_ON_STOP_S = 0.3
#: The incarnation name of a history a replay computed here (no engine's deltas ever follow it).
REPLAYED = "replayed"


def read_meta(run_dir: Path) -> dict:
    try:
        meta = json.loads((Path(run_dir) / "meta.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def replayed_dashboard(run_dir: Path, stats: dict | None = None) -> DashboardState:
    """A run no engine serves any more: the engine's checkpoint plus the log after it replayed here, and the dashboard's
    own parts (alerts, the run's start and end, tm's overhead) from the whole log (only those kinds are decoded)."""
    run_dir = Path(run_dir)
    stats = {} if stats is None else stats
    engine, snapshot = replay_engine(run_dir, stats)
    dashboard = DashboardState(run_dir, read_meta(run_dir))
    side: dict = {}
    for record in read_log(run_dir, kinds=set(SIDE_KINDS), stats=side):  # "block" among them: blocks whole
        dashboard.feed(record)
    dashboard.load_history(engine.history, REPLAYED, 0, snapshot)
    # The whole log was read for the dashboard's own parts (the engine's read began at its checkpoint): its count of
    # unreadable lines is the run's, for the page and for the caller's one line.
    if side["skipped"] > stats.get("skipped", 0):
        stats["skipped"], stats["reasons"] = side["skipped"], side["reasons"]
    dashboard.note_skipped(stats)
    return dashboard


class Follower:
    """Catches a dashboard up with a live run, then feeds it from the bus; ``ask`` publishes a ``history.request``."""

    def __init__(
        self,
        dashboard: DashboardState,
        recv: Callable[[float], records.Record | records.Unknown | None],
        stopping: threading.Event,
        ask: Callable[[str], None],
    ) -> None:
        assert dashboard.run_dir is not None, "a live run has a run directory"
        self.dashboard = dashboard
        self.stopping = stopping
        self.handover = HandOver(dashboard.run_dir, recv, stopping)
        self._ask = ask
        self._asked_at: float | None = None

    def catch_up(self) -> bool:
        """Read the dashboard's own parts from the log up to the first record that came live, and wait (a little) for the
        engine's history where it is wanted already (``DashboardState.history_wanted``; else it is asked for once it
        is). False when asked to stop before any record came."""
        handover = self.handover
        if not handover.wait_first_live():
            return False
        # Asked once a record came: the subscription is live, so the answer cannot pass by unseen.
        self._ask_again()
        handover.wait_for_log()
        stats: dict = {}
        for record in handover.from_log(kinds=set(SIDE_KINDS), stats=stats):
            self.dashboard.feed(record)
        self.dashboard.note_skipped(stats)  # lines of the log before the first live record it could not read
        deadline = time.monotonic() + HISTORY_WAIT_S
        while (
            self.dashboard.needs_history
            and self.dashboard.history_wanted
            and not self.stopping.is_set()
            and time.monotonic() < deadline
        ):
            record = handover.next(0.1)
            if record is not None:
                self._feed(record)
            else:
                self._ask_again()
        return True

    def ask(self, reason: str) -> None:
        self._asked_at = time.monotonic()
        self._ask(reason)

    def _ask_again(self) -> None:
        """Ask for the whole history where it is wanted and missing, at once the first time, then every ASK_EVERY_S."""
        dashboard = self.dashboard
        if (
            dashboard.needs_history
            and dashboard.history_wanted
            and (self._asked_at is None or time.monotonic() - self._asked_at >= ASK_EVERY_S)
        ):
            self.ask("start" if dashboard.replica.incarnation is None else "out of step")

    def _feed(self, record: records.Record | records.Unknown) -> bool:
        if records.kind_of(record) == "history.sync":
            return self._load_history()
        changed = self.dashboard.feed(record)
        if self.dashboard.needs_history:
            self._ask_again()
        return changed

    def _load_history(self) -> bool:
        """The engine wrote its history into its checkpoint: take it, if this copy needs it."""
        if not self.dashboard.needs_history:
            return False
        saved = load_history(self.dashboard.run_dir)  # type: ignore[arg-type]
        if saved is None:
            return False
        if self.dashboard.load_history(saved.history, saved.incarnation, saved.history_n, saved.snapshot):
            self._asked_at = None  # answered: the next gap is asked about at once
        return True

    def run_live(self, changed: Callable[[], None]) -> None:
        """Feed live records until asked to stop; ``changed`` is called after each change of the dashboard."""
        changed()
        while not self.stopping.is_set():
            record = self.handover.next(0.5)
            if record is None:
                self._ask_again()
                continue
            if self._feed(record):
                changed()
        # Asked to stop: what already arrived (the run's end, just before tm stops its components) still counts.
        deadline = time.monotonic() + DRAIN_ON_STOP_S
        fed = False
        while time.monotonic() < deadline:
            record = self.handover.next(0.0)
            if record is None:
                break
            fed = self._feed(record) or fed
        if fed:
            changed()


class Following:
    """A live run followed like the web component does: the dashboard's own parts through the one hand-over, its
    numbers from the run's engine (over the bus). ``dashboard`` is None when asked to stop before any record came."""

    def __init__(self, run_dir: Path, stopping: threading.Event) -> None:
        from trainmeter_core.bus.client import Producer, Subscriber, read_endpoints

        endpoints = read_endpoints(run_dir)
        self.subscriber = Subscriber(endpoints["out"], blocks=True)  # the dashboard takes a block whole
        self.producer = Producer(endpoints["in"], source="view", linger_ms=0)
        dashboard = DashboardState(run_dir, read_meta(run_dir))
        producer = self.producer
        self.follower = Follower(
            dashboard,
            self.subscriber.recv,
            stopping,
            lambda reason: producer.send(records.HistoryRequest(reason=reason)),
        )
        self.dashboard: DashboardState | None = dashboard if self.follower.catch_up() else None

    def close(self) -> None:
        self.subscriber.close()
        self.producer.close(linger_ms=0)


def finished_dashboard(run_dir: Path, stats: dict | None = None) -> DashboardState:
    """A run no engine serves any more, replayed here from its engine's checkpoint and the log after it."""
    dashboard = replayed_dashboard(run_dir, stats)
    if dashboard.run_end is None:
        dashboard.meta["lost"] = True  # no launcher holds it and it never ended: the run was lost
    return dashboard


def dashboard_now(
    run_dir: Path, stats: dict | None = None, stopping: threading.Event | None = None
) -> DashboardState | None:
    """The run as the dashboard sees it now, once: a finished run replayed here, a live one caught up with its
    engine's snapshot and history (still one engine). None when stopped before a live run said anything."""
    if not rundir.is_live(run_dir):
        return finished_dashboard(run_dir, stats)
    following = Following(run_dir, stopping or threading.Event())
    try:
        return following.dashboard
    finally:
        following.close()
