"""Under ``-n 2 --dist loadgroup``, the tests of one ``xdist_group`` all run on one worker (tests/xdist_groups.py
mends pytest-xdist 3.8 for pytest 9.2), so two heavy tests never share the cores; the others spread."""

from __future__ import annotations

import re

from tm_runs import REPO

PLANTED = """
import time
import pytest

@pytest.mark.parametrize("n", range(4))
@pytest.mark.xdist_group("heavy")
def test_heavy(n):
    time.sleep(0.2)

@pytest.mark.parametrize("n", range(4))
def test_light(n):
    time.sleep(0.2)
"""


def test_a_group_runs_on_one_worker_and_the_rest_spread(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))
    pytester.makepyfile(test_first=PLANTED, test_second=PLANTED)
    result = pytester.runpytest_subprocess("-p", "xdist_groups", "-n", "2", "--dist", "loadgroup", "-v")
    result.assert_outcomes(passed=16)
    ran = re.findall(r"\[(gw\d)\] .*PASSED (\S+)", result.stdout.str())
    heavy = {worker for worker, test in ran if "test_heavy" in test}
    assert len(heavy) == 1, ran
    assert all(test.endswith("@heavy") for _, test in ran if "test_heavy" in test)
    assert {worker for worker, _ in ran} == {"gw0", "gw1"}, ran
