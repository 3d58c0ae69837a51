"""The badput buckets of a run's time split as the comparison and the report read them: each bucket's title, and its
seconds from a snapshot. Pure: no I/O. The engine computes the buckets (model/engine/badput.py); this only reads them."""

from __future__ import annotations

from typing import Any

from trainmeter_core.model import records

#: The productive step time, then each bucket (formulas.BADPUT_BUCKETS), in the words a person reads them.
TITLES = {
    "compute": "productive step time",
    "startup": "start-up and imports",
    "compile": "compile",
    "data_wait": "data wait",
    "checkpoint": "checkpoint save",
    "checkpoint_load": "checkpoint load",
    "eval": "eval",
    "profiler": "profiler",
    "hang": "hangs",
    "superseded": "steps done again",
    "down": "down between attempts",
    "after_last_step": "after the last step",
    "other": "other (unattributed)",
}


def seconds(snapshot: records.Snapshot, name: str) -> tuple[float | None, str | None]:
    """A bucket's seconds in the snapshot's split, or None with the reason."""
    value = (snapshot.phases_s or {}).get(name)
    if value is None:
        return (
            None,
            "no time split in this run's snapshot (no tick yet, or an engine from before the buckets)",
        )
    return value, None


def _row(name: str) -> tuple[str, str, str, Any]:
    return (f"time.{name}", f"time: {TITLES[name]}", "s", lambda s, c: seconds(s, name))


#: ``tm compare``'s rows (key, title, unit, read), one per bucket, after its headline numbers.
ROWS = tuple(_row(name) for name in TITLES)


def no_time_anywhere(key: str, values: list[float | None]) -> bool:
    """A bucket's row where no run spent time (or none has a split): left out, no row of zeros."""
    return key.startswith("time.") and key != "time.compute" and all(not v or abs(v) < 1e-9 for v in values)
