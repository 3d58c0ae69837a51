"""The launcher's word on an agent that never said goodbye (trainmeter_core/run/goodbyes.py): with its step page, how
many of its counted steps were lost and in how many flush windows; without one, the window alone."""

from __future__ import annotations

import os

from trainmeter_core.bus import step_page
from trainmeter_core.bus.client import HOSTNAME
from trainmeter_core.run import child
from trainmeter_core.run.child import give_job_windows
from trainmeter_core.run.goodbyes import lost_windows, steps_lost

KEY = f"agent@{HOSTNAME}:{os.getpid()}"


def _page(folder, monkeypatch, counted: int, handed: int) -> None:
    monkeypatch.setenv(step_page.PAGES_ENV, str(folder))
    page = step_page.StepPage()
    page.open(window_records=64)
    page.slots[step_page.COUNTED] = counted
    page.slots[step_page.HANDED] = handed


def test_the_steps_of_the_open_window_are_said_lost_in_one_window(tmp_path, monkeypatch):
    _page(tmp_path, monkeypatch, counted=1000, handed=988)
    # 988 handed and received, 12 in the open window: 1000 - 988 = 12 lost.
    assert steps_lost(KEY, tmp_path, {KEY: 988}) == "lost 12 of the 1000 steps it counted (1 flush window); "


def test_steps_handed_to_the_bus_that_never_arrived_are_said_apart(tmp_path, monkeypatch):
    _page(tmp_path, monkeypatch, counted=1000, handed=988)
    # 980 received: 20 lost, 12 of them in the open window, 8 handed and never delivered.
    said = steps_lost(KEY, tmp_path, {KEY: 980})
    assert said == (
        "lost 20 of the 1000 steps it counted (1 flush window, and 8 steps handed to the bus that never arrived); "
    )


def test_nothing_open_nothing_lost(tmp_path, monkeypatch):
    _page(tmp_path, monkeypatch, counted=500, handed=500)
    assert steps_lost(KEY, tmp_path, {KEY: 500}) == "lost 0 of the 500 steps it counted (0 flush windows); "
    # The notice says no window was lost where none was open (it said "its last flush window was lost" after "0 flush
    # windows"): what it may have queued since, records other than steps, is all it can have lost
    (notice,) = lost_windows([KEY], lambda line: None, tmp_path, {KEY: 500})
    assert "(0 flush windows); what it queued after its last flush was lost" in notice.message
    assert "window was lost" not in notice.message


def test_without_a_page_the_notice_says_the_window_alone(tmp_path):
    said: list[str] = []
    (notice,) = lost_windows([KEY], said.append, tmp_path, {})
    assert notice.topic == "agent.lost_window" and said == [notice.message]
    assert "lost " not in notice.message.split(":")[1]
    assert "what it queued after its last flush was lost, at most" in notice.message
    assert (
        steps_lost(f"agent@another-host:{os.getpid()}", tmp_path, {}) == ""
    )  # another host's page is not here


def test_a_job_nodes_agents_get_windows_of_a_second_unless_the_user_set_one_and_the_notice_says_which(
    tmp_path,
):
    env = {"PATH": "/bin"}
    give_job_windows(env)
    assert env["TM_AGENT_FLUSH_S"] == "1"
    mine = {"TM_AGENT_FLUSH_S": "0.2"}
    give_job_windows(mine)
    assert mine == {"TM_AGENT_FLUSH_S": "0.2"}  # the user's window, kept
    said: list[str] = []
    (notice,) = lost_windows([KEY], said.append, tmp_path, {}, env)
    assert "at most 1000 ms or 16000 of its records" in notice.message
    (users,) = lost_windows([KEY], said.append, tmp_path, {}, mine)
    assert "at most 200 ms or 16000 of its records" in users.message
    (single,) = lost_windows([KEY], said.append, tmp_path, {}, {})
    assert "at most 1000 ms or 16000 of its records" in single.message  # without one: the agent's defaults


def test_the_launchers_default_window_is_the_agents():
    # The core never imports the agent (import-linter): the default is written on both sides, and held equal here.
    from trainmeter_agent import _outbox

    assert float(child.FLUSH_S) == _outbox.WINDOW_S
    assert int(child.FLUSH_RECORDS) == _outbox.MAX_RECORDS
    # The hub's ticks fall between two closes of the windows it aligns as the agent does
    from trainmeter_core.bus import tick_clock

    assert tick_clock.ALIGNED_MAX_S == _outbox.ALIGNED_MAX_S
