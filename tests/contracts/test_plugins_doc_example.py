"""The sink plugin of docs/plugins.md, built exactly as the page lays it out, installs and receives a real alert."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from tm_runs import REPO, run_tm

DOC = REPO / "docs" / "plugins.md"
# A loop whose loss becomes NaN: the built-in loss_nan rule fires a critical alert.
LOOP = """
import math, time
from trainmeter_agent import emit
for i in range(40):
    time.sleep(0.1)  # a few ticks of the hub's clock, so the rule sees the NaN while the run lives
    emit(step=i, tokens=10, train_loss=math.nan if i >= 5 else 1.0)
"""


def layout_and_files() -> tuple[list[str], dict[str, str]]:
    """The file tree of section 1 and each file's text, from the page's code blocks and the names above them."""
    text = DOC.read_text()
    section = text.split("## 1. The distribution", 1)[1]
    tree = re.search(r"```\n(tm-journal/\n.*?)```", section, re.S).group(1).splitlines()
    files = [line.strip() for line in tree[1:] if line.strip()]
    found = {"pyproject.toml": re.search(r"```toml\n(.*?)```", section, re.S).group(1)}
    for name, code in re.findall(r"`(tm_journal/[a-z_]+\.py)`:\n\n```python\n(.*?)```", text, re.S):
        found[name] = code
    return files, found


def test_the_page_gives_every_file_of_its_layout():
    files, found = layout_and_files()
    # The layout names the files the example needs; the page shows each one it needs (an empty __init__.py and the
    # tests file excepted).
    assert set(files) == {
        "pyproject.toml",
        "tm_journal/__init__.py",
        "tm_journal/plugin.py",
        "tm_journal/sink.py",
        "tests/test_journal.py",
    }
    assert set(found) == {"pyproject.toml", "tm_journal/plugin.py", "tm_journal/sink.py"}


@pytest.mark.xdist_group("heavy")
def test_the_sink_of_the_page_installs_and_writes_the_alert_of_a_real_run(tm_env, tmp_path):
    files, found = layout_and_files()
    source = tmp_path / "tm-journal"
    for name in files:
        path = source / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(found.get(name, ""))
    target = tmp_path / "site"
    # Installed as pip installs any distribution, into a folder of its own (never into the tests' environment).
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    work = tmp_path / "work"
    work.mkdir()
    (work / "loop.py").write_text(LOOP)
    env = dict(tm_env, PYTHONPATH=str(target), TM_DISABLE_COMPONENTS="web")
    listed = run_tm(["plugins"], env)
    assert "journal" in listed.stdout and "tm-journal" in listed.stdout, listed.stdout
    result = run_tm(["loop.py"], env, cwd=work)
    assert result.returncode == 0, result.stderr
    # The page says the component runs in the directory tm was started from: journal.md is there.
    journal = (work / "journal.md").read_text()
    assert "**loss_nan** fired:" in journal, journal
