"""The test layers: every test file sits in one layer folder of tests/, every collected test carries its folder's
mark and no other layer's, and the heavy ones (every browser test among them) are in the group that keeps two of
them off the same cores."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from layers import LAYERS
from tm_runs import REPO

TESTS = REPO / "tests"
COLLECT = """
import json, sys, pytest

class Marks:
    def pytest_collection_finish(self, session):
        self.items = {
            item.nodeid: [[mark.name, *map(str, mark.args)] for mark in item.iter_markers()] for item in session.items
        }

marks = Marks()
status = pytest.main(["--collect-only", "-q", "-p", "no:xdist", "tests"], plugins=[marks])
with open(sys.argv[1], "w") as out:
    json.dump({"status": int(status), "items": marks.items}, out)
"""


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> dict[str, list[list[str]]]:
    """Every test of tests/ with its marks, as a separate pytest collects them from the repository's root."""
    out = tmp_path_factory.mktemp("layers") / "marks.json"
    subprocess.run(
        [sys.executable, "-c", COLLECT, str(out)], cwd=REPO, capture_output=True, timeout=300, check=True
    )
    found = json.loads(out.read_text())
    assert found["status"] == 0
    return found["items"]


def test_every_test_file_sits_in_a_layer_folder():
    outside = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("test_*.py")
        if path.relative_to(TESTS).parts[0] not in LAYERS
    ]
    assert outside == []
    for layer in LAYERS:
        assert (TESTS / layer / "conftest.py").is_file(), layer


def test_every_test_carries_its_folders_layer_and_no_other(collected):
    assert len(collected) > 1000
    wrong = {}
    for nodeid, marks in collected.items():
        folder = nodeid.split("/")[1]
        layers = sorted({name for name, *_ in marks if name in LAYERS})
        if layers != [folder]:
            wrong[nodeid] = layers
    assert wrong == {}


def test_each_layer_has_tests(collected):
    folders = {nodeid.split("/")[1] for nodeid in collected}
    assert folders == set(LAYERS)


def test_heavy_and_its_group_go_together_and_every_browser_test_is_heavy(collected):
    for nodeid, marks in collected.items():
        heavy = ["heavy"] in marks
        grouped = ["xdist_group", "heavy"] in marks
        assert heavy == grouped, nodeid
        if nodeid.startswith("tests/browser/"):
            assert heavy, nodeid
