"""A copy of the engine's history: the engine's journal gives each point once, and a copy applies deltas only in
order, from the engine it copied, leaving itself untouched by anything else."""

from __future__ import annotations

from trainmeter_core.model import records
from trainmeter_core.model.history import History
from trainmeter_core.model.history_sync import HistoryReplica, JournaledHistory

NAN = float("nan")


def test_the_journal_gives_each_point_once_each_series_named_once_with_its_points_as_one_run():
    history = JournaledHistory()
    history.add("train_loss", {"step": 1, "tokens": 100}, 2.0)
    history.add_point("lr", 1.0, 100.0, NAN, 5.0, 1e-3)
    history.add_point("train_loss", 2.0, 200.0, NAN, 6.0, 1.5)
    history.add_points("train_loss", [3.0, 4.0], [300.0, 400.0], [NAN, NAN], [7.0, 8.0], [1.2, 1.1])
    names, runs = history.take()
    assert names == ["train_loss", "lr"]
    assert [run[0] for run in runs] == [0, 1]
    steps, tokens, _, walls, values = runs[0][1:]
    assert steps == [1.0, 2.0, 3.0, 4.0] and tokens == [100.0, 200.0, 300.0, 400.0]
    assert walls[1:] == [6.0, 7.0, 8.0] and values == [2.0, 1.5, 1.2, 1.1]
    assert (
        runs[1][1:] == ([1.0], [100.0], runs[1][3], [5.0], [1e-3]) and runs[1][3][0] != runs[1][3][0]
    )  # NaN
    assert history.take() == ([], [])  # taken: the next delta starts empty
    assert history.added_points("train_loss") == 4  # the history itself keeps everything


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
    ragged = records.HistoryDelta(
        incarnation="e1", n=6, series=["x"], runs=[(0, [2.0, 3.0], [NAN], [NAN], [2.0], [8.0])]
    )
    assert replica.apply(ragged) == "out of step"  # a run whose columns disagree: not the engine's
    unnamed = records.HistoryDelta(
        incarnation="e1", n=6, series=["x"], runs=[(1, [2.0], [NAN], [NAN], [2.0], [8.0])]
    )
    assert replica.apply(unnamed) == "out of step"
    assert replica.history.added_points("x") == 1 and replica.n == 5


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
        names, runs = engine.take()
        assert "nothing" not in names and sum(len(run[1]) for run in runs) == 40 * n * 2 + len(
            range(0, 40 * n, 50)
        )
        assert runs[names.index("train_loss")][1] == losses  # each series' points in the order added
        # Through the bus, as the dashboard's copy receives it
        delta = records.decode(
            records.encode(records.HistoryDelta(incarnation="e1", n=n, series=names, runs=runs))
        )
        assert replica.apply(delta) == "applied"
    assert engine.journaled() == 0
    assert records.encode(replica.history.to_state()) == records.encode(engine.to_state())


def test_a_journal_switched_off_keeps_the_points_in_the_history_alone():
    history = JournaledHistory()
    history.journaling = False
    history.add_point("lr", 1.0, 100.0, NAN, 5.0, 1e-3)
    history.add_points("train_loss", [3.0, 4.0], [300.0, 400.0], [NAN, NAN], [7.0, 8.0], [1.2, 1.1])
    assert history.journaled() == 0 and history.take() == ([], [])
    assert history.added_points("lr") == 1 and history.added_points("train_loss") == 2
    history.journaling = True
    history.add_point("lr", 2.0, 200.0, NAN, 6.0, 1e-3)
    assert history.journaled() == 1


def test_a_copy_takes_a_delta_that_says_it_lacks_points_as_out_of_step_unless_it_already_has_it():
    replica = HistoryReplica()
    replica.load(History(), "e1", 4)
    assert replica.apply(records.HistoryDelta(incarnation="e1", n=4, complete=False)) == "already"
    assert replica.apply(records.HistoryDelta(incarnation="e1", n=5, complete=False)) == "out of step"
    assert replica.n == 4
    assert replica.apply(records.HistoryDelta(incarnation="e1", n=5)) == "applied"
