"""The agents' goodbyes at a run's end: which producer may still say goodbye (its process lives, or it is on another
host), and a notice for each that never will, because what it queued after its last flush was lost with its process.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainmeter_core.bus import step_page
from trainmeter_core.bus.client import HOSTNAME
from trainmeter_core.model import records
from trainmeter_core.run.child import FLUSH_RECORDS, FLUSH_RECORDS_ENV, agent_window_s
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


def lost_windows(
    open_producers: list[str],
    say: Say,
    step_pages: Path | None = None,
    received_steps: dict[str, int] | None = None,
    agent_env: dict[str, str] | None = None,
) -> list[records.Record]:
    """A notice for each agent that said hello and never goodbye: its process was killed (or left without running
    atexit), so its last flush window never left. The agent sends a window at least every TM_AGENT_FLUSH_S of the
    command's environment (``agent_env``, this process's by default). Where the process left its step page
    (``step_pages``), the notice says how many steps it lost: those it counted less those the hub received from it
    (``received_steps``), and in how many flush windows."""
    env = dict(os.environ) if agent_env is None else agent_env
    window_s = agent_window_s(env)
    window_records = env.get(FLUSH_RECORDS_ENV, FLUSH_RECORDS)
    notices = []
    for key in open_producers:
        source, _, where = key.partition("@")
        line = (
            f"{source} of pid {where.rpartition(':')[2]} ended without saying goodbye (killed, or gone without "
            f"running atexit): {steps_lost(key, step_pages, received_steps or {})}what it queued after its last flush "
            f"was lost, at most {float(window_s) * 1000:.0f} ms or {window_records} of its records"
        )
        say(line)
        notices.append(
            records.Notice(level="warning", topic="agent.lost_window", message=line, source="launcher")
        )
    return notices


def steps_lost(key: str, step_pages: Path | None, received_steps: dict[str, int]) -> str:
    """What a killed producer's step page says it lost, as the start of its notice ("" without a page): the steps it
    counted and the hub never received, in how many flush windows. The window still open when it died is one; steps
    of a window handed to the bus that never arrived (the process died before zmq's thread sent it) are said apart,
    since the page cannot tell how many windows they were in."""
    pid = producer_pid(key)
    page = None if step_pages is None or pid is None else step_page.read_page(step_pages, pid)
    if page is None:
        return ""
    counted, handed = page["counted"], page["handed"]
    received = received_steps.get(key, 0)
    lost = max(0, counted - received)
    open_window = max(0, counted - handed)
    in_flight = max(0, lost - open_window)
    windows = "1 flush window" if open_window else "0 flush windows"
    said = f"lost {lost} of the {counted} steps it counted ({windows}"
    if in_flight:
        said += f", and {in_flight} steps handed to the bus that never arrived"
    return said + "); "
