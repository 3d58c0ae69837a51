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


def log_records(run_dir: Path, blocks: bool = False, live: bool = False) -> list[dict]:
    """Every line of a run's log as plain JSON (the raw form a user would grep), each block's line as the records it
    stands for (``expand_blocks``), or as it is with ``blocks``. With ``live``, a log the recorder still writes: its
    last line counts once its newline is written (a test that polls may read it half written)."""
    out = []
    for seg in sorted(run_dir.glob("events-*.jsonl")):
        text = seg.read_text()
        if live:
            text = text[: text.rfind("\n") + 1]
        for line in text.splitlines():
            out.append(json.loads(line))
    return out if blocks else expand_blocks(out)


def sent_gpu_samples(run_dir: Path) -> list[dict]:
    """A run's GPU samples as their sampler sent them to the hub: each logged line's mapping, its ``seq`` (the hub's
    number) left out."""
    found = []
    for record in log_records(run_dir, blocks=True):
        if record["kind"] == "sample.gpu":
            del record["seq"]
            found.append(record)
    return found


def expand_blocks(logged: list[dict]) -> list[dict]:
    """Log lines as plain JSON, with each block (``records.Block``) replaced by the records it stands for, each as its
    own line of the log would be (``trainmeter_core.model.records.block.expand``)."""
    from trainmeter_core.model import records
    from trainmeter_core.model.records import block

    out: list[dict] = []
    for data in logged:
        if data.get("kind") != "block":
            out.append(data)
            continue
        for row in block.expand(records.from_log_line(json.dumps(data))):
            out.append(json.loads(records.to_log_line(records.to_builtins(row))))
    return out


def only_run(runs: Path) -> Path:
    dirs = [p for p in runs.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]
