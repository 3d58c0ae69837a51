"""Running the ``tm`` command from a test and reading the run it leaves: where the repository and ``tm`` are,
``run_tm``, the one run of a runs folder and its log as plain JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TM = str(BIN / "tm") if (BIN / "tm").exists() else shutil.which("tm")


def run_tm(args: list[str], env: dict[str, str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([TM, *args], env=env, capture_output=True, text=True, timeout=timeout, **kw)


def log_records(run_dir: Path) -> list[dict]:
    """Every line of a run's log as plain JSON (the raw form a user would grep)."""
    out = []
    for seg in sorted(run_dir.glob("events-*.jsonl")):
        for line in seg.read_text().splitlines():
            out.append(json.loads(line))
    return out


def only_run(runs: Path) -> Path:
    dirs = [p for p in runs.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]
