"""Keeping a copy of the engine's history in step with it: the points the engine adds, journaled and sent as
``history`` deltas, and a replica (the dashboard's) that applies them in order and knows when it must ask for the
whole history again.

Pure: no I/O, no clock. A History is deterministic given its ``add_point`` calls, so a replica that makes the same calls
in the same order holds the same arrays as the engine, bucket for bucket. The replica never guesses: a delta out of
step leaves it as it was and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from trainmeter_core.model import records
from trainmeter_core.model.history import History

__all__ = ["JournaledHistory", "HistoryReplica", "Applied"]

Applied = Literal["applied", "already", "out of step"]


class JournaledHistory(History):
    """The engine's History, which also remembers the points added since the last ``take``."""

    def __init__(self, capacity: int = 4096, merge: int = 16, tiers: int = 3) -> None:
        super().__init__(capacity, merge, tiers)
        #: False: points are added to the history alone, nothing journaled (nobody receives deltas yet)
        self.journaling = True
        # In the order added: a point (its series, then its axes and value as floats), or a run of points of one series
        # (``add_points``: its series, then each axis and the values as a list)
        self._journal: list[tuple[str, Any, Any, Any, Any, Any]] = []

    def add_point(
        self, series: str, step: float, tokens: float, flop: float, wall: float, value: float
    ) -> None:
        super().add_point(series, step, tokens, flop, wall, value)
        if self.journaling:
            self._journal.append((series, step, tokens, flop, wall, value))

    def add_points(
        self,
        series: str,
        step: Sequence[float],
        tokens: Sequence[float],
        flop: Sequence[float],
        wall: Sequence[float],
        value: Sequence[float],
    ) -> None:
        super().add_points(series, step, tokens, flop, wall, value)
        if value and self.journaling:
            self._journal.append((series, list(step), list(tokens), list(flop), list(wall), list(value)))

    def take(
        self,
    ) -> tuple[list[str], list[tuple[int, list[float], list[float], list[float], list[float], list[float]]]]:
        """The points added since the last ``take``: the series' names, then each series' points as one run (its
        index, then its steps, tokens, flops, walls and values as columns), the runs in the order their series first
        gained a point; empties the journal."""
        index: dict[str, int] = {}
        runs: list[tuple[int, list[float], list[float], list[float], list[float], list[float]]] = []
        for series, step, tokens, flop, wall, value in self._journal:
            i = index.get(series)
            if i is None:
                i = index[series] = len(index)
                runs.append((i, [], [], [], [], []))
            _, steps, tokens_, flops, walls, values = runs[i]
            if type(value) is list:
                steps.extend(step)
                tokens_.extend(tokens)
                flops.extend(flop)
                walls.extend(wall)
                values.extend(value)
            else:
                steps.append(step)
                tokens_.append(tokens)
                flops.append(flop)
                walls.append(wall)
                values.append(value)
        self._journal.clear()
        return list(index), runs

    def journaled(self) -> int:
        """How many points wait for the next ``take``."""
        return sum(len(value) if type(value) is list else 1 for *_, value in self._journal)

    def forget(self) -> None:
        """Drop the journal (what it holds reaches replicas another way: a full history)."""
        self._journal.clear()


class HistoryReplica:
    """A copy of the engine's history: loaded whole once, then kept in step by the engine's deltas.

    ``incarnation`` is None until the first whole history is loaded; ``n`` is the last delta reflected.
    """

    def __init__(self) -> None:
        self.history = History()
        self.incarnation: str | None = None
        self.n = 0

    @property
    def synced(self) -> bool:
        return self.incarnation is not None

    def load(self, history: History, incarnation: str, n: int) -> None:
        """Take a whole history (from the engine's checkpoint) that reflects delta ``n`` of ``incarnation``."""
        self.history = history
        self.incarnation = incarnation
        self.n = n

    def apply(self, delta: records.HistoryDelta) -> Applied:
        """Apply the next delta. ``already``: this copy reflects it; ``out of step``: a delta is missing, another
        engine sent it, or it lacks points (the engine kept no journal), and only a whole history puts the copy right
        (it is left untouched)."""
        if delta.incarnation != self.incarnation:
            return "out of step"
        if delta.n <= self.n:
            return "already"
        if delta.n != self.n + 1 or not delta.complete:
            return "out of step"
        names = delta.series
        if not all(0 <= point[0] < len(names) for point in delta.points):
            return "out of step"  # a point names a series the delta does not list: not the engine's
        for i, steps, *columns in delta.runs:
            if not 0 <= i < len(names) or any(len(column) != len(steps) for column in columns):
                return "out of step"  # a run names a series the delta does not list, or its columns disagree
        add = self.history.add_point
        for i, step, tokens, flop, wall, value in delta.points:
            add(names[i], step, tokens, flop, wall, value)
        add_points = self.history.add_points
        for i, steps, tokens, flops, walls, values in delta.runs:
            add_points(names[i], steps, tokens, flops, walls, values)
        self.n = delta.n
        return "applied"
