"""Peaks measured on a machine by ``tm peak``, kept per machine so a run there can be scored against them.

One JSON file per user (``TM_PEAKS_FILE``, else ``$XDG_DATA_HOME/trainmeter/peaks.json``). A run copies what it uses into
its own log as a ``fact``, so a replay on another machine never needs this file.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from trainmeter_core.model.passport import rate_text


def path() -> Path:
    if os.environ.get("TM_PEAKS_FILE"):
        return Path(os.environ["TM_PEAKS_FILE"])
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "trainmeter" / "peaks.json"


def load() -> list[dict]:
    try:
        entries = json.loads(path().read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(entries, list):
        return []
    kept = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        if (
            "flop_per_s" not in entry and "flops" in entry
        ):  # written by tm 0.1.0, before FLOP/s had its own name
            entry = {("flop_per_s" if k == "flops" else k): v for k, v in entry.items()}
        value = entry.get("flop_per_s")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            kept.append(entry)
    return kept


def load_for_host(host: str) -> list[dict]:
    return [e for e in load() if e.get("host") == host]


#: What a peak belongs to: one stored figure per machine, device, dtype and thread count.
KEY = ("host", "device", "dtype", "threads")


def stored_for(entry: dict) -> dict | None:
    """The peak stored for the same (host, device, dtype, threads) as ``entry``, or None."""
    for stored in load():
        if tuple(stored.get(k) for k in KEY) == tuple(entry.get(k) for k in KEY):
            return stored
    return None


def disagreement(stored: dict, entry: dict) -> str | None:
    """Why a new measurement disagrees with the stored one, or None where it agrees: they differ by more than the new
    measurement's own spread (how far its best stands above its typical repetition)."""
    spread = entry.get("spread_flop_per_s")
    new, old = entry["flop_per_s"], stored["flop_per_s"]
    if not isinstance(spread, (int, float)) or isinstance(spread, bool):
        spread = 0.0
    if abs(new - old) <= spread:
        return None
    when = stored.get("measured_wall")
    stamp = (
        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(when))
        if isinstance(when, (int, float))
        else "earlier"
    )
    return (
        f"this measurement ({rate_text(new)}, spread {rate_text(spread, digits=2)}) disagrees with the one stored "
        f"({rate_text(old)}, measured {stamp}) by more than its spread"
    )


def store(entry: dict) -> Path:
    """Add or replace the peak of one (host, device, dtype, threads)."""
    key = KEY
    entries = [e for e in load() if tuple(e.get(k) for k in key) != tuple(entry.get(k) for k in key)]
    entries.append(entry)
    target = path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(entries, indent=1) + "\n")
    os.replace(tmp, target)
    return target
