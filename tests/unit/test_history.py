"""History: every x axis per point, bounded memory over a million points, min and max kept, incremental reads."""

from __future__ import annotations

import math

import msgspec
import pytest

from trainmeter_core.model.history import X_AXES, History, HistoryPoint, HistoryState


def fill(history, n, series="loss", spike_at=None, dip_at=None):
    for i in range(1, n + 1):
        value = 1.0
        if i == spike_at:
            value = 1000.0
        if i == dip_at:
            value = -1000.0
        history.add_point(series, float(i), 100.0 * i, 6e9 * 100.0 * i, 1e9 + i, value)


def test_a_point_is_read_back_on_every_axis():
    history = History()
    history.add("train_loss", {"step": 3, "tokens": 300, "flop": 1.8e12, "wall": 1e9}, 2.5)
    for axis, x in zip(X_AXES, (3.0, 300.0, 1.8e12, 1e9), strict=True):
        assert history.query("train_loss", axis) == [HistoryPoint(x, 2.5, 2.5, 2.5, 1)]


def test_an_axis_a_point_does_not_know_is_left_out_of_that_axis_only():
    history = History()
    history.add("lr", {"step": 1, "wall": 5.0}, 1e-3)  # no tokens, no FLOPs (no convention)
    assert history.query("lr", "flop") == []
    assert history.query("lr", "tokens") == []
    assert history.query("lr", "step") == [HistoryPoint(1.0, 1e-3, 1e-3, 1e-3, 1)]


def test_since_returns_only_newer_points():
    history = History()
    fill(history, 10)
    newer = history.query("loss", "step", since=7.0)
    assert [p.x for p in newer] == [8.0, 9.0, 10.0]
    assert history.query("loss", "step", since=10.0) == []
    assert history.query("nothing", "step") == []


def test_an_unknown_axis_is_refused_with_the_axes_named():
    with pytest.raises(ValueError, match="step, tokens, flop, wall"):
        History().query("loss", "epoch")


def test_the_flops_axis_of_schema_1_still_answers_as_flop_for_one_release():
    history = History()
    history.add("train_loss", {"step": 3, "tokens": 300, "flop": 1.8e12, "wall": 1e9}, 2.5)
    assert history.query("train_loss", "flops") == history.query("train_loss", "flop") != []


def test_a_million_points_stay_bounded_and_the_spike_and_dip_survive():
    history = History()
    n = 1_000_000
    fill(history, n, spike_at=123_456, dip_at=654_321)
    stored = history.stored_points("loss")
    # Three tiers of at most 4096 entries each: never more than 12,288 entries for a million points.
    assert stored <= 3 * 4096
    assert history.added_points("loss") == n
    points = history.query("loss", "step")
    assert len(points) == stored
    assert sum(p.count for p in points) == n  # every point is in exactly one entry
    assert max(p.max for p in points) == 1000.0
    assert min(p.min for p in points) == -1000.0
    # the newest points are still raw
    assert points[-1] == HistoryPoint(float(n), 1.0, 1.0, 1.0, 1)
    # x grows from the oldest entry to the newest
    assert all(a.x < b.x for a, b in zip(points, points[1:], strict=False))


def test_the_last_tier_halves_itself_so_memory_never_grows():
    history = History(capacity=64, merge=2, tiers=2)
    fill(history, 100_000, spike_at=7)
    assert history.stored_points("loss") <= 2 * 64
    points = history.query("loss", "step")
    assert sum(p.count for p in points) == 100_000
    assert points[0].max == 1000.0  # the spike, in the oldest and coarsest bucket


def test_a_bucket_keeps_the_mean_min_max_and_count():
    history = History(capacity=64, merge=2, tiers=3)
    for i in range(1, 66):
        history.add_point("s", float(i), math.nan, math.nan, float(i), float(i))
    # 65 > 64: the oldest 32 raw points merged pairwise into 16 buckets: (1, 2) -> mean 1.5, min 1, max 2, x = 2
    first = history.query("s", "step")[0]
    assert first == HistoryPoint(2.0, 1.5, 1.0, 2.0, 2)
    assert history.stored_points("s") == 16 + 33


def test_max_points_thins_by_merging_neighbours_and_keeps_extremes():
    history = History()
    fill(history, 1000, spike_at=500)
    thinned = history.query("loss", "step", max_points=10)
    assert len(thinned) == 10
    assert sum(p.count for p in thinned) == 1000
    assert max(p.max for p in thinned) == 1000.0
    # the group holding point 500 (points 401..500) has mean (99 × 1 + 1000) / 100 = 10.99
    assert thinned[4] == HistoryPoint(500.0, pytest.approx(10.99), 1.0, 1000.0, 100)


def test_a_nan_value_stays_in_the_mean_but_not_in_min_and_max():
    history = History(capacity=64, merge=2, tiers=2)
    history.add_point("loss", 1.0, 1.0, 1.0, 1.0, math.nan)
    for i in range(2, 70):
        history.add_point("loss", float(i), 1.0, 1.0, 1.0, 2.0)
    first = history.query("loss", "step")[0]
    assert math.isnan(first.value)
    assert (first.min, first.max) == (2.0, 2.0)


def test_the_state_round_trips_exactly():
    history = History(capacity=64, merge=2, tiers=3)
    fill(history, 5000, spike_at=17)
    fill(history, 30, series="lr")
    encoded = msgspec.msgpack.encode(history.to_state())
    again = History.from_state(msgspec.msgpack.decode(encoded, type=HistoryState))
    for series in ("loss", "lr"):
        for axis in X_AXES:
            assert again.query(series, axis) == history.query(series, axis)
        assert again.added_points(series) == history.added_points(series)
    # and it carries on identically
    history.add_point("loss", 5001.0, 1.0, 1.0, 1.0, 3.0)
    again.add_point("loss", 5001.0, 1.0, 1.0, 1.0, 3.0)
    assert again.query("loss", "step") == history.query("loss", "step")


def test_a_capacity_too_small_for_its_merge_is_refused():
    with pytest.raises(ValueError, match="capacity"):
        History(capacity=10, merge=16)


def test_merging_raw_points_equals_merging_them_as_buckets_of_one_bit_for_bit():
    # The raw tier's merge has its own loop (no bucket built per point): it must give the very floats the bucket
    # merge gives for the same points as buckets of one (count 1, min = max = value), NaN, infinities and -0.0 included.
    import random
    from array import array

    from trainmeter_core.model.history import _merge_into, _merge_raw

    rng = random.Random(20261201)
    specials = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1e308, -1e-308]
    for _ in range(200):
        group = rng.choice([2, 3, 16])
        n = group * rng.randrange(1, 20)
        values = [rng.choice(specials) if rng.random() < 0.2 else rng.uniform(-1e3, 1e3) for _ in range(n)]
        # An axis NaN here and there (a bucket's x then looked for), or never (each bucket's newest point's x)
        nans = [rng.random() < 0.5 for _ in range(4)]
        axes = [[rng.choice([math.nan, float(i)]) if nan else float(i) for i in range(n)] for nan in nans]
        raw = [array("d", column) for column in axes] + [array("d", values)]
        as_buckets = raw + [array("d", values), array("d", values), array("d", [1.0] * n)]
        merged_raw = [array("d") for _ in range(8)]
        merged_buckets = [array("d") for _ in range(8)]
        _merge_raw(merged_raw, raw, n, group)
        _merge_into(merged_buckets, as_buckets, 0, n, group)
        assert [column.tobytes() for column in merged_raw] == [column.tobytes() for column in merged_buckets]


def _points(n: int, start: int = 0) -> list[tuple[float, float, float, float, float]]:
    """n points of one series: step, tokens, flop (NaN now and then), wall and a value with dips and spikes."""
    return [
        (float(i), float(64 * i), math.nan if i % 7 == 0 else 1e3 * i, 1.7e9 + i / 4, math.sin(i) * (i % 13))
        for i in range(start, start + n)
    ]


def test_points_added_in_one_go_leave_the_history_adding_them_one_by_one_leaves_across_every_tier():
    # A small history: its first tier spills every 32 points, its last halves itself often (2,000 points cross both).
    one_by_one, in_runs = History(capacity=64, merge=2, tiers=3), History(capacity=64, merge=2, tiers=3)
    start = 0
    for run in (1, 0, 63, 64, 65, 200, 7, 1000, 31, 569):
        points = _points(run, start)
        start += run
        for point in points:
            one_by_one.add_point("loss", *point)
        columns = [[point[axis] for point in points] for axis in range(5)]
        in_runs.add_points("loss", *columns)
        one_by_one.add_point("lr", float(start), math.nan, math.nan, 1.7e9, 1e-3)
        in_runs.add_points("lr", [float(start)], [math.nan], [math.nan], [1.7e9], [1e-3])
    assert start == 2000 and in_runs.added_points("loss") == 2000
    assert msgspec.msgpack.encode(in_runs.to_state()) == msgspec.msgpack.encode(one_by_one.to_state())
