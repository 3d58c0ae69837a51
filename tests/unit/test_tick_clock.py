"""The hub's ticks: half a period after a multiple of it on the monotonic clock, between two closes of the agents'
windows of as long; a period longer than a second (a test's hour, for no tick) from the hub's start."""

from __future__ import annotations

import pytest

from trainmeter_core.bus.tick_clock import ALIGNED_MAX_S, first_tick, next_tick


@pytest.mark.parametrize(
    ("now", "period", "tick"),
    [
        (100.0, 1.0, 100.5),
        (100.2, 1.0, 100.5),
        (100.5, 1.0, 101.5),  # never now: the next one
        (100.7, 1.0, 101.5),
        (99.999, 1.0, 100.5),
        (100.05, 0.2, 100.1),
        (100.15, 0.2, 100.3),
        (100.0, 3600.0, 3700.0),
        (100.3, 1.5, 101.8),
    ],
)
def test_the_next_tick(now, period, tick):
    assert ALIGNED_MAX_S == 1.0
    assert next_tick(now, period) == pytest.approx(tick, abs=1e-9)


@pytest.mark.parametrize(
    ("start", "period", "tick"),
    [
        (100.0, 1.0, 101.5),
        (100.49, 1.0, 101.5),
        (
            100.5,
            1.0,
            102.5,
        ),  # a second after the start is 101.5, a tick: the next one, never before run.start
        (100.9, 1.0, 102.5),
        (100.0, 3600.0, 3700.0),
    ],
)
def test_the_first_tick_is_at_least_a_period_after_the_hubs_start(start, period, tick):
    # The launcher writes run.start once it has described the run: a tick before it would be the log's first record.
    assert first_tick(start, period) == pytest.approx(tick, abs=1e-9)
