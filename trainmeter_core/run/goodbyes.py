"""The agents' goodbyes at a run's end: which producer may still say goodbye (its process lives, or it is on another
host), and a notice for each that never will, because its last flush window was lost with its process.
"""

from __future__ import annotations

import os

from trainmeter_core.bus.client import HOSTNAME
from trainmeter_core.model import records
from trainmeter_core.run.stderr_lines import Say


def producer_pid(key: str) -> int | None:
    """The pid of a producer on this host, from the hub's key ``source@host:pid``; None for another host's."""
    where, _, pid = key.rpartition(":")
    if where.partition("@")[2] != HOSTNAME or not pid.isdigit():
        return None
    return int(pid)


def may_still_say_bye(key: str) -> bool:
    pid = producer_pid(key)
    if pid is None:
        return True  # another host's: only its bye can tell
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def lost_windows(open_producers: list[str], say: Say) -> list[records.Record]:
    """A notice for each agent that said hello and never goodbye: its process was killed (or left without running
    atexit), so its last flush window never left. The agent sends a window at least every TM_AGENT_FLUSH_S."""
    window_s = os.environ.get("TM_AGENT_FLUSH_S", "0.05")
    window_records = os.environ.get("TM_AGENT_FLUSH_RECORDS", "1000")
    notices = []
    for key in open_producers:
        source, _, where = key.partition("@")
        line = (
            f"{source} of pid {where.rpartition(':')[2]} ended without saying goodbye (killed, or gone without "
            f"running atexit): its last flush window was lost, at most {float(window_s) * 1000:.0f} ms or "
            f"{window_records} of its records"
        )
        say(line)
        notices.append(
            records.Notice(level="warning", topic="agent.lost_window", message=line, source="launcher")
        )
    return notices
