"""What ``tm compare`` shows of the runs' communication (issue 43): the exposed collective wait, the wait the straggler
causes and the bus bandwidth per operation kind as headline rows, and which rank each run's straggler was. Pure: the
runs' final snapshots in, rows and a note out; rows only where a run had a collective probe."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainmeter_core.model import formulas, records

_BUS_BANDWIDTH = "bus_bandwidth_bps."
#: A headline row: its key, title, unit and how to read a run's value (or the reason it has none).
Row = tuple[str, str, str | None, Callable[[records.Snapshot, Any], tuple[float | None, str | None]]]


def _metric(snapshot: records.Snapshot, key: str) -> tuple[float | None, str | None]:
    metric = snapshot.metrics.get(key)
    if metric is None:
        return None, "not computed by this run's engine"
    return metric.value, None if metric.value is not None else metric.absent


def rows() -> tuple[Row, ...]:
    """The exposed collective wait (the median rank's) and the wait the straggler causes, per step."""
    return (
        ("collective_wait_s", "exposed collective wait per step (median rank)", "s",
         lambda s, c: _metric(s, "collective_wait_s")),
        ("straggler_wait_s", "others' wait per step for the slowest rank", "s",
         lambda s, c: _metric(s, "straggler_wait_s")),
    )  # fmt: skip


def bandwidth_rows(snapshots: list[records.Snapshot]) -> tuple[Row, ...]:
    """A row per operation kind and group size any run reported: the median rank's bus bandwidth (nccl-tests' busbw)."""
    kinds = sorted(
        {
            key[len(_BUS_BANDWIDTH) :].rsplit(".rank", 1)[0]
            for snapshot in snapshots
            for key, value in snapshot.metrics.items()
            if key.startswith(_BUS_BANDWIDTH) and value.value is not None
        }
    )
    return tuple(
        (
            f"{_BUS_BANDWIDTH}{kind}",
            f"bus bandwidth {kind.replace('.', ' ×')} (median rank)",
            "B/s",
            lambda s, c, kind=kind: _median_bandwidth(s, kind),
        )
        for kind in kinds
    )


def _median_bandwidth(snapshot: records.Snapshot, kind: str) -> tuple[float | None, str | None]:
    """The median over a run's ranks of their bus bandwidth for one operation kind and group size."""
    prefix = f"{_BUS_BANDWIDTH}{kind}.rank"
    values = [v.value for k, v in snapshot.metrics.items() if k.startswith(prefix) and v.value is not None]
    if not values:
        return None, f"no rank of this run reported a {kind.replace('.', ' of ')}"
    return formulas.median(values), None


def straggler_note(labels: list[str], snapshots: list[records.Snapshot]) -> str | None:
    """Which rank each run's straggler was and its cause, where any run named one; None where none did."""
    named = []
    any_named = False
    for label, snapshot in zip(labels, snapshots, strict=True):
        rank, wait = snapshot.metrics.get("straggler_rank"), snapshot.metrics.get("straggler_wait_s")
        if rank is not None and rank.value is not None:
            any_named = True
            cause = wait.label if wait is not None and wait.label else "unknown"
            named.append(f"{label} rank {rank.value:.0f} on {rank.label} ({cause})")
        else:
            why = rank.absent if rank is not None else "not computed by this run's engine"
            named.append(f"{label} none: {why}")
    return "the straggler: " + "; ".join(named) if any_named else None
