"""A copy of the engine's history: the engine's journal gives each point once, and a copy applies deltas only in
order, from the engine it copied, leaving itself untouched by anything else."""

from __future__ import annotations

from trainmeter_core.model import records
from trainmeter_core.model.history import History
from trainmeter_core.model.history_sync import HistoryReplica, JournaledHistory

NAN = float("nan")


def test_the_journal_gives_each_point_once_with_each_series_named_once():
    history = JournaledHistory()
    history.add("train_loss", {"step": 1, "tokens": 100}, 2.0)
    history.add_point("lr", 1.0, 100.0, NAN, 5.0, 1e-3)
    history.add_point("train_loss", 2.0, 200.0, NAN, 6.0, 1.5)
    names, points = history.take()
    assert names == ["train_loss", "lr"]
    assert [p[0] for p in points] == [0, 1, 0] and points[2][1:3] == (2.0, 200.0)
    assert history.take() == ([], [])  # taken: the next delta starts empty
    assert history.added_points("train_loss") == 2  # the history itself keeps everything


def test_a_copy_ignores_what_it_already_has_and_stays_untouched_by_a_delta_out_of_step():
    replica = HistoryReplica()
    assert not replica.synced
    replica.load(History(), "e1", 4)
    delta = records.HistoryDelta(incarnation="e1", n=4, series=["x"], points=[(0, 1.0, NAN, NAN, 1.0, 9.0)])
    assert replica.apply(delta) == "already"
    bad = records.HistoryDelta(
        incarnation="e1",
        n=5,
        series=["x"],
        points=[(0, 1.0, NAN, NAN, 1.0, 9.0), (1, 2.0, NAN, NAN, 2.0, 8.0)],
    )
    assert replica.apply(bad) == "out of step"  # point 2 names a series the delta does not list
    assert replica.history.added_points("x") == 0 and replica.n == 4  # not even its first point was taken
    good = records.HistoryDelta(incarnation="e1", n=5, series=["x"], points=[(0, 1.0, NAN, NAN, 1.0, 9.0)])
    assert replica.apply(good) == "applied" and replica.n == 5
    assert replica.apply(records.HistoryDelta(incarnation="e2", n=6)) == "out of step"  # another engine's
    assert replica.apply(records.HistoryDelta(incarnation="e1", n=7)) == "out of step"  # delta 6 is missing
    assert replica.history.added_points("x") == 1


def test_runs_of_points_reach_a_copy_as_the_engine_holds_them_each_series_in_its_order():
    engine = JournaledHistory(capacity=64, merge=2, tiers=3)
    replica = HistoryReplica()
    replica.load(History(capacity=64, merge=2, tiers=3), "e1", 0)
    for n in range(1, 6):
        for k in range(0, 40 * n, 50):
            step = float(1000 * n + k)
            engine.add_point("tm:goodput", step, NAN, NAN, step, 0.5)
        losses = [float(1000 * n + k) for k in range(40 * n)]
        engine.add_points("train_loss", losses, losses, [NAN] * len(losses), losses, [1 / s for s in losses])
        engine.add_points("step_time", losses, losses, losses, losses, [0.01] * len(losses))
        engine.add_points("nothing", [], [], [], [], [])  # no point: nothing journaled
        names, points = engine.take()
        assert "nothing" not in names and len(points) == 40 * n * 2 + len(range(0, 40 * n, 50))
        losses_sent = [p[1] for p in points if names[p[0]] == "train_loss"]
        assert losses_sent == losses  # each series' points in the order added
        delta = records.HistoryDelta(incarnation="e1", n=n, series=names, points=points)
        assert replica.apply(delta) == "applied"
    assert engine.journaled() == 0
    assert records.encode(replica.history.to_state()) == records.encode(engine.to_state())
