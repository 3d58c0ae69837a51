"""Replay: a run's log fed through the same engine that ran live, so ``tm view`` shows the numbers the run showed.

It reads the engine's checkpoint when there is one and replays only the tail. It never writes into the run directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from trainmeter_core import records as rec
from trainmeter_core.engine import Engine
from trainmeter_core.logread import read_log


def snapshots(run_dir: Path, stats: dict | None = None) -> Iterator[rec.Snapshot]:
    """Every snapshot the engine makes from the whole log, in order (from the start: no checkpoint)."""
    engine = Engine()
    for record in read_log(Path(run_dir), stats=stats):
        if rec.kind_of(record) == "snapshot":
            continue
        yield from engine.feed(record)


def final_snapshot(
    run_dir: Path, stats: dict | None = None, use_checkpoint: bool = True
) -> rec.Snapshot | None:
    """The last snapshot of a run: its engine's checkpoint plus the log after it (or the whole log)."""
    engine, through_seq = Engine(), 0
    if use_checkpoint:
        from trainmeter_core.engine_component import load_checkpoint

        engine, through_seq = load_checkpoint(Path(run_dir))
    last = None
    fed = False
    for record in read_log(Path(run_dir), stats=stats):
        if record.seq is not None and record.seq <= through_seq:
            continue
        if rec.kind_of(record) == "snapshot":
            continue
        fed = True
        for snapshot in engine.feed(record):
            last = snapshot
    if last is None and (fed or through_seq):
        last = engine.snapshot()
    return last
