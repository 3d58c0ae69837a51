"""The engine's checkpoint: the engine restored exactly, its history readable alone (without an engine), and the form
written before the history was kept apart still read."""

from __future__ import annotations

import msgspec

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.model.history import NoHistory
from trainmeter_core.model.history_sync import JournaledHistory
from trainmeter_core.runlog.checkpoint import (
    CHECKPOINT,
    Checkpoint,
    load_checkpoint,
    load_history,
    save_checkpoint,
)


def fed_engine(steps: int = 20) -> Engine:
    engine = Engine()
    seq = 0
    for step in range(1, steps + 1):
        for record in (
            records.Step(step=step, tokens_global=10),
            records.Metric(values={"loss": 1.0 / step}, step=step),
        ):
            seq += 1
            record.seq, record.t, record.wall = seq, float(seq), 1e9 + seq
            engine.feed(record)
    engine.feed(records.Tick(n=1, interval_s=1.0, seq=seq + 1, t=float(seq + 1), wall=1e9 + seq + 1))
    return engine


def test_a_restored_engine_is_the_saved_one_and_can_journal_its_history(tmp_path):
    engine = fed_engine()
    save_checkpoint(tmp_path, engine, 41)
    restored, through = load_checkpoint(tmp_path)
    assert through == 41 and restored.state_bytes() == engine.state_bytes()
    journaled, _ = load_checkpoint(tmp_path, JournaledHistory)
    assert isinstance(journaled.history, JournaledHistory)
    assert journaled.history.to_state() == engine.history.to_state() and journaled.history.journaled() == 0


def test_the_history_and_last_snapshot_are_read_without_an_engine(tmp_path):
    engine = fed_engine()
    snapshot = engine.snapshot()
    save_checkpoint(tmp_path, engine, 41, incarnation="ab12", history_n=7, snapshot=snapshot)
    saved = load_history(tmp_path)
    assert saved is not None
    assert (saved.incarnation, saved.history_n, saved.through_seq) == ("ab12", 7, 41)
    assert saved.history.to_state() == engine.history.to_state()
    assert saved.snapshot == snapshot


def test_a_checkpoint_of_the_older_form_still_restores_the_engine_but_gives_no_history_alone(tmp_path):
    engine = fed_engine()
    old = Checkpoint(
        through_seq=41, state=engine.state_bytes()
    )  # engine and history in one, as written before
    (tmp_path / CHECKPOINT).write_bytes(msgspec.msgpack.encode(old))
    restored, through = load_checkpoint(tmp_path)
    assert through == 41 and restored.state_bytes() == engine.state_bytes()
    journaled, _ = load_checkpoint(tmp_path, JournaledHistory)
    assert journaled.history.to_state() == engine.history.to_state()
    assert load_history(tmp_path) is None  # a dashboard asks the engine, which writes the new form


def test_no_checkpoint_or_a_damaged_one_is_a_fresh_engine(tmp_path):
    engine, through = load_checkpoint(tmp_path)
    assert through == 0 and engine.state.steps == 0
    (tmp_path / CHECKPOINT).write_bytes(b"\x93not a checkpoint")
    engine, through = load_checkpoint(tmp_path)
    assert through == 0 and engine.state.steps == 0
    assert load_history(tmp_path) is None


def test_an_engine_restored_without_its_history_has_the_saved_state_and_an_empty_history(tmp_path):
    # A replay that wants only the final snapshot restores into a NoHistory: the state as saved, the history not read.
    engine = fed_engine()
    assert engine.history.series_names()  # something to leave out
    save_checkpoint(tmp_path, engine, 41)
    bare, through = load_checkpoint(tmp_path, NoHistory)
    assert through == 41 and isinstance(bare.history, NoHistory) and bare.history.series_names() == []
    assert msgspec.msgpack.encode(bare.state) == msgspec.msgpack.encode(engine.state)
    assert bare.snapshot() == engine.snapshot()
    older = tmp_path / "older"
    older.mkdir()
    (older / CHECKPOINT).write_bytes(
        msgspec.msgpack.encode(Checkpoint(through_seq=41, state=engine.state_bytes()))
    )
    bare, _ = load_checkpoint(older, NoHistory)
    assert isinstance(bare.history, NoHistory) and bare.history.series_names() == []
    # The engine computes no point for a history that keeps none: it must know its history is one (both forms).
    assert bare._keeps is False and load_checkpoint(tmp_path, NoHistory)[0]._keeps is False
    assert msgspec.msgpack.encode(bare.state) == msgspec.msgpack.encode(engine.state)
