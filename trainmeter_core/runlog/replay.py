"""Replay: a run's log fed through the same engine that ran live, so ``tm view`` shows the numbers the run showed.

It resumes from the engine's checkpoint when there is one and reads only the log after it (the reader skips the rest
without decoding it). Only where no engine runs: a finished run, or the launcher when the engine's final snapshot did
not come. It never writes into the run directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec

from trainmeter_core.model import records
from trainmeter_core.model.engine import Engine
from trainmeter_core.model.history import History, NoHistory
from trainmeter_core.runlog.checkpoint import load_checkpoint
from trainmeter_core.runlog.reader import read_log
from trainmeter_core.runlog.tail import tail_lines

#: The kinds the engine reads; the reader passes the others by their tag without decoding them.
FED_KINDS = Engine.FED_KINDS


def snapshots(run_dir: Path, stats: dict | None = None) -> Iterator[records.Snapshot]:
    """Every snapshot the engine makes from the whole log, in order (from the start: no checkpoint)."""
    engine = Engine()
    for record in read_log(Path(run_dir), FED_KINDS, stats):
        yield from engine.feed(record)


_RUN_END, _TICK = b'"kind":"run.end"', b'"kind":"tick"'


def _last_snapshot_seq(run_dir: Path) -> int | None:
    """Which record makes the run's last snapshot, from the log's tail: None when it is ``run.end`` (always built), the
    last tick's sequence number without one, or -1 when the tail cannot tell (then every snapshot is built).

    The lines are looked through for the two tags; only a line that has one is decoded, to be sure of it.
    """
    for line in reversed(tail_lines(run_dir)):
        if _RUN_END not in line and _TICK not in line:
            continue
        try:
            data = msgspec.json.decode(line)
        except (msgspec.DecodeError, UnicodeDecodeError):
            continue
        kind = data.get("kind") if isinstance(data, dict) else None
        if kind == "run.end":
            return None
        seq = data.get("seq")
        if kind == "tick" and type(seq) is int:
            # A run.end after this tick would be later in the tail: none is, so this tick makes the last snapshot.
            return seq
    return -1


def replay_engine(
    run_dir: Path, stats: dict | None = None, use_checkpoint: bool = True, keep_history: bool = True
) -> tuple[Engine, records.Snapshot | None]:
    """The engine after the whole log (its checkpoint plus the log after it), and the run's last snapshot: the last
    one the tail made, else the engine's current one, or None when the log holds nothing for it.

    Only the last snapshot is built: a tick before it only moves the history, by the same code, so the engine ends
    in the same state (a snapshot costs more than the hundreds of records between two ticks). With ``keep_history``
    false the engine keeps no history (``NoHistory``) and those ticks build nothing: the snapshots are the same, as
    none reads the history, but the engine is then no checkpoint's (its history is empty).
    """
    run_dir = Path(run_dir)
    history_type = History if keep_history else NoHistory
    engine, through_seq = (
        load_checkpoint(run_dir, history_type) if use_checkpoint else (Engine(history=history_type()), 0)
    )
    stats = {} if stats is None else stats
    last_snapshot_seq = _last_snapshot_seq(run_dir)
    every = last_snapshot_seq == -1
    last = None
    fed = False
    tick, feed = records.Tick, engine.feed
    # The kinds that may make the last snapshot (a profile imported after run.end makes a new final one); every other
    # record is fed without a look at it.
    loud_types = frozenset((records.RunEnd, records.ProfileImport, tick))
    for record in read_log(run_dir, FED_KINDS, stats, after_seq=through_seq):
        fed = True
        cls = type(record)
        if not every and cls not in loud_types:
            feed(record, False)
            continue
        made = feed(record, every or cls is not tick or record.seq == last_snapshot_seq)
        if made:
            last = made[-1]
    # The records passed by their tag moved the engine's clock of sequence numbers all the same, but for the alerts
    # written after run.end: computed from the final snapshot, they change no number of it (nor its through_seq).
    seq = stats.get("last_seq")
    if (
        seq is not None
        and not engine.state.finished
        and (engine.state.through_seq is None or engine.state.through_seq < seq)
    ):
        engine.state.through_seq = seq
        fed = True
    if last is None and (fed or through_seq):
        last = engine.snapshot()
    return engine, last


def final_snapshot(
    run_dir: Path, stats: dict | None = None, use_checkpoint: bool = True
) -> records.Snapshot | None:
    """The last snapshot of a run: its engine's checkpoint plus the log after it (or the whole log), replayed by an
    engine that keeps no history (a quarter fewer instructions per record: points and quiet ticks left out)."""
    return replay_engine(run_dir, stats, use_checkpoint, keep_history=False)[1]


def skipped_line(stats: dict) -> str | None:
    """What a reader of the log says of the lines it skipped (``read_log``'s ``stats``), as every command says it:
    ``skipped 2 unreadable lines of the log (1 not JSON, 1 truncated last line)``; None when it skipped none."""
    if not stats.get("skipped"):
        return None
    reasons = ", ".join(f"{n} {r}" for r, n in sorted((stats.get("reasons") or {}).items()))
    n = stats["skipped"]
    return f"skipped {n} unreadable line{'s' if n != 1 else ''} of the log" + (
        f" ({reasons})" if reasons else ""
    )
