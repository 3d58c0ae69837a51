"""What importing the records costs a training process (the agent loads them when it says hello), this tree against
an earlier commit, in one run: fresh interpreters alternate between the two trees, and the figure is the ratio of
their medians, in CPU time (steady on a shared host) and by the clock. Prints figures; asserts nothing.

Run: ``.venv/bin/python bench/bench_records_import.py [--against REV] [--runs 40] [--from-source]``. The other tree
is ``REV``'s ``trainmeter_core`` (default ``HEAD``: the committed tree against the working one), written to a
temporary folder. Modules load from bytecode, as an installed tm's do; ``--from-source`` compiles them every time.
Target (issue 40): splitting the records into a package costs under 5%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# What the agent imports of the core when it activates (trainmeter_agent/_agent.py), and the records on their own.
AGENT = "import trainmeter_core.model.records, trainmeter_core.bus.client, trainmeter_core.model.redaction"
RECORDS = "import trainmeter_core.model.records"
MSGSPEC = "import msgspec, msgspec.msgpack, msgspec.json"
CASES = {  # label -> (what runs first, what is timed)
    "records": ("", RECORDS),
    "records, msgspec already in": (MSGSPEC, RECORDS),
    "the agent's activation": ("", AGENT),
}

_PROBE = """
import json, sys, time
{prelude}
started, started_cpu = time.perf_counter(), time.process_time()
{statement}
elapsed_s, cpu_s = time.perf_counter() - started, time.process_time() - started_cpu
assert sys.modules["trainmeter_core"].__file__.startswith({root!r}), sys.modules["trainmeter_core"].__file__
print(json.dumps([elapsed_s * 1e3, cpu_s * 1e3]))
"""


def committed_tree(rev: str, into: Path) -> None:
    """``rev``'s trainmeter_core, as files under ``into``."""
    archive = subprocess.run(
        ["git", "archive", rev, "trainmeter_core"], cwd=REPO, capture_output=True, check=True
    ).stdout
    archive_path = into / "tree.tar"
    archive_path.write_bytes(archive)
    with tarfile.open(archive_path) as tar:
        tar.extractall(into, filter="data")


def one_import_ms(root: Path, prelude: str, statement: str, bytecode: Path | None) -> tuple[float, float]:
    """The wall and CPU milliseconds of ``statement`` in a fresh interpreter that imports from ``root``."""
    code = _PROBE.format(prelude=prelude, statement=statement, root=str(root))
    env = dict(os.environ, PYTHONPATH=str(root))
    if (
        bytecode
    ):  # as an installed tm is imported: from bytecode (the first run writes it, outside both trees)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(bytecode)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, check=True
    )
    wall_ms, cpu_ms = json.loads(done.stdout)
    return wall_ms, cpu_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", default="HEAD", help="the commit to compare with (default HEAD)")
    parser.add_argument("--runs", type=int, default=40, help="fresh interpreters per tree and case")
    parser.add_argument("--from-source", action="store_true", help="compile every module, write no bytecode")
    args = parser.parse_args()
    revision = subprocess.run(
        ["git", "rev-parse", "--short", args.against], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    print(
        f"{args.runs} fresh interpreters per tree and case, alternated; this tree against {args.against} "
        f"({revision}); {'from source' if args.from_source else 'from bytecode'}; Python {sys.version.split()[0]}; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        before.mkdir()
        committed_tree(args.against, before)
        bytecode = None if args.from_source else Path(tmp) / "bytecode"
        for label, (prelude, statement) in CASES.items():
            for root in (before, REPO):  # the first run of each writes its bytecode: not a figure
                one_import_ms(root, prelude, statement, bytecode)
            figures: dict[Path, list[tuple[float, float]]] = {before: [], REPO: []}
            for _ in range(args.runs):
                for root in (before, REPO):
                    figures[root].append(one_import_ms(root, prelude, statement, bytecode))
            (then_wall, then_cpu), (now_wall, now_cpu) = (
                [statistics.median(run[i] for run in figures[root]) for i in (0, 1)]
                for root in (before, REPO)
            )
            print(
                f"{label:<28} CPU {then_cpu:6.2f} -> {now_cpu:6.2f} ms, ratio {now_cpu / then_cpu:5.3f} | "
                f"clock {then_wall:6.2f} -> {now_wall:6.2f} ms, ratio {now_wall / then_wall:5.3f} (medians)"
            )


if __name__ == "__main__":
    main()
