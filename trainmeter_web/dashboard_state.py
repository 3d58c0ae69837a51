"""What the dashboard knows of one run: the engine's snapshots and a copy of its history (kept in step by the engine's
``history`` deltas), plus what the page shows beside them (the run's identity, alerts, tm's own overhead), as
JSON-ready documents.

It owns no socket, no file and no clock; the web component and ``tm view`` feed it. It never computes a number of the
engine's (the run has one engine), and every string in it came from the run and is shown by the page as text only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import msgspec

from trainmeter_core.model import money, records
from trainmeter_core.model.history import AXIS_ALIASES, X_AXES, History, HistoryPoint
from trainmeter_core.model.history_sync import HistoryReplica

#: Alerts kept for the page (the newest); the run log keeps every one.
ALERTS_KEPT = 200
NOTICES_KEPT = 50
#: History answers cached per (series, axis, since, points) while the series gains no point.
HISTORY_CACHE_ENTRIES = 512
#: History deltas kept while the copy waits for a whole history (about ten minutes of ticks).
DELTAS_HELD = 600
#: How long a dashboard that wants the engine's whole history waits for it before it serves without it (and keeps
#: asking): ``tm view`` of a live run at its start, a request within this long of the first that wanted it.
HISTORY_WAIT_S = 5.0
#: The kinds the dashboard reads besides the engine's (what ``tm view`` and a dashboard take from the log). Of a step
#: it reads the agent's own time alone, so it takes a block as it is (its ``agent_us`` column), never its rows.
SIDE_KINDS = frozenset({"alert", "step", "block", "run.start", "run.end", "bus.stats", "component", "notice"})
_PREFIX_METRIC = "tm:"
_PREFIX_GPU = "tm:gpu:"
_PREFIX_RANK = "tm:rank:"

_encoder = msgspec.json.Encoder()
#: Units of the per-GPU and per-rank series (the others of them are fractions 0..1, which carry no unit).
_COUNTER_UNITS = {"power_w": "W", "clock_sm_mhz": "MHz", "step_time_s": "s"}


def series_group(name: str) -> dict[str, Any]:
    """How the page files a history series: ``loop`` (what the loop reports), ``metric``, ``gpu`` or ``rank``.

    The engine names its own series ``tm:<metric>``, ``tm:<metric>.low``/``.high`` (a range), ``tm:gpu:<host>/gpu<i>:
    <counter>`` and ``tm:rank:<r>:step_time_s``; everything else is a loop series under its canonical name.
    """
    if name.startswith(_PREFIX_GPU):
        device, _, counter = name[len(_PREFIX_GPU) :].rpartition(":")
        return {"group": "gpu", "device": device, "counter": counter}
    if name.startswith(_PREFIX_RANK):
        middle, _, counter = name[len(_PREFIX_RANK) :].rpartition(":")
        try:
            rank: int | str = int(middle)
        except ValueError:
            rank = middle
        return {"group": "rank", "rank": rank, "counter": counter}
    if name.startswith(_PREFIX_METRIC):
        metric = name[len(_PREFIX_METRIC) :]
        for end in (".low", ".high"):
            if metric.endswith(end):
                return {"group": "metric", "metric": metric[: -len(end)], "range_end": end[1:]}
        return {"group": "metric", "metric": metric}
    return {"group": "loop"}


class DashboardState:
    """One run as the dashboard sees it. Thread-safe: one feeder, any number of readers, one lock."""

    def __init__(
        self,
        run_dir: Path | None = None,
        meta: dict | None = None,
        price: money.Price | None = None,
        *,
        history_wanted: bool = True,
    ) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None
        #: The price whoever looks gave (model/money.py): held here in memory only, never written anywhere.
        self.price = price
        self.meta: dict[str, Any] = dict(meta or {})
        self.replica = HistoryReplica()
        self.lock = threading.RLock()
        self.snapshot: records.Snapshot | None = None
        self.run_start: records.RunStart | None = None
        self.run_end: records.RunEnd | None = None
        self.alerts: list[dict[str, Any]] = []
        self.notices: list[dict[str, Any]] = []
        self.bus_stats: records.BusStats | None = None
        self.components: dict[str, dict[str, Any]] = {}
        self.agent_us_total = 0.0
        self.agent_us_steps = 0
        self.agent_us_last: float | None = None
        #: The log lines that filling this dashboard had to skip (cut short, not JSON, not a record), by reason.
        self.log_skipped: dict[str, Any] = {"lines": 0, "reasons": {}}
        self.version = 0  # bumped whenever the live document changes
        self.through_seq = 0
        #: True while the history copy waits for a whole one (it never had one, or a delta came out of step).
        self.needs_history = True
        #: Whether the history copy is wanted, and so asked for (``Follower``): from the start (``tm view`` of a live
        #: run), or from the first request of the served dashboard that reads it (``want_history``; docs/api.md).
        self.history_wanted = history_wanted
        self._held: deque[records.HistoryDelta] = deque(maxlen=DELTAS_HELD)
        self._doc: dict[str, Any] | None = None
        self._doc_version = -1
        self._history_cache: OrderedDict[tuple, tuple[list[HistoryPoint], bytes | None]] = OrderedDict()
        self._encoded: dict[str, tuple[int, bytes]] = {}

    # ------------------------------------------------------------------------------------------------------------------
    # Feeding

    def feed(self, record: records.Record | records.Unknown) -> bool:
        """Take one record in hub order, the engine's included; True when the live document changed (a snapshot, an
        alert, the run's end, new history points)."""
        kind = records.kind_of(record)
        with self.lock:
            if kind == "snapshot":
                return self._on_snapshot(record)  # type: ignore[arg-type]
            if kind == "history":
                return self._on_delta(record)  # type: ignore[arg-type]
            if kind in records.DERIVED_KINDS:
                return False  # requests for the history and their answers: the web component's business
            if record.seq is not None:
                self.through_seq = record.seq
            changed = False
            if kind == "alert":
                self._on_alert(record)  # type: ignore[arg-type]
                changed = True
            elif kind == "step":
                agent_us = record.agent_us  # type: ignore[union-attr]
                if agent_us is not None:
                    self.agent_us_total += agent_us
                    self.agent_us_steps += 1
                    self.agent_us_last = agent_us
            elif kind == "block":
                for agent_us in record.agent_us:  # type: ignore[union-attr]  # its steps', in order
                    if agent_us is not None:
                        self.agent_us_total += agent_us
                        self.agent_us_steps += 1
                        self.agent_us_last = agent_us
            elif kind == "run.start":
                self.run_start = record  # type: ignore[assignment]
                self.run_end = None  # a resumed run's next attempt: it runs again
                changed = True
            elif kind == "run.end":
                self.run_end = record  # type: ignore[assignment]
                changed = True
            elif kind == "bus.stats":
                self.bus_stats = record  # type: ignore[assignment]
            elif kind == "component":
                self._on_component(record)  # type: ignore[arg-type]
            elif kind == "notice":
                self.notices.append(
                    {
                        "t": record.t,
                        "wall": record.wall,
                        "level": record.level,
                        "topic": record.topic,  # type: ignore[union-attr]
                        "message": record.message,
                        "source": record.source,
                    }  # type: ignore[union-attr]
                )
                del self.notices[:-NOTICES_KEPT]
            if changed:
                self.version += 1
            return changed

    def _on_snapshot(self, snapshot: records.Snapshot) -> bool:
        current = self.snapshot
        if current is not None and (snapshot.through_seq or 0) < (current.through_seq or 0):
            return False  # an older one (from a checkpoint read after a newer one came on the bus)
        self.snapshot = snapshot
        self.version += 1
        return True

    def want_history(self) -> bool:
        """Someone looks at the dashboard: its copy of the history is wanted from now on (the follower asks the engine
        at its next record, or within half a second). True the first time, False when it already was."""
        if self.history_wanted:
            return False
        self.history_wanted = True
        return True

    def _on_delta(self, delta: records.HistoryDelta) -> bool:
        if self.needs_history:
            self._held.append(delta)
            return False
        outcome = self.replica.apply(delta)
        if outcome == "out of step":
            self.needs_history = True
            self._held.append(delta)
            return False
        if outcome == "applied" and (delta.points or delta.runs):
            self.version += 1
            return True
        return False

    def load_history(
        self, history: History, incarnation: str, n: int, snapshot: records.Snapshot | None = None
    ) -> bool:
        """Take the engine's whole history (reflecting delta ``n`` of ``incarnation``) and the snapshot beside it, then
        the deltas held since; True when the copy is in step afterwards."""
        with self.lock:
            self.replica.load(history, incarnation, n)
            self.needs_history = False
            held, self._held = list(self._held), deque(maxlen=DELTAS_HELD)
            for delta in held:
                if self.needs_history:
                    self._held.append(delta)
                elif delta.incarnation != incarnation:
                    continue  # another engine's: if it is the live one, its next delta asks again
                elif self.replica.apply(delta) == "out of step":
                    self.needs_history = True
                    self._held.append(delta)
            if snapshot is not None:
                self._on_snapshot(snapshot)
            self._history_cache.clear()
            self.version += 1
            return not self.needs_history

    def _on_alert(self, alert: records.Alert) -> None:
        key = f"{alert.rule}|{alert.subject or ''}|{alert.episode}"
        for entry in self.alerts:
            if entry["id"] == key:
                entry["state"] = alert.state
                if alert.state == "cleared":
                    entry["cleared_wall"] = alert.wall
                    entry["cleared_message"] = alert.message
                else:
                    entry["message"] = alert.message
                    entry["numbers"] = dict(alert.numbers)
                return
        self.alerts.append(
            {
                "id": key,
                "rule": alert.rule,
                "state": alert.state,
                "severity": alert.severity,
                "message": alert.message,
                "subject": alert.subject,
                "numbers": {k: v for k, v in alert.numbers.items()},
                "fired_wall": alert.wall if alert.state == "fired" else None,
                "cleared_wall": alert.wall if alert.state == "cleared" else None,
            }
        )
        del self.alerts[:-ALERTS_KEPT]

    def _on_component(self, event: records.Component) -> None:
        entry = self.components.setdefault(event.name, {"name": event.name, "crashes": 0, "restarts": 0})
        entry["event"] = event.event
        entry["wall"] = event.wall
        if event.event == "crashed":
            entry["crashes"] += 1
        entry["restarts"] = max(entry["restarts"], event.restarts)

    def note_skipped(self, stats: dict) -> None:
        """The lines a reader of the run's log skipped while filling this dashboard (``read_log``'s ``stats``)."""
        if stats.get("skipped"):
            with self.lock:
                self.log_skipped = {"lines": stats["skipped"], "reasons": dict(stats.get("reasons") or {})}
                self.version += 1

    def skipped_line(self) -> str | None:
        """``skipped N unreadable lines of the log (...)``, as ``tm view --json`` says it; None when none was."""
        from trainmeter_core.runlog.replay import skipped_line

        with self.lock:
            skipped = self.log_skipped
        return skipped_line({"skipped": skipped["lines"], "reasons": skipped["reasons"]})

    # ------------------------------------------------------------------------------------------------------------------
    # Documents (plain data, ready for JSON)

    def current_snapshot(self) -> records.Snapshot:
        """The engine's latest snapshot; before the first, an empty one that says the run is starting."""
        with self.lock:
            return self.snapshot if self.snapshot is not None else records.Snapshot(tick=0, state="starting")

    def run_doc(self) -> dict[str, Any]:
        """The run: identity, command (secrets already redacted by the launcher), state, facts with provenance."""
        with self.lock:
            meta = self.meta
            start = self.run_start
            end = self.run_end
            snapshot = self.current_snapshot()
            doc: dict[str, Any] = {
                "run_id": meta.get("run_id") or (start.run_id if start else None),
                "name": meta.get("name") or (start.name if start else None),
                "run_dir": meta.get("run_dir") or (str(self.run_dir) if self.run_dir else None),
                "command": list(meta.get("command") or (start.command if start else [])),
                "cwd": meta.get("cwd") or (start.cwd if start else None),
                "host": meta.get("host") or (start.host if start else None),
                "start_wall": meta.get("start_wall") or (start.wall if start else None),
                "tm_version": meta.get("tm_version") or (start.tm_version if start else None),
                "python": meta.get("python") or (start.python if start else None),
                "platform": meta.get("platform") or (start.platform if start else None),
                "agent": meta.get("agent", start.agent if start else None),
                "env": dict(meta.get("env") or (start.env if start else {})),
                "plugins": [_plain(p) for p in (meta.get("plugins") or (start.plugins if start else []))],
                "status": self._status(),
                "facts": [records.to_builtins(f) for f in snapshot.facts.values()],
                # The log's unreadable lines, and the warning the page shows of them: its numbers leave them out.
                "log_skipped": {
                    "lines": self.log_skipped["lines"],
                    "reasons": dict(self.log_skipped["reasons"]),
                },
                "warnings": list(snapshot.warnings) + [w for w in [self.skipped_line()] if w],
                "notices": [dict(n) for n in self.notices],
            }
            if end is not None:
                doc["end"] = records.to_builtins(end)
            return doc

    def _status(self) -> dict[str, Any]:
        """The run's state as the header shows it: running, finished with its exit status, or lost."""
        end = self.run_end
        if end is not None:
            return {
                "state": "finished",
                "exit_status": end.status,
                "reason": end.reason,
                "signal_name": end.signal_name,
                "end_wall": end.wall,
            }
        if self.meta.get("lost"):
            return {"state": "lost"}
        snapshot = self.snapshot
        return {"state": snapshot.state if snapshot is not None else "starting"}

    def overhead_doc(self) -> dict[str, Any]:
        """tm's own cost: the agent's µs per step, records dropped on the bus, component crashes."""
        doc: dict[str, Any] = {}
        if self.agent_us_steps:
            doc["agent_us_per_step"] = self.agent_us_total / self.agent_us_steps
            doc["agent_us_last"] = self.agent_us_last
            doc["agent_steps"] = self.agent_us_steps
        else:
            doc["agent_absent"] = "no step carried the agent's own time"
        stats = self.bus_stats
        if stats is not None:
            doc["dropped_total"] = stats.dropped_total
            doc["log_queue_dropped"] = stats.log_queue_dropped
            doc["log_reserve_active"] = stats.log_reserve_active
            doc["received"] = stats.received
        else:
            doc["drops_absent"] = "no bus.stats record yet"
        crashed = {name: c for name, c in self.components.items() if c["crashes"]}
        if crashed:
            doc["component_crashes"] = {name: c["crashes"] for name, c in sorted(crashed.items())}
        return doc

    def snapshot_doc(self, wall_windows: bool = True) -> dict[str, Any]:
        """The latest snapshot as plain data; with ``wall_windows`` every metric's window also in wall time."""
        with self.lock:
            snapshot = self.current_snapshot()
        doc = records.to_builtins(snapshot)
        if wall_windows and snapshot.wall:
            offset = snapshot.wall - snapshot.t  # monotonic t and wall time of the same instant
            for metric in doc.get("metrics", {}).values():
                for end in ("window_start", "window_end"):
                    t = metric.get(f"{end}_t")
                    if t is not None:
                        metric[f"{end}_wall"] = t + offset
        return doc

    def live_doc(self) -> dict[str, Any]:
        """The page's whole state: what the first event of the live stream carries, and what patches then change."""
        with self.lock:
            if self._doc is not None and self._doc_version == self.version:
                return self._doc
            snapshot = self.snapshot_doc(wall_windows=False)
            # Ranks keyed by rank, so a patch carries only the ranks whose numbers moved.
            snapshot["ranks"] = {str(r["rank"]): r for r in snapshot.get("ranks", [])}
            doc = {
                "snapshot": snapshot,
                "status": self._status(),
                "overhead": self.overhead_doc(),
                "alerts": {a["id"]: dict(a) for a in self.alerts},
                "catalog": self.catalog(points=False),
                # Which probes reported a phase: the time split says which parts it could not see (in compute).
                "phases_seen": dict(snapshot.get("phases_seen", {})),
                "money": self.money_doc(),
            }
            self._doc, self._doc_version = doc, self.version
            return doc

    def set_price(self, price: money.Price | None) -> None:
        """The price a viewer gave (``tm view --price-per-gpu-hour``): the money of every document from now on."""
        with self.lock:
            self.price = price
            self.version += 1

    def money_doc(self) -> dict[str, Any]:
        """Money as the price makes it of the latest snapshot, or the reason there is none (``model/money.py``)."""
        with self.lock:
            return money.overlay(self.current_snapshot(), self.price)

    # ------------------------------------------------------------------------------------------------------------------
    # History

    def catalog(self, points: bool = True) -> dict[str, dict[str, Any]]:
        """Every series with history: its group, raw key (a mapped loop series), unit, convention, points added."""
        with self.lock:
            history = self.replica.history
            snapshot = self.snapshot
            metrics = snapshot.metrics if snapshot is not None else {}
            series_now = snapshot.series if snapshot is not None else {}
            out: dict[str, dict[str, Any]] = {}
            for name in history.series_names():
                entry = series_group(name)
                if points:
                    entry["points"] = history.added_points(name)
                if entry["group"] == "loop":
                    point = series_now.get(name)
                    if point is not None:
                        entry["raw_key"] = point.raw_key
                elif entry["group"] in ("gpu", "rank"):
                    unit = _COUNTER_UNITS.get(entry["counter"])
                    if unit:
                        entry["unit"] = unit
                elif entry["group"] == "metric":
                    metric = metrics.get(entry["metric"])
                    if metric is not None:
                        if metric.unit:
                            entry["unit"] = metric.unit
                        if metric.convention:
                            entry["convention"] = metric.convention
                        if metric.label:
                            # History holds what each tick showed, the latest sample; a finished run's snapshot
                            # shows the training window's average under the same key, which is not the chart's.
                            entry["label"] = metric.label.replace("training window", "latest sample")
                out[name] = entry
            return out

    def added_points(self, series: str) -> int:
        with self.lock:
            return self.replica.history.added_points(series)

    def history(
        self, series: str, x_axis: str, since: float | None = None, max_points: int | None = None
    ) -> list[HistoryPoint]:
        """Points (JSON ``[x, value, min, max, count]``) of one series, oldest first (cached while it is unchanged)."""
        return self._history_entry(series, x_axis, since, max_points)[0]

    def history_json(
        self, series: str, x_axis: str, since: float | None = None, max_points: int | None = None
    ) -> bytes:
        """The same points as JSON, encoded once per change of the series (what many pages ask for at once)."""
        with self.lock:
            key = self._history_key(series, x_axis, since, max_points)
            points, encoded = self._history_entry(series, x_axis, since, max_points)
            if encoded is None:
                encoded = _encoder.encode(points)
                self._history_cache[key] = (points, encoded)
            return encoded

    def _history_key(self, series: str, x_axis: str, since: float | None, max_points: int | None) -> tuple:
        return (series, x_axis, since, max_points, self.replica.history.added_points(series))

    def _history_entry(
        self, series: str, x_axis: str, since: float | None, max_points: int | None
    ) -> tuple[list[HistoryPoint], bytes | None]:
        x_axis = AXIS_ALIASES.get(x_axis, x_axis)
        if x_axis not in X_AXES:
            raise ValueError(f"unknown x axis {x_axis!r}; the axes are {', '.join(X_AXES)}")
        with self.lock:
            key = self._history_key(series, x_axis, since, max_points)
            cached = self._history_cache.get(key)
            if cached is not None:
                self._history_cache.move_to_end(key)
                return cached
            entry = (self.replica.history.query(series, x_axis, since=since, max_points=max_points), None)
            self._history_cache[key] = entry
            while len(self._history_cache) > HISTORY_CACHE_ENTRIES:
                self._history_cache.popitem(last=False)
            return entry

    def encoded(self, name: str, build) -> bytes:
        """A document's JSON, built once per version of the state (the API answers many pages from it)."""
        with self.lock:
            hit = self._encoded.get(name)
            if hit is not None and hit[0] == self.version:
                return hit[1]
            body = _encoder.encode(build())
            self._encoded[name] = (self.version, body)
            return body


def _plain(value: Any) -> Any:
    if hasattr(value, "__struct_fields__"):
        return msgspec.to_builtins(value)
    return value


def encode(doc: Any) -> bytes:
    """JSON of a document; NaN and infinity become null (JSON has no such numbers)."""
    return _encoder.encode(doc)
