"""The engine on the bus: feeds every record, in hub order, to the pure engine and publishes its snapshots.

It checkpoints the engine's state to its own file (``engine.ckpt``, this component its only writer) every few minutes
and at the end. After a restart it loads the checkpoint, replays the log from there up to the first record it received
live, then carries on live: the next snapshot equals a replay of the log up to that tick.
"""

from __future__ import annotations

import os
import time
from collections import deque
from pathlib import Path

import msgspec

from trainmeter_core import records as rec
from trainmeter_core.component import ALL_KINDS, Component, ComponentContext
from trainmeter_core.engine import Engine
from trainmeter_core.logread import read_log

CHECKPOINT = "engine.ckpt"
CHECKPOINT_EVERY_S = float(os.environ.get("TM_ENGINE_CHECKPOINT_S", "300"))
CATCH_UP_WAIT_S = 30.0


class Checkpoint(msgspec.Struct):
    through_seq: int
    state: bytes


def load_checkpoint(run_dir: Path) -> tuple[Engine, int]:
    """The engine restored from the run's checkpoint and the last sequence number it reflects, or a fresh one."""
    try:
        ckpt = msgspec.msgpack.decode((Path(run_dir) / CHECKPOINT).read_bytes(), type=Checkpoint)
        return Engine.from_state(ckpt.state), ckpt.through_seq
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, ValueError):
        return Engine(), 0


def save_checkpoint(run_dir: Path, engine: Engine, through_seq: int) -> None:
    path = Path(run_dir) / CHECKPOINT
    tmp = path.with_name(CHECKPOINT + ".tmp")
    tmp.write_bytes(msgspec.msgpack.encode(Checkpoint(through_seq=through_seq, state=engine.state_bytes())))
    os.replace(tmp, path)


def feed_log(engine: Engine, run_dir: Path, after_seq: int, before_seq: int | None) -> int:
    """Feed the logged records with after_seq < seq < before_seq; returns the last sequence number fed."""
    last = after_seq
    for record in read_log(run_dir):
        seq = record.seq
        if seq is None or seq <= after_seq:
            continue
        if before_seq is not None and seq >= before_seq:
            break
        if rec.kind_of(record) != "snapshot":
            engine.feed(record, snapshots=False)
        last = seq
    return last


def catch_up_to_the_end(engine: Engine, run_dir: Path, after_seq: int) -> list[rec.Snapshot]:
    """Feed a finished run's log quietly, but ``run.end`` itself aloud: its final snapshot, as it was live."""
    final: list[rec.Snapshot] = []
    for record in read_log(run_dir):
        if record.seq is None or record.seq <= after_seq or rec.kind_of(record) == "snapshot":
            continue
        if rec.kind_of(record) == "run.end":
            final = engine.feed(record)
        else:
            engine.feed(record, snapshots=False)
    return final


def log_has_run_end(run_dir: Path) -> bool:
    return any(True for _ in read_log(run_dir, kinds={"run.end"}))


def last_seq(run_dir: Path) -> int:
    last = 0
    for record in read_log(run_dir):
        if record.seq is not None:
            last = max(last, record.seq)
    return last


def log_reaches(run_dir: Path, seq: int) -> bool:
    """True once the run log holds a record with this sequence number or a later one (the recorder writes in order)."""
    for record in read_log(run_dir):
        if record.seq is not None and record.seq >= seq:
            return True
    return False


class EngineComponent(Component):
    name = "engine"
    subscribes = ALL_KINDS
    shared = True

    def run(self, ctx: ComponentContext) -> None:
        engine, through_seq = load_checkpoint(ctx.run_dir)
        pending: deque = deque()
        # The first live record (not a snapshot: those are this engine's own) marks where the log hands over.
        first_live = None
        while first_live is None and not ctx.stopping.is_set():
            record = ctx.recv(0.5)
            if record is None:
                if log_has_run_end(ctx.run_dir):
                    # Started (or restarted) after the run ended: the log is all there is. Say the final word.
                    for snapshot in catch_up_to_the_end(engine, ctx.run_dir, through_seq):
                        ctx.publish(snapshot)
                    save_checkpoint(ctx.run_dir, engine, last_seq(ctx.run_dir))
                    return
                continue
            pending.append(record)
            if rec.kind_of(record) != "snapshot" and record.seq is not None:
                first_live = record.seq
        if first_live is None:
            return
        deadline = time.monotonic() + CATCH_UP_WAIT_S
        while (
            not log_reaches(ctx.run_dir, first_live)
            and time.monotonic() < deadline
            and not ctx.stopping.is_set()
        ):
            time.sleep(0.1)  # the recorder flushes every 100 ms
        through_seq = feed_log(engine, ctx.run_dir, through_seq, first_live)
        last_checkpoint = time.monotonic()

        def handle(record) -> None:
            nonlocal through_seq
            if rec.kind_of(record) == "snapshot" or record.seq is None or record.seq <= through_seq:
                return
            for snapshot in engine.feed(record):
                ctx.publish(snapshot)
            through_seq = record.seq

        while pending:
            handle(pending.popleft())
        while not ctx.stopping.is_set():
            record = ctx.recv(0.5)
            if record is not None:
                handle(record)
                if rec.kind_of(record) == "run.end":
                    save_checkpoint(ctx.run_dir, engine, through_seq)
                    return
            if time.monotonic() - last_checkpoint >= CHECKPOINT_EVERY_S:
                save_checkpoint(ctx.run_dir, engine, through_seq)
                last_checkpoint = time.monotonic()
        save_checkpoint(ctx.run_dir, engine, through_seq)
