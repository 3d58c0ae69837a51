"""The engine's checkpoint (``engine.ckpt``): its state, its history and the last sequence number they reflect.

The engine component is the file's only writer (every few minutes, at the end, and when a dashboard asks for the whole
history); replay and a restarted engine resume from it, and a dashboard reads only its history and last snapshot from
it, never building an engine. A checkpoint that cannot be read is as good as none: the reader starts from the log.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine, EngineState
from trainmeter_core.model.history import History, HistoryState

CHECKPOINT = "engine.ckpt"

_READ_ERRORS = (OSError, msgspec.DecodeError, msgspec.ValidationError, ValueError)


class Checkpoint(msgspec.Struct):
    """The file's content. ``state`` is the form written before the history was kept apart (``Engine.state_bytes``,
    engine and history in one): still read, no longer written."""

    through_seq: int
    state: bytes = b""
    engine: bytes = b""  # EngineState as MessagePack
    history: bytes = b""  # HistoryState as MessagePack
    incarnation: str = ""  # the engine process that wrote it, and the history delta it reflects
    history_n: int = 0
    snapshot: bytes = b""  # the last snapshot that engine published (its wire form), or empty


class HistoryCheckpoint(msgspec.Struct):
    """What a dashboard takes from a checkpoint: the history, which delta it reflects, and the last snapshot."""

    history: History
    incarnation: str
    history_n: int
    through_seq: int
    snapshot: records.Snapshot | None


def _read(run_dir: Path) -> Checkpoint | None:
    try:
        return msgspec.msgpack.decode((Path(run_dir) / CHECKPOINT).read_bytes(), type=Checkpoint)
    except _READ_ERRORS:
        return None


class _Through(msgspec.Struct):
    through_seq: int


def checkpoint_through_seq(run_dir: Path) -> int | None:
    """The last sequence number the run's checkpoint reflects, without decoding its state; None without one."""
    try:
        return msgspec.msgpack.decode((Path(run_dir) / CHECKPOINT).read_bytes(), type=_Through).through_seq
    except _READ_ERRORS:
        return None


def load_checkpoint(run_dir: Path, history_type: type[History] = History) -> tuple[Engine, int]:
    """The engine restored from the run's checkpoint and the last sequence number it reflects, or a fresh one.

    ``history_type`` lets the engine component restore into a history that also journals what it adds, and a replay
    that wants only snapshots into one that keeps nothing (``NoHistory``: the stored history is then not decoded).
    """
    ckpt = _read(run_dir)
    if ckpt is not None:
        try:
            if ckpt.engine:
                state = msgspec.msgpack.decode(ckpt.engine, type=EngineState)
                if not history_type.keeps:
                    return Engine(state, history_type()), ckpt.through_seq
                history = msgspec.msgpack.decode(ckpt.history, type=HistoryState)
                return Engine(state, history_type.from_state(history)), ckpt.through_seq
            if ckpt.state:
                engine = Engine.from_state(ckpt.state)
                if not history_type.keeps:
                    engine.history = history_type()
                elif history_type is not History:
                    engine.history = history_type.from_state(engine.history.to_state())
                return engine, ckpt.through_seq
        except _READ_ERRORS:
            pass
    return Engine(history=history_type()), 0


def load_history(run_dir: Path) -> HistoryCheckpoint | None:
    """The history and last snapshot of the run's checkpoint, without the engine; None when there is none to read
    (or it predates the history being kept apart)."""
    ckpt = _read(run_dir)
    if ckpt is None or not ckpt.history:
        return None
    try:
        history = History.from_state(msgspec.msgpack.decode(ckpt.history, type=HistoryState))
        snapshot = records.decode(ckpt.snapshot) if ckpt.snapshot else None
    except (*_READ_ERRORS, records.MalformedRecord):
        return None
    return HistoryCheckpoint(
        history=history,
        incarnation=ckpt.incarnation,
        history_n=ckpt.history_n,
        through_seq=ckpt.through_seq,
        snapshot=snapshot if isinstance(snapshot, records.Snapshot) else None,
    )


def save_checkpoint(
    run_dir: Path,
    engine: Engine,
    through_seq: int,
    *,
    incarnation: str = "",
    history_n: int = 0,
    snapshot: records.Snapshot | None = None,
) -> None:
    """Write the checkpoint beside the log, atomically (a reader sees the old file or the new one, never half)."""
    path = Path(run_dir) / CHECKPOINT
    tmp = path.with_name(CHECKPOINT + ".tmp")
    ckpt = Checkpoint(
        through_seq=through_seq,
        engine=msgspec.msgpack.encode(engine.state),
        history=msgspec.msgpack.encode(engine.history.to_state()),
        incarnation=incarnation,
        history_n=history_n,
        snapshot=records.encode(snapshot) if snapshot is not None else b"",
    )
    tmp.write_bytes(msgspec.msgpack.encode(ckpt))
    os.replace(tmp, path)
