"""What importing the plugin API costs a training process, where tracker taps load: ``from trainmeter_core import
hookimpl`` (the marker alone) and ``import trainmeter_core.api`` (the Protocols, everything else lazy), each in a fresh
interpreter, with and without ``typing`` already imported (a training process has it, through torch). Prints
figures and the heavy modules each import brought in (there must be none); asserts nothing.

Run: ``.venv/bin/python bench/bench_api_import.py``. Target (issue 10): no pluggy, zmq, aiohttp or msgspec at
import, and well under the agent's own start-up budget of 40 ms.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

RUNS = 30
HEAVY = ("pluggy", "zmq", "aiohttp", "msgspec", "torch", "trainmeter_core.model.records")

_PROBE = """
import sys, time{prelude}
before = set(sys.modules)
started = time.perf_counter()
{statement}
elapsed_s = time.perf_counter() - started
new = sorted(set(sys.modules) - before)
print(json.dumps({{"ms": elapsed_s * 1e3, "heavy": [m for m in {heavy!r} if m in sys.modules], "modules": len(new)}}))
"""


def measure(statement: str, prelude: str) -> tuple[list[float], set[str], int]:
    figures, heavy, modules = [], set(), 0
    code = _PROBE.format(prelude=prelude, statement=statement, heavy=HEAVY)
    for _ in range(RUNS):
        done = subprocess.run(
            [sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, check=True
        )
        result = json.loads(done.stdout)
        figures.append(result["ms"])
        heavy.update(result["heavy"])
        modules = result["modules"]
    return figures, heavy, modules


def main() -> None:
    print(f"{RUNS} fresh interpreters each, Python {sys.version.split()[0]}")
    for statement in ("from trainmeter_core import hookimpl", "import trainmeter_core.api"):
        for label, prelude in (("bare interpreter", ""), ("typing imported first", "\nimport typing")):
            figures, heavy, modules = measure(statement, prelude)
            print(
                f"{statement:<38} {label:<22} median {statistics.median(figures):6.2f} ms "
                f"(max {max(figures):6.2f}), {modules} new modules, heavy: {sorted(heavy) or 'none'}"
            )


if __name__ == "__main__":
    main()
