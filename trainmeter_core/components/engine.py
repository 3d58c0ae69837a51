"""The engine on the bus, the one engine of a live run: feeds every record, in hub order, to the pure engine and
publishes its snapshots, each followed by a ``history`` delta (the points added since the previous one, journaled from
the first ``history.request`` on: until a dashboard asks, a delta is empty and says so), so the dashboard keeps a copy
of the history instead of computing it again.

It checkpoints to its own file (``engine.ckpt``, this component its only writer) every few minutes, at the end, and when
a dashboard asks for the whole history (``history.request``, answered by ``history.sync``). After a restart it loads
the checkpoint, takes the log from there up to the first record it received live (the one hand-over), then carries on
live: the next snapshot equals a replay of the log up to that tick. It never writes the run log.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from trainmeter_core.bus.component import Component, ComponentContext
from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.model.history_sync import JournaledHistory
from trainmeter_core.runlog.checkpoint import CHECKPOINT, load_checkpoint, save_checkpoint
from trainmeter_core.runlog.handover import HandOver, log_has_ended
from trainmeter_core.runlog.reader import read_log

CHECKPOINT_EVERY_S = float(os.environ.get("TM_ENGINE_CHECKPOINT_S", "300"))
#: The shortest wait for a record (a checkpoint overdue, or due within it, is saved after at most this long).
CHECK_AT_LEAST_S = 0.05


class LiveEngine:
    """The engine as the bus knows it: records in, what it publishes out (each snapshot, then the history delta).

    Pure apart from the incarnation's random name: no socket, no file. The engine component wraps it; tests and the
    dashboard's tests feed it directly, as the bus would.
    """

    def __init__(
        self,
        engine: Engine | None = None,
        through_seq: int = 0,
        incarnation: str | None = None,
        journal: bool = True,
    ) -> None:
        """``journal``: False keeps no journal of the history's points until ``listened`` (the first
        ``history.request``): its deltas until then are empty and say they are not complete."""
        self.engine = engine if engine is not None else Engine(history=JournaledHistory())
        if not isinstance(self.engine.history, JournaledHistory):
            raise TypeError(
                "a live engine journals its history: restore it with history_type=JournaledHistory"
            )
        self.history: JournaledHistory = self.engine.history
        self.history.journaling = journal
        self.through_seq = through_seq
        self.incarnation = incarnation or secrets.token_hex(4)
        self.n = 0  # the last history delta published
        self.last_snapshot: records.Snapshot | None = None

    def catch_up(self, record: records.Record | records.Unknown) -> None:
        """Feed a logged record quietly (no snapshot: nobody reads the ones of the past)."""
        if (
            records.kind_of(record) in records.DERIVED_KINDS
            or record.seq is None
            or record.seq <= self.through_seq
        ):
            return
        self._feed_new(record, snapshots=False)
        self.through_seq = record.seq

    def _feed_new(self, record: records.Record | records.Unknown, snapshots: bool) -> list[records.Snapshot]:
        """Feed what of ``record`` is after ``through_seq``: all of it, or of a block that straddles it (the engine's
        checkpoint or hand-over fell inside it) only its rows after it."""
        if type(record) is records.Block and record.seq - record.rows < self.through_seq:
            for row in records.block.expand(record, after_seq=self.through_seq):
                self.engine.feed(row, snapshots)
            return []
        return self.engine.feed(record, snapshots)

    def caught_up(self) -> None:
        """Live from here on: the history's past reaches a dashboard whole (``history.sync``), never as a delta."""
        self.history.forget()

    def listened(self) -> None:
        """Someone keeps a copy of the history (a ``history.request`` came): journal every point from here on. The
        points before reach it whole, through the checkpoint that answers the request."""
        self.history.journaling = True

    def feed(self, record: records.Record | records.Unknown) -> list[records.Record]:
        """Feed one live record; returns what to publish: nothing, or its snapshot followed by the history delta."""
        if (
            records.kind_of(record) in records.DERIVED_KINDS
            or record.seq is None
            or record.seq <= self.through_seq
        ):
            return []
        snapshots = self._feed_new(record, snapshots=True)
        self.through_seq = record.seq
        if not snapshots:
            return []
        self.last_snapshot = snapshots[-1]
        # A delta after every snapshot, even an empty one: a dashboard learns of a new incarnation within a tick.
        return [*snapshots, self.delta()]

    def delta(self) -> records.HistoryDelta:
        """The points added since the previous delta, as the next delta."""
        history = self.history
        names, runs = history.take()
        self.n += 1
        return records.HistoryDelta(
            incarnation=self.incarnation,
            n=self.n,
            complete=history.journaling,
            through_seq=self.through_seq,
            series=names,
            runs=runs,
        )

    def pending_points(self) -> bool:
        return self.history.journaled() > 0


class EngineComponent(Component):
    name = "engine"
    #: Every kind the engine feeds, a block as it is (steps in bulk: a block is fed whole), the dashboard's request for
    #: the whole history and the hub's counts (the hand-over reads how far the recorder flushed); not the snapshots and
    #: history deltas it publishes itself: a tight loop's delta holds two points a step, 1 ms of decoding a tick.
    subscribes = tuple(sorted(Engine.FED_KINDS | {"history.request", "bus.stats"}))
    shared = True

    def run(self, ctx: ComponentContext) -> None:
        engine, through_seq = load_checkpoint(ctx.run_dir, JournaledHistory)
        # No journal until a dashboard asks: a tight loop's points are 225 KB of deltas a second, sent to nobody in a
        # run without one (docs/performance.md, "Deltas nobody asked for").
        live = LiveEngine(engine, through_seq, journal=False)
        handover = HandOver(ctx.run_dir, ctx.recv, ctx.stopping)
        ended = False

        def idle() -> bool:
            nonlocal ended
            ended = log_has_ended(ctx.run_dir)
            return ended

        if not handover.wait_first_live(idle):
            if ended and not ctx.stopping.is_set():
                # Started (or restarted) after the run ended: the log is all there is. Say the final word.
                self._finish_from_log(ctx, live)
            return
        handover.wait_for_log()
        for record in handover.from_log(after_seq=live.through_seq, blocks=True):
            live.catch_up(record)
        live.caught_up()
        saved = Saved(ctx.run_dir, live)
        while not ctx.stopping.is_set():
            # Until the next checkpoint is due: the stop's pipe ends the wait at once (ComponentContext.recv). It looked
            # every half second before, two wakes a second wherever no record came.
            record = handover.next(max(CHECK_AT_LEAST_S, saved.at + CHECKPOINT_EVERY_S - time.monotonic()))
            if record is not None:
                for out in live.feed(record):
                    ctx.publish(out)
                kind = records.kind_of(record)
                if kind == "history.request":
                    live.listened()
                    saved.now(ctx)
                elif kind == "run.end":
                    saved.now(ctx)
                    return
            if time.monotonic() - saved.at >= CHECKPOINT_EVERY_S:
                saved.now(ctx)
        saved.now(ctx)

    def _finish_from_log(self, ctx: ComponentContext, live: LiveEngine) -> None:
        """Feed a finished run's log quietly, but ``run.end`` itself aloud: its final snapshot, as it was live."""
        for record in read_log(ctx.run_dir, after_seq=live.through_seq, blocks=True):
            if records.kind_of(record) == "run.end":
                live.caught_up()
                for out in live.feed(record):
                    ctx.publish(out)
            else:
                live.catch_up(record)
        save_checkpoint(
            ctx.run_dir, live.engine, live.through_seq, incarnation=live.incarnation, history_n=live.n,
            snapshot=live.last_snapshot,
        )  # fmt: skip


class Saved:
    """The engine's checkpoints: each one first publishes the points not yet in a delta, so the file's history is
    exactly deltas 1 to ``n`` (a dashboard that loads it applies the next delta and nothing twice)."""

    def __init__(self, run_dir: Path, live: LiveEngine) -> None:
        self.run_dir = run_dir
        self.live = live
        self.at = time.monotonic()
        self.saved: tuple[str, int, int] | None = None  # (incarnation, n, through_seq) of the file on disk

    def now(self, ctx: ComponentContext) -> None:
        live = self.live
        if live.pending_points():
            ctx.publish(live.delta())
        if self.saved != (live.incarnation, live.n, live.through_seq):
            save_checkpoint(
                self.run_dir, live.engine, live.through_seq, incarnation=live.incarnation, history_n=live.n,
                snapshot=live.last_snapshot,
            )  # fmt: skip
            self.saved = (live.incarnation, live.n, live.through_seq)
        self.at = time.monotonic()
        ctx.publish(
            records.HistorySync(
                incarnation=live.incarnation, n=live.n, checkpoint=CHECKPOINT, through_seq=live.through_seq
            )
        )
