"""The live push to one page: the whole document first, then only what changed, as JSON merge patches (RFC 7396),
and new history points at the page's resolution.

It never sends a number twice, nor more points than the page can draw: a series gains a point on the page once it
gained about ``1/points`` of its history on the server, each sent point carrying the min and max it covers.
"""

from __future__ import annotations

from typing import Any

from trainmeter_web.dashboard_state import DashboardState

DEFAULT_POINTS = 600
MIN_POINTS = 10
MAX_POINTS = 5000


def merge_patch(old: Any, new: Any) -> dict[str, Any] | None:
    """The JSON merge patch that turns ``old`` into ``new`` (both mappings); None when they are equal.

    Keys that disappeared are null; nested mappings are patched key by key; anything else is replaced whole.
    """
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
            continue
        before = old[key]
        if before is value:
            continue
        if isinstance(value, dict) and isinstance(before, dict):
            sub = merge_patch(before, value)
            if sub is not None:
                patch[key] = sub
        elif before != value or type(before) is not type(value):
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch or None


class LiveStream:
    """One page's view: its x axis, its resolution, and what it was last sent."""

    def __init__(self, dashboard: DashboardState, x_axis: str, points: int = DEFAULT_POINTS) -> None:
        self.dashboard = dashboard
        self.x_axis = x_axis
        self.points = max(MIN_POINTS, min(MAX_POINTS, points))
        self._doc: dict[str, Any] | None = None
        self._sent_added: dict[str, int] = {}  # series -> the server's point count when it was last sent
        self._last_x: dict[str, float] = {}

    def full(self) -> dict[str, Any]:
        """The first event: the whole document and every series' history on this page's axis."""
        dashboard = self.dashboard
        with dashboard.lock:
            doc = dashboard.live_doc()
            series = {name: self._history(name, None, self.points) for name in doc["catalog"]}
        self._doc = doc
        return {"doc": doc, "x_axis": self.x_axis, "points": self.points, "series": series}

    def update(self) -> dict[str, Any] | None:
        """The next event: a patch of the document and the series' new points, or None when nothing changed."""
        dashboard = self.dashboard
        with dashboard.lock:
            doc = dashboard.live_doc()
            patch = merge_patch(self._doc, doc) if self._doc is not None else doc
            self._doc = doc
            final = doc["status"].get("state") == "finished"
            fresh: dict[str, list] = {}
            for name in doc["catalog"]:
                added = dashboard.added_points(name)
                before = self._sent_added.get(name)
                if before is None:
                    points = self._history(name, None, self.points)
                elif added > before:
                    # One page point per 1/points of the series: a week-long run sends a point per series every
                    # few minutes, a short one every tick.
                    gate = max(1, added // self.points)
                    if added - before < gate and not final:
                        continue
                    points = self._history(name, self._last_x.get(name), max(1, (added - before) // gate))
                else:
                    continue
                if points:
                    fresh[name] = points
        event: dict[str, Any] = {}
        if patch:
            event["doc"] = patch
        if fresh:
            event["series"] = fresh
        return event or None

    def _history(self, name: str, since: float | None, max_points: int) -> list:
        dashboard = self.dashboard
        self._sent_added[name] = dashboard.added_points(name)
        points = dashboard.history(name, self.x_axis, since, max_points)
        if points:
            self._last_x[name] = points[-1].x
        return points
