"""The engine on the bus: each snapshot followed by the history delta, a copy fed the deltas holds the engine's history
exactly, and a checkpoint holds exactly the deltas published before it."""

from __future__ import annotations

from trainmeter_core.components.engine import LiveEngine, Saved
from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.model.history import History
from trainmeter_core.model.history_sync import HistoryReplica, JournaledHistory
from trainmeter_core.runlog.checkpoint import CHECKPOINT, load_history


def run_records(steps: int, tick_every: int = 5) -> list[records.Record]:
    out: list[records.Record] = []
    for step in range(1, steps + 1):
        out.append(records.Step(step=step, tokens_global=64))
        out.append(records.Metric(values={"train_loss": 5.0 / step, "lr": 1e-3}, step=step))
        if step % tick_every == 0:
            out.append(records.Tick(n=step // tick_every, interval_s=1.0))
    for i, record in enumerate(out, start=1):
        record.seq, record.t, record.wall = i, float(i), 1e9 + i
    return out


def small_live() -> LiveEngine:
    # A small history, so a few hundred steps spill raw points into buckets of every tier.
    return LiveEngine(Engine(history=JournaledHistory(capacity=64, merge=2, tiers=3)))


def test_each_snapshot_is_followed_by_the_history_delta_and_a_copy_fed_the_deltas_is_the_engines_history():
    live = small_live()
    published = [out for record in run_records(600) for out in live.feed(record)]
    kinds = [records.kind_of(r) for r in published]
    assert kinds == ["snapshot", "history"] * 120  # 600 steps, a tick every 5
    deltas = [r for r in published if isinstance(r, records.HistoryDelta)]
    assert [d.n for d in deltas] == list(range(1, 121)) and {d.incarnation for d in deltas} == {
        live.incarnation
    }
    replica = HistoryReplica()
    replica.load(History(capacity=64, merge=2, tiers=3), live.incarnation, 0)
    assert all(replica.apply(d) == "applied" for d in deltas)
    assert replica.history.to_state() == live.history.to_state()  # every tier, every byte
    assert live.history.stored_points("train_loss") < 600  # the tiers did merge (the copy merged alike)


def test_a_record_already_reflected_or_derived_publishes_nothing():
    live = small_live()
    logged = run_records(5)
    assert live.feed(logged[-1])  # the tick
    assert live.feed(logged[-1]) == []  # the same sequence number again
    assert live.feed(records.Snapshot(tick=9, seq=99)) == []
    assert live.feed(records.HistoryRequest(seq=100)) == []


class Published:
    def __init__(self) -> None:
        self.records: list[records.Record] = []

    def publish(self, record: records.Record) -> bool:
        self.records.append(record)
        return True


def test_a_checkpoint_first_publishes_the_points_not_yet_in_a_delta_so_it_holds_exactly_deltas_one_to_n(
    tmp_path,
):
    live = small_live()
    ctx = Published()
    logged = run_records(12)
    for record in logged[:-2]:  # 12 steps and 2 ticks; all but step 12's two records
        for out in live.feed(record):
            ctx.publish(out)
    Saved(tmp_path, live).now(ctx)  # type: ignore[arg-type]
    kinds = [records.kind_of(r) for r in ctx.records]
    assert kinds == ["snapshot", "history", "snapshot", "history", "history", "history.sync"]
    extra, sync = ctx.records[-2:]
    # after tick 2 (at step 10): step 11's time on rank 0, and its loss and lr
    assert extra.n == 3 and [len(run[1]) for run in extra.runs] == [1, 1, 1] and not extra.points
    assert sorted(extra.series) == ["lr", "tm:rank:0:step_time_s", "train_loss"]
    assert (sync.incarnation, sync.n, sync.checkpoint) == (live.incarnation, 3, CHECKPOINT)
    saved = load_history(tmp_path)
    assert saved is not None and (saved.incarnation, saved.history_n) == (live.incarnation, 3)
    assert saved.history.to_state() == live.history.to_state()
    assert saved.snapshot == [r for r in ctx.records if isinstance(r, records.Snapshot)][-1]


def test_asking_again_with_nothing_new_rewrites_no_file(tmp_path):
    live = small_live()
    ctx = Published()
    for record in run_records(5):
        live.feed(record)
    saved = Saved(tmp_path, live)
    saved.now(ctx)  # type: ignore[arg-type]
    first = (tmp_path / CHECKPOINT).stat().st_mtime_ns
    (tmp_path / CHECKPOINT).touch()  # any rewrite would replace the file (a new inode)
    inode = (tmp_path / CHECKPOINT).stat().st_ino
    saved.now(ctx)  # type: ignore[arg-type]
    assert (tmp_path / CHECKPOINT).stat().st_ino == inode and first
    assert [records.kind_of(r) for r in ctx.records].count("history.sync") == 2  # answered both times


def test_an_engine_nobody_asked_journals_nothing_and_its_empty_deltas_say_they_are_not_complete(tmp_path):
    """The engine component's engine keeps no journal until the first ``history.request``: its deltas number the ticks
    and say they lack points, so a copy loaded before it was asked asks again; from the request on, a copy loaded from
    the answer's checkpoint and fed the deltas holds the engine's history exactly."""
    live = LiveEngine(Engine(history=JournaledHistory(capacity=64, merge=2, tiers=3)), journal=False)
    ctx = Published()
    logged = run_records(600)
    half = (
        next(i for i, r in enumerate(logged) if isinstance(r, records.Tick) and r.n == 60) + 1
    )  # step 300's tick
    for record in logged[:half]:
        for out in live.feed(record):
            ctx.publish(out)
    before = [r for r in ctx.records if isinstance(r, records.HistoryDelta)]
    assert [d.n for d in before] == list(range(1, 61))
    assert all(not d.complete and not d.runs and not d.points and not d.series for d in before)
    assert live.history.added_points("train_loss") == 300  # the history itself keeps every point
    # A copy that loaded a checkpoint written before anyone asked (a periodic one) cannot use the next delta.
    early = HistoryReplica()
    early.load(History(capacity=64, merge=2, tiers=3), live.incarnation, 59)
    assert early.apply(before[-1]) == "out of step" and early.n == 59

    live.listened()  # what the component does on a history.request, before it answers
    Saved(tmp_path, live).now(ctx)  # type: ignore[arg-type]
    sync = ctx.records[-1]
    assert isinstance(sync, records.HistorySync) and sync.n == 60  # nothing journaled: no extra delta
    saved = load_history(tmp_path)
    assert saved is not None
    replica = HistoryReplica()
    replica.load(saved.history, saved.incarnation, saved.history_n)
    after = []
    for record in logged[half:]:
        after += [out for out in live.feed(record) if isinstance(out, records.HistoryDelta)]
    assert all(d.complete for d in after)
    losses = [step for d in after for run in d.runs if d.series[run[0]] == "train_loss" for step in run[1]]
    assert losses == [float(step) for step in range(301, 601)]  # every step's loss after the request, once
    assert all(replica.apply(d) == "applied" for d in after)
    assert replica.history.to_state() == live.history.to_state()  # every tier, every byte
