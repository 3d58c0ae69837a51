"""The badput buckets as tm compare reads them (model/badput.py): one row per bucket some run spent time in, in
seconds, with the difference against the first run; productive step time always."""

from __future__ import annotations

import pytest
from test_comparison import side

from trainmeter_core.model import badput
from trainmeter_core.model.comparison import compare

SPLIT = dict.fromkeys(badput.TITLES, 0.0)


def test_compare_carries_each_bucket_some_run_spent_time_in_and_the_productive_time():
    a = side(phases_s={**SPLIT, "compute": 60.0, "startup": 20.0, "hang": 5.0})
    b = side(phases_s={**SPLIT, "compute": 70.0, "startup": 15.0, "down": 12.0})
    rows = {row["key"]: row for row in compare([a, b])["headline"]}
    assert rows["time.compute"]["values"] == [60.0, 70.0] and rows["time.compute"]["unit"] == "s"
    # 15 − 20 = −5 s of start-up; 12 − 0 = 12 s down; the hang only the first run had: 0 − 5
    assert rows["time.startup"]["difference"] == [None, pytest.approx(-5.0)]
    assert rows["time.down"]["values"] == [0.0, 12.0] and rows["time.hang"]["difference"] == [None, -5.0]
    assert rows["time.hang"]["title"] == "time: hangs"
    # no run spent time compiling, loading a checkpoint or in other: no row of zeros
    assert not {"time.compile", "time.checkpoint_load", "time.other"} & set(rows)


def test_a_snapshot_without_a_time_split_says_why():
    rows = {
        row["key"]: row for row in compare([side(), side(phases_s={**SPLIT, "compute": 1.0})])["headline"]
    }
    assert rows["time.compute"]["values"] == [None, 1.0]
    assert rows["time.compute"]["absent"][0].startswith("no time split in this run's snapshot")
