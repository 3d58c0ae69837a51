"""When the hub ticks: once a period, half a period after a multiple of it on the monotonic clock, where the agents'
windows of as long close (trainmeter_agent/_outbox.py, ALIGNED_MAX_S), so that each snapshot sees every rank of the
machine up to the same moment (docs/performance.md, "Windows of a second")."""

from __future__ import annotations

#: Ticks of a period of at most this long are aligned; a longer period (a test's hour, for no tick) starts at the
#: hub's start. The agent's ALIGNED_MAX_S, written on both sides: the core never imports the agent, and
#: tests/unit/test_goodbyes.py holds them equal.
ALIGNED_MAX_S = 1.0


def first_tick(start: float, period: float) -> float:
    """The hub's first tick, for a hub started at ``start``: the first tick at least a period after it, so that the
    launcher's ``run.start`` (written once it has described the run) comes before it, as before ticks were aligned."""
    return start + period if period > ALIGNED_MAX_S else next_tick(start + period, period)


def next_tick(now: float, period: float) -> float:
    """The first tick after ``now`` on the monotonic clock, for ticks ``period`` seconds apart."""
    if period > ALIGNED_MAX_S:
        return now + period
    tick = now - now % period + period / 2
    return tick if tick > now else tick + period
