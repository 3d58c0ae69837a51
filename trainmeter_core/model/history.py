"""History: a timeline per series on every x axis (step, tokens, FLOPs spent, wall time), bounded for a week-long run.

Pure: no I/O, no clock. Recent points stay raw; older ones merge into buckets that keep min, max, mean and count, so a
spike never disappears. It must never grow without bound: each tier holds at most ``capacity`` entries per series.
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Mapping, Sequence
from functools import reduce as _reduce
from operator import add as _add

import msgspec

__all__ = ["AXIS_ALIASES", "X_AXES", "History", "HistoryPoint", "HistoryState", "NoHistory"]

#: The x axes every point carries; an axis a point does not know (FLOPs without a convention) is NaN and skipped.
X_AXES = ("step", "tokens", "flop", "wall")
#: ``flops`` is the FLOPs-spent axis's name before schema 2, accepted for one release.
AXIS_ALIASES = {"flops": "flop"}
_AXIS_INDEX = {axis: i for i, axis in enumerate(X_AXES)} | {
    old: X_AXES.index(new) for old, new in AXIS_ALIASES.items()
}
_NAN = math.nan
_isnan = math.isnan
# A tier spills this many of its buckets-to-be at a time, so the array moves are rare and the bound stays tight.
_SPILL_GROUPS = 16


class HistoryPoint(msgspec.Struct, array_like=True, frozen=True):
    """One point of a query: x on the chosen axis, the mean value, the min and max it covers, how many raw points."""

    x: float
    value: float
    min: float
    max: float
    count: int


class HistoryState(msgspec.Struct):
    """A History as bytes per array (float64, native order): what the engine's checkpoint carries."""

    capacity: int
    merge: int
    tiers: int
    series: dict[str, list[list[bytes]]]  # name -> tiers -> arrays
    added: dict[str, int]


class _Series:
    """Tier 0 is raw (4 x arrays + value); tiers 1.. are buckets (4 x arrays + mean, min, max, count)."""

    __slots__ = ("tiers", "added")

    def __init__(self, n_tiers: int) -> None:
        self.tiers = [[array("d") for _ in range(5)]] + [
            [array("d") for _ in range(8)] for _ in range(n_tiers - 1)
        ]
        self.added = 0


class History:
    """Timelines per series. Memory bound: at most ``tiers`` × ``capacity`` entries per series, each 40-64 bytes.

    With the defaults (capacity 4096, merge 16, 3 tiers) a series keeps its last ~4k points raw, the ~65k before them
    in buckets of 16, and everything older in buckets of 256 or more: at most 12,288 entries (about 0.7 MB), however
    long the run. When the last tier fills it merges its buckets pairwise, so the oldest history only gets coarser.
    """

    #: Whether points added are kept (``NoHistory`` keeps none, so an engine need not compute them).
    keeps = True

    def __init__(self, capacity: int = 4096, merge: int = 16, tiers: int = 3) -> None:
        if capacity < merge * _SPILL_GROUPS * 2 or merge < 2 or tiers < 2:
            raise ValueError(
                f"history needs merge >= 2, tiers >= 2 and capacity >= {2 * _SPILL_GROUPS} x merge, "
                f"got capacity {capacity}, merge {merge}, tiers {tiers}"
            )
        self._capacity = capacity
        self._merge = merge
        self._n_tiers = tiers
        self._series: dict[str, _Series] = {}
        self._appends: dict[str, tuple] = {}  # series -> what add_point needs of it (``_raw_appends``)

    # ------------------------------------------------------------------------------------------------------------------
    # Writing

    def add(self, series: str, x: Mapping[str, float | None], value: float) -> None:
        """Add one point; ``x`` maps axis names (step, tokens, flop, wall) to values, a missing axis is unknown."""
        values = [x.get(axis) for axis in X_AXES]
        self.add_point(series, *(_NAN if v is None else float(v) for v in values), value=float(value))

    def add_point(
        self, series: str, step: float, tokens: float, flop: float, wall: float, value: float
    ) -> None:
        """The engine's fast path: every axis as a float (NaN when unknown)."""
        appends = self._appends.get(series)
        if appends is None:
            appends = self._raw_appends(series)
        append_step, append_tokens, append_flop, append_wall, append_value, values, entry = appends
        append_step(step)
        append_tokens(tokens)
        append_flop(flop)
        append_wall(wall)
        append_value(value)
        entry.added += 1
        if len(values) > self._capacity:
            self._spill(entry, 0)

    def add_points(
        self,
        series: str,
        step: Sequence[float],
        tokens: Sequence[float],
        flop: Sequence[float],
        wall: Sequence[float],
        value: Sequence[float],
    ) -> None:
        """Points of one series in order, an axis a sequence (of one length): the history ``add_point`` leaves for each
        in turn, in one go (each raw array extended once, then spilled as often as its length says, in the same
        chunks: a spill only ever takes the oldest ``merge`` × groups of points)."""
        if not value:
            return
        appends = self._appends.get(series)
        if appends is None:
            appends = self._raw_appends(series)
        entry = appends[6]
        raw = entry.tiers[0]
        # Packed by struct and added as bytes: an array's extend from a list converts each float through its generic
        # item setter, 29 ns a point against 5 here (the same C double, bits and all)
        doubles = f"{len(value)}d"
        for column, points in zip(raw, (step, tokens, flop, wall, value), strict=True):
            column.frombytes(struct.pack(doubles, *points))
        entry.added += len(value)
        values = raw[4]
        while len(values) > self._capacity:
            self._spill(entry, 0)

    def _raw_appends(self, series: str) -> tuple:
        """The ``append`` of each raw array of ``series`` (created when new), its values and its entry: looked up once
        per series, as the raw arrays are only ever changed in place."""
        entry = self._series.get(series)
        if entry is None:
            entry = self._series[series] = _Series(self._n_tiers)
        raw = entry.tiers[0]
        appends = self._appends[series] = (*(column.append for column in raw), raw[4], entry)
        return appends

    def _spill(self, entry: _Series, tier: int) -> None:
        source = entry.tiers[tier]
        chunk = self._merge * _SPILL_GROUPS
        if tier + 1 == self._n_tiers:
            # The last tier has nowhere to spill: it merges all its buckets pairwise and so halves itself.
            merged = [array("d") for _ in range(8)]
            _merge_into(merged, source, 0, len(source[4]), 2)
            entry.tiers[tier] = merged
            return
        target = entry.tiers[tier + 1]
        if tier == 0:
            _merge_raw(target, source, chunk, self._merge)
        else:
            _merge_into(target, source, 0, chunk, self._merge)
        for column in source:
            del column[:chunk]
        if len(target[4]) > self._capacity:
            self._spill(entry, tier + 1)

    # ------------------------------------------------------------------------------------------------------------------
    # Reading

    def series_names(self) -> list[str]:
        return sorted(self._series)

    def stored_points(self, series: str) -> int:
        """Entries held for ``series`` across its tiers (raw points and buckets): what memory grows with."""
        entry = self._series.get(series)
        return 0 if entry is None else sum(len(tier[4]) for tier in entry.tiers)

    def added_points(self, series: str) -> int:
        entry = self._series.get(series)
        return 0 if entry is None else entry.added

    def query(
        self, series: str, x_axis: str = "step", since: float | None = None, max_points: int | None = None
    ) -> list[HistoryPoint]:
        """Points of ``series`` on ``x_axis``, oldest first; ``since`` keeps only points with x > since.

        The x axes grow through a run, so a reader that passes the last x it saw gets only newer points. A bucket's
        x is that of its newest point. ``max_points`` merges neighbours (keeping min, max, count-weighted mean) until
        at most that many remain.
        """
        axis = _AXIS_INDEX.get(x_axis)
        if axis is None:
            raise ValueError(f"unknown x axis {x_axis!r}; the axes are {', '.join(X_AXES)}")
        if max_points is not None and max_points < 1:
            raise ValueError(f"max_points must be 1 or more, got {max_points}")
        entry = self._series.get(series)
        if entry is None:
            return []
        points: list[HistoryPoint] = []
        for tier_index in range(len(entry.tiers) - 1, -1, -1):
            tier = entry.tiers[tier_index]
            xs = tier[axis]
            if tier_index == 0:
                for i, x in enumerate(xs):
                    if x == x and (since is None or x > since):
                        v = tier[4][i]
                        points.append(HistoryPoint(x, v, v, v, 1))
            else:
                for i, x in enumerate(xs):
                    if x == x and (since is None or x > since):
                        points.append(HistoryPoint(x, tier[4][i], tier[5][i], tier[6][i], int(tier[7][i])))
        if max_points is not None and len(points) > max_points:
            points = _thin(points, max_points)
        return points

    # ------------------------------------------------------------------------------------------------------------------
    # Checkpoint

    def to_state(self) -> HistoryState:
        return HistoryState(
            capacity=self._capacity,
            merge=self._merge,
            tiers=self._n_tiers,
            series={
                name: [[column.tobytes() for column in tier] for tier in entry.tiers]
                for name, entry in self._series.items()
            },
            added={name: entry.added for name, entry in self._series.items()},
        )

    @classmethod
    def from_state(cls, state: HistoryState) -> History:
        history = cls(state.capacity, state.merge, state.tiers)
        for name, tiers in state.series.items():
            entry = _Series(state.tiers)
            if len(tiers) != state.tiers:
                raise ValueError(f"history state of {name!r} has {len(tiers)} tiers, expected {state.tiers}")
            for tier_index, columns in enumerate(tiers):
                arrays = []
                for raw_bytes in columns:
                    column = array("d")
                    column.frombytes(raw_bytes)
                    arrays.append(column)
                if len(arrays) != len(entry.tiers[tier_index]):
                    raise ValueError(f"history state of {name!r}: tier {tier_index} has the wrong columns")
                entry.tiers[tier_index] = arrays
            entry.added = state.added.get(name, 0)
            history._series[name] = entry
        return history


class NoHistory(History):
    """A history that keeps no point: for an engine whose history nobody reads, such as a replay that wants only the
    final snapshot (no snapshot reads the history). Every query finds it empty, and it is no checkpoint's history."""

    keeps = False

    def add_point(
        self, series: str, step: float, tokens: float, flop: float, wall: float, value: float
    ) -> None:
        pass  # History.add ends here too

    def add_points(
        self,
        series: str,
        step: Sequence[float],
        tokens: Sequence[float],
        flop: Sequence[float],
        wall: Sequence[float],
        value: Sequence[float],
    ) -> None:
        pass

    def to_state(self) -> HistoryState:
        raise ValueError("this engine kept no history (NoHistory): its state is no checkpoint")


def _newest_known(column: array, first: int, last: int) -> float:
    """Where a bucket of entries [first, last) sits on an axis: at its newest entry that knows the axis (NaN if
    none does)."""
    for i in range(last - 1, first - 1, -1):
        if column[i] == column[i]:
            return column[i]
    return _NAN


def _merge_raw(target: list[array], source: list[array], stop: int, group: int) -> None:
    """Merge the raw points [0, stop) of a tier (``stop`` a multiple of ``group``) in groups of ``group``: the very
    buckets ``_merge_into`` makes of them as buckets of one (count 1, min = max = value), without building each.

    Each axis at once where it can be: a bucket's x is its newest point's (a slice with a step picks them all)
    unless one of those is NaN, and then that axis goes group by group. Each group's sum in C, in order (``reduce``,
    not ``sum``, which compensates from Python 3.12 on; v × 1.0 is v exactly); where it is a number no value is NaN,
    and min and max (in C) pick what the bucket loop picks, the first of equals included. Where it is NaN, the loop
    does it all again: which NaN a sum of two NaNs keeps depends on the code that adds them (the interpreter's own
    float add and ``operator.add`` differ), and the bucket merge's loop is the one to match, bit for bit."""
    groups = range(0, stop, group)
    for axis in range(4):
        column = source[axis]
        newest = column[group - 1 : stop : group]
        if any(map(_isnan, newest)):
            target[axis].extend([_newest_known(column, first, first + group) for first in groups])
        else:
            target[axis].extend(newest)
    # Each value a float object once, not once for each of the sum, the minimum and the maximum
    values = source[4][:stop].tolist()
    means, lows, highs = [], [], []
    count = float(group)
    for first in groups:
        chunk = values[first : first + group]
        total = _reduce(_add, chunk, 0.0)
        if total == total:
            low, high = min(chunk), max(chunk)
        else:
            total, low, high = 0.0, _NAN, _NAN
            for v in chunk:
                total += v
                if v == v:
                    if not v >= low:
                        low = v
                    if not v <= high:
                        high = v
        means.append(total / count)
        lows.append(low)
        highs.append(high)
    target[4].extend(means)
    target[5].extend(lows)
    target[6].extend(highs)
    target[7].extend([count] * len(groups))


def _merge_into(target: list[array], source: list[array], start: int, stop: int, group: int) -> None:
    """Merge the buckets [start, stop) of a tier in groups of ``group`` and append one bucket per group to
    ``target`` (the raw tier's points: ``_merge_raw``)."""
    for first in range(start, stop, group):
        last = min(first + group, stop)
        for axis in range(4):
            target[axis].append(_newest_known(source[axis], first, last))
        total = 0.0
        count = 0.0
        low = _NAN
        high = _NAN
        values = source[4]
        # NaN never wins a comparison, so a NaN loss stays out of min/max yet still shows in the mean.
        for i in range(first, last):
            n, v, lo, hi = source[7][i], values[i], source[5][i], source[6][i]
            total += v * n
            count += n
            if lo == lo and not lo >= low:
                low = lo
            if hi == hi and not hi <= high:
                high = hi
        target[4].append(total / count)
        target[5].append(low)
        target[6].append(high)
        target[7].append(count)


def _thin(points: list[HistoryPoint], max_points: int) -> list[HistoryPoint]:
    group = -(-len(points) // max_points)
    thinned: list[HistoryPoint] = []
    for first in range(0, len(points), group):
        members = points[first : first + group]
        count = 0
        total = 0.0
        low = _NAN
        high = _NAN
        for point in members:
            total += point.value * point.count
            count += point.count
            if point.min == point.min and not point.min >= low:
                low = point.min
            if point.max == point.max and not point.max <= high:
                high = point.max
        thinned.append(HistoryPoint(members[-1].x, total / count, low, high, count))
    return thinned
