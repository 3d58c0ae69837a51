"""The run's engine and a dashboard's state joined as the bus joins them, without the bus: a record goes to the model
and to the engine (the engine component's ``LiveEngine``), and what the engine publishes (its snapshot, then its
history delta) goes to the model. The model starts from the engine's whole (empty) history, as a ``history.sync``
would give it."""

from __future__ import annotations

import weakref

from trainmeter_core.components.engine import LiveEngine
from trainmeter_core.model import records
from trainmeter_core.model.history import History
from trainmeter_web.dashboard_state import DashboardState


class LiveRun:
    def __init__(self, model: DashboardState | None = None) -> None:
        self.model = model if model is not None else DashboardState()
        self.live = LiveEngine()
        self.published: list[records.Record] = []
        whole = History.from_state(self.live.history.to_state())
        self.model.load_history(whole, self.live.incarnation, self.live.n)

    def feed(self, record: records.Record) -> bool:
        """The record, then what the engine made of it; True when the model's document changed."""
        changed = self.model.feed(record)
        for out in self.live.feed(record):
            self.published.append(out)
            changed = self.model.feed(out) or changed
        return changed


_JOINED: weakref.WeakKeyDictionary[DashboardState, LiveRun] = weakref.WeakKeyDictionary()


def feed(model: DashboardState, record: records.Record) -> bool:
    """Feed ``record`` to ``model`` and to the engine joined to it (one per model, made on first use)."""
    joined = _JOINED.get(model)
    if joined is None:
        joined = _JOINED[model] = LiveRun(model)
    return joined.feed(record)
